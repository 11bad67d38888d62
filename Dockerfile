# syntax=docker/dockerfile:1.7
#
# fleetgate: one binary for the agent and every command, built with the `agent` profile
# (Cargo.toml: optimised for size, as resident code is most of an agent's memory) and linked by
# hack/agent-build.sh (functions the agent runs first, packed relocations: glibc ≥ 2.36).
#   docker build -t fleetgate:dev .
#   docker run --rm fleetgate:dev --help
#
# Why the runtime image is minimal but not static:
# * Signatures are verified with gpgme, a C library that does not verify anything itself: it runs
#   the `gpg` binary (found through `gpgconf`). So the image carries gpg and gpgconf, plus gpg-agent
#   and gpg-connect-agent (gpg starts the agent for some keyring operations, e.g. `gpg --import`
#   exits 2 without it, and `gpgconf --kill all` needs gpg-connect-agent), and the shared libraries
#   all of them and fleetgate load (libgpgme, libassuan, libgpg-error, libgcrypt, libnpth, zlib,
#   libbz2, libsqlite3, libreadline …), collected with ldd from the same Debian release (bookworm)
#   the binary is built on, so every library matches what it was linked against.
# * git2 links a vendored libssh2 (ssh), whose crypto is the system's libcrypto (libssl3); HTTPS,
#   Git's included, is rustls inside the binary, checked against the image's CA certificates.
# * No shell and no package manager at run time: the base is distroless "cc" (glibc, libgcc, libssl,
#   CA certificates), running as its non-root user 65532. gpg needs a writable GNUPGHOME; the
#   Deployment mounts an emptyDir there (deploy/deployment.yaml), as it does for the Git cache and
#   /tmp, so the root file system can stay read-only.
#
# Built and run without a Docker engine: `make image` (hack/image.sh) builds this file with
# Debian's buildah (vfs, chroot isolation) against locally made stand-ins of the two Debian-based
# images (no registry but Debian's is reachable there), with the binary built outside
# (`BINARY_FROM=prebuilt`); tests/image.rs runs `fleetgate --version`, `init` and `validate` in the
# result. Not checked: the `build` stage itself, the real pulled base images, multi-arch builds.

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm
# Where the binary comes from: `build` compiles it in the image; `prebuilt` copies
# FLEETGATE_BINARY from the build context (built on the same Debian release outside, as
# `make image` does where no Rust image can be pulled).
ARG BINARY_FROM=build

FROM docker.io/library/rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgpgme-dev libssl-dev pkg-config \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    bash hack/agent-build.sh \
 && install -D -m 0755 target/agent/fleetgate /out/fleetgate

FROM scratch AS prebuilt
ARG FLEETGATE_BINARY=target/agent/fleetgate
COPY ${FLEETGATE_BINARY} /out/fleetgate

FROM ${BINARY_FROM} AS binary

FROM docker.io/library/debian:${DEBIAN_RELEASE}-slim AS runtime-files
RUN apt-get update \
 && apt-get install -y --no-install-recommends gpg gpg-agent gpgconf libgpgme11 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=binary /out/fleetgate /usr/local/bin/fleetgate
COPY deploy/image/collect-runtime-files.sh /usr/local/bin/collect-runtime-files
RUN collect-runtime-files /rootfs /usr/local/bin/fleetgate \
        /usr/bin/gpg /usr/bin/gpgconf /usr/bin/gpg-agent /usr/bin/gpg-connect-agent \
 && mkdir -p /rootfs/gnupg /rootfs/var/lib/fleetgate \
 && chown 65532:65532 /rootfs/gnupg /rootfs/var/lib/fleetgate \
 && chmod 0700 /rootfs/gnupg

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=runtime-files /rootfs/ /
ENV GNUPGHOME=/gnupg
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/fleetgate"]
CMD ["agent", "--help"]

# syntax=docker/dockerfile:1.7
#
# fleetgate: one binary for the agent and every command.
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
# * git2 links libssl (https) and a vendored libssh2 (ssh); reqwest uses the system TLS (libssl).
# * No shell and no package manager at run time: the base is distroless "cc" (glibc, libgcc, libssl,
#   CA certificates), running as its non-root user 65532. gpg needs a writable GNUPGHOME; the
#   Deployment mounts an emptyDir there (deploy/deployment.yaml), as it does for the Git cache and
#   /tmp, so the root file system can stay read-only.
#
# What was checked without a Docker engine (none is available where this was written): the
# runtime-files stage was reproduced on Debian bookworm with deploy/image/collect-runtime-files.sh
# into a directory holding only what distroless cc-debian12 provides (glibc, libgcc, libstdc++,
# libssl, CA certificates), and in a chroot of it, as uid 65532, `fleetgate validate` verified a
# gpg-signed release tag through gpgme, `gpg --import`/`--verify` and `gpgconf --kill all` worked.
# Not checked: the build stage itself, the pulled base images, and multi-arch builds.

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm

FROM docker.io/library/rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgpgme-dev libssl-dev pkg-config \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin fleetgate \
 && install -D -m 0755 target/release/fleetgate /out/fleetgate

FROM docker.io/library/debian:${DEBIAN_RELEASE}-slim AS runtime-files
RUN apt-get update \
 && apt-get install -y --no-install-recommends gpg gpg-agent gpgconf libgpgme11 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/fleetgate /usr/local/bin/fleetgate
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

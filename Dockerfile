# syntax=docker/dockerfile:1.7
#
# fleetgate: one binary for the agent and every command.
#   docker build -t fleetgate:dev .
#   docker run --rm fleetgate:dev --help
#
# Why the runtime image is minimal but not static:
# * Signatures are verified with gpgme, a C library that does not verify anything itself: it runs
#   the `gpg` binary (found through `gpgconf`). So the image carries gpg and gpgconf, and the shared
#   libraries they and fleetgate load (libgpgme, libassuan, libgpg-error, libgcrypt, libnpth, zlib,
#   libbz2, libsqlite3, libreadline …), collected with ldd from the same Debian release (bookworm)
#   the binary is built on, so every library matches what it was linked against.
# * git2 links libssl (https) and a vendored libssh2 (ssh); reqwest uses the system TLS (libssl).
# * No shell and no package manager at run time: the base is distroless "cc" (glibc, libgcc, libssl,
#   CA certificates), running as its non-root user 65532. gpg needs a writable GNUPGHOME; the
#   Deployment mounts an emptyDir there (deploy/deployment.yaml), as it does for the Git cache and
#   /tmp, so the root file system can stay read-only.

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
 && apt-get install -y --no-install-recommends gpg gpgconf libgpgme11 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/fleetgate /usr/local/bin/fleetgate
COPY deploy/image/collect-runtime-files.sh /usr/local/bin/collect-runtime-files
RUN collect-runtime-files /rootfs /usr/local/bin/fleetgate /usr/bin/gpg /usr/bin/gpgconf \
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

#!/usr/bin/env bash
# `make image`: builds the Dockerfile with Debian's buildah (vfs storage, chroot isolation, as
# root) where no Docker engine exists and no registry but Debian's can be reached, and prints the
# image name.
#
# * The base images of the Dockerfile cannot be pulled here, so stand-ins are made locally, under
#   the exact names the FROM lines use, once: `debian:bookworm-slim` from `mmdebstrap --variant=minbase
#   bookworm` (Debian's packages), and `distroless/cc-debian12:nonroot` as that plus libssl3 and
#   ca-certificates (what distroless cc provides and the runtime stage relies on). The real ones
#   are used wherever they can be pulled.
# * Debian's rustc is too old for the `build` stage, so the binary is built outside (on this
#   Debian release, so its libraries match) and copied in: `--build-arg BINARY_FROM=prebuilt`.
#
# Environment: FLEETGATE_BINARY (default target/agent/fleetgate, the size-optimised `agent` profile
# the image ships, built by hack/agent-build.sh, which relinks only what changed),
# IMAGE (default localhost/fleetgate:dev).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
IMAGE=${IMAGE:-localhost/fleetgate:dev}
BINARY=${FLEETGATE_BINARY:-target/agent/fleetgate}
B=(buildah --storage-driver vfs)

for tool in buildah mmdebstrap; do
  command -v "$tool" >/dev/null || { echo "$tool is missing: run \`bash hack/deps.sh image\` (\`make image\` does)" >&2; exit 2; }
done

has_image() { "${B[@]}" inspect --type image "$1" >/dev/null 2>&1; }
if ! has_image docker.io/library/debian:bookworm-slim; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  mmdebstrap --variant=minbase bookworm "$tmp/rootfs.tar" >&2
  c=$("${B[@]}" from scratch)
  "${B[@]}" add "$c" "$tmp/rootfs.tar" / >/dev/null
  "${B[@]}" commit -q "$c" docker.io/library/debian:bookworm-slim >/dev/null
  "${B[@]}" rm "$c" >/dev/null
fi
if ! has_image gcr.io/distroless/cc-debian12:nonroot; then
  c=$("${B[@]}" from --pull=never docker.io/library/debian:bookworm-slim)
  "${B[@]}" run --isolation chroot "$c" -- sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libssl3 ca-certificates >/dev/null && rm -rf /var/lib/apt/lists/*' >&2
  "${B[@]}" commit -q "$c" gcr.io/distroless/cc-debian12:nonroot >/dev/null
  "${B[@]}" rm "$c" >/dev/null
fi

if [[ "$BINARY" == target/agent/fleetgate ]]; then
  bash hack/agent-build.sh >&2
fi
[[ -x "$BINARY" ]] || { echo "$BINARY is missing" >&2; exit 2; }
"${B[@]}" bud --isolation chroot --pull=never --layers=false \
  --build-arg BINARY_FROM=prebuilt --build-arg FLEETGATE_BINARY="$BINARY" -t "$IMAGE" . >&2
echo "$IMAGE"

#!/usr/bin/env bash
# Builds bench/ssa (flux-ssa-bench: Flux's server-side apply engine, github.com/fluxcd/pkg/ssa,
# driven like kustomize-controller drives it) into the same cache as the Kubernetes and helm
# binaries, and prints the binary's path. Only examples/apply_bench.rs (make bench) uses it;
# it is not part of the product.
#
# Idempotent: the cache entry is keyed by a hash of bench/ssa's sources, so a change rebuilds
# and an unchanged tree prints the path at once.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SRC="$ROOT/bench/ssa"
CACHE=${FLEETGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fleetgate}
KEY=$(cat "$SRC/go.mod" "$SRC/go.sum" "$SRC"/*.go | sha256sum | cut -c1-12)
OUT="$CACHE/flux-ssa-bench-$KEY/bin"

log() { echo "flux-ssa-bench: $*" >&2; }

if [[ -x "$OUT/flux-ssa-bench" ]]; then
  echo "$OUT/flux-ssa-bench"
  exit 0
fi

command -v go >/dev/null || { log "Go is required (https://go.dev/dl); none on PATH"; exit 1; }
mkdir -p "$OUT"
export CGO_ENABLED=0 GOTOOLCHAIN=${GOTOOLCHAIN:-local}
log "building $(grep 'fluxcd/pkg/ssa ' "$SRC/go.mod" | xargs) (a cold build takes a few minutes)"
(cd "$SRC" && go build -trimpath -ldflags "-s -w" -o "$OUT/flux-ssa-bench.tmp" .) >&2
mv "$OUT/flux-ssa-bench.tmp" "$OUT/flux-ssa-bench"
echo "$OUT/flux-ssa-bench"

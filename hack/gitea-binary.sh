#!/usr/bin/env bash
# Builds the `gitea` binary that fleetgate's forge tests (tests/cli/forge_gitea.rs) and the demo
# use as a real forge, from its Go module into the same cache as the Kubernetes binaries,
# and prints the binary's path. Only the API is used, so the web UI's assets are not built;
# the source's `options/` directory (locales, templates Gitea needs at start) is copied
# next to the binary, where testenv's Gitea harness looks for it.
#
# Gitea's go.mod has `replace` directives, so `go install …@version` refuses it; it is built
# as the main module from a writable copy of its module directory instead. v1.26.0 because
# later go.mod files declare the path `gitea.dev`, not the name the proxy serves it under.
#
# Idempotent: with the binary present it prints the path at once.
# FLEETGATE_GITEA short-circuits everything (its `options/` must sit next to it).
set -euo pipefail

GITEA_VERSION=${GITEA_VERSION:-v1.26.0}
CACHE=${FLEETGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fleetgate}
OUT="$CACHE/gitea-${GITEA_VERSION}"

log() { echo "gitea-binary: $*" >&2; }

if [[ -n "${FLEETGATE_GITEA:-}" ]]; then
  [[ -x "$FLEETGATE_GITEA" ]] || { log "FLEETGATE_GITEA=$FLEETGATE_GITEA is not executable"; exit 1; }
  echo "$FLEETGATE_GITEA"
  exit 0
fi

if [[ -x "$OUT/gitea" && -d "$OUT/options" ]]; then
  echo "$OUT/gitea"
  exit 0
fi

command -v go >/dev/null || { log "Go is required (https://go.dev/dl); none on PATH"; exit 1; }
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fleetgate-gitea-build.XXXXXX")
trap 'chmod -R u+w "$WORK" 2>/dev/null; rm -rf "$WORK"' EXIT

log "building gitea ${GITEA_VERSION} (a cold build takes several minutes)"
SRC=$(go mod download -json "code.gitea.io/gitea@${GITEA_VERSION}" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[[ -d "$SRC" ]] || { log "go mod download gave no directory for code.gitea.io/gitea@${GITEA_VERSION}"; exit 1; }
# The module cache is read-only; the build writes nothing into the tree, but a copy keeps
# the cache pristine whatever go generate-like steps a future version adds.
cp -r "$SRC" "$WORK/src"
chmod -R u+w "$WORK/src"
# sqlite for the test database; sqlite_unlock_notify as Gitea's own Makefile builds it.
# CGO stays on: the sqlite driver Gitea uses (mattn/go-sqlite3) needs it.
(cd "$WORK/src" && go build -trimpath -tags 'sqlite sqlite_unlock_notify' \
  -ldflags "-s -w -X main.Version=${GITEA_VERSION#v}" -o "$WORK/gitea" .) >&2
mkdir -p "$OUT"
rm -rf "$OUT/options"
cp -r "$WORK/src/options" "$OUT/options"
mv "$WORK/gitea" "$OUT/gitea"
"$OUT/gitea" --version >&2
echo "$OUT/gitea"

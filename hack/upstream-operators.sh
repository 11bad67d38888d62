#!/usr/bin/env bash
# Fetches real operators' published manifests, exactly as upstream ships them, for the tests of
# tests/releng/upstream_operators.rs: each operator's source module from the Go module proxy (the one
# route to upstream sources this machine has), keeping only the files the tests use, in a
# versioned cache directory outside the repo. Nothing of it is ever committed.
#
#   hack/upstream-operators.sh                 every operator@version the tests pin
#   hack/upstream-operators.sh argo-cd@v3.6.2  one of them; prints its directory last
#
# Idempotent: a version already extracted prints its directory at once. GOPROXY is honoured
# (its first http(s) entry); FLEETGATE_CACHE moves the cache.
set -euo pipefail

CACHE=${FLEETGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fleetgate}/upstream

log() { echo "upstream-operators: $*" >&2; }

# name → module path and the files the tests read (paths inside the module).
module_of() {
  case "$1" in
    argo-cd) echo "github.com/argoproj/argo-cd/v3" ;;
    prometheus-operator) echo "github.com/prometheus-operator/prometheus-operator" ;;
    *) log "unknown operator $1 (known: argo-cd, prometheus-operator)"; exit 2 ;;
  esac
}
files_of() {
  case "$1" in
    # ~60 objects without metadata.namespace (`kubectl apply -n argocd`), three images, CRDs of
    # up to ~1 MB, wildcard ClusterRoles.
    argo-cd) echo "manifests/install.yaml" ;;
    # Ten CRDs of up to 1.5 MB in one 4 MB file, objects in namespace default.
    prometheus-operator) echo "bundle.yaml" ;;
  esac
}
# The versions the tests install and upgrade between.
PINS=(argo-cd@v3.5.8 argo-cd@v3.6.2 prometheus-operator@v0.84.0 prometheus-operator@v0.85.0)

proxy() {
  local p
  IFS=',|' read -ra entries <<<"${GOPROXY:-$(go env GOPROXY 2>/dev/null || echo https://proxy.golang.org)}"
  for p in "${entries[@]}"; do
    [[ $p == http://* || $p == https://* ]] && { echo "${p%/}"; return; }
  done
  log "GOPROXY names no http(s) proxy (${GOPROXY:-unset}); set GOPROXY=https://proxy.golang.org"
  exit 1
}

# The module path as the proxy protocol spells it: each capital letter as '!' + lower case.
escape() { sed -E 's/([A-Z])/!\L\1/g' <<<"$1"; }

fetch() {
  local name=${1%@*} version=${1#*@} module dir zip f
  module=$(module_of "$name")
  dir="$CACHE/$name-$version"
  if [[ -f "$dir/.complete" ]]; then
    echo "$dir"
    return
  fi
  command -v curl >/dev/null && command -v unzip >/dev/null || { log "needs curl and unzip (make deps-test)"; exit 1; }
  mkdir -p "$CACHE"
  zip=$(mktemp "$CACHE/.$name-$version.XXXXXX.zip")
  trap 'rm -f "$zip"' RETURN
  log "downloading $module@$version from $(proxy)"
  curl -fsSL --retry 3 -o "$zip" "$(proxy)/$(escape "$module")/@v/$version.zip"
  rm -rf "$dir" && mkdir -p "$dir"
  for f in $(files_of "$name"); do
    mkdir -p "$dir/$(dirname "$f")"
    unzip -p "$zip" "$module@$version/$f" >"$dir/$f"
    [[ -s "$dir/$f" ]] || { log "$module@$version has no $f"; exit 1; }
  done
  touch "$dir/.complete"
  echo "$dir"
}

if [[ $# -eq 0 ]]; then set -- "${PINS[@]}"; fi
for pin in "$@"; do
  [[ $pin == *@v* ]] || { log "say NAME@VERSION, e.g. argo-cd@v3.6.2 (got $pin)"; exit 2; }
  fetch "$pin"
done

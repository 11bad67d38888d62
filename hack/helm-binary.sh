#!/usr/bin/env bash
# Builds the `helm` binary that fleetgate's tests and demo use to render charts
# (`fleetgate release create --chart`) from its Go module into the same cache as the
# Kubernetes binaries, and prints the binary's path. Users bring their own helm: this
# script exists so the tests run against the real one without a download step.
#
# Idempotent: with the binary present it prints the path at once.
# FLEETGATE_HELM (the variable `release create --chart` honours) short-circuits everything.
set -euo pipefail

HELM_VERSION=${HELM_VERSION:-v3.22.0}
CACHE=${FLEETGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fleetgate}
OUT="$CACHE/helm-${HELM_VERSION}/bin"

log() { echo "helm-binary: $*" >&2; }

if [[ -n "${FLEETGATE_HELM:-}" ]]; then
  [[ -x "$FLEETGATE_HELM" ]] || { log "FLEETGATE_HELM=$FLEETGATE_HELM is not executable"; exit 1; }
  echo "$FLEETGATE_HELM"
  exit 0
fi

if [[ -x "$OUT/helm" ]]; then
  echo "$OUT/helm"
  exit 0
fi

command -v go >/dev/null || { log "Go is required (https://go.dev/dl); none on PATH"; exit 1; }
mkdir -p "$OUT"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fleetgate-helm-build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export CGO_ENABLED=0 GOTOOLCHAIN=${GOTOOLCHAIN:-local}

log "building helm ${HELM_VERSION} (a cold build takes a few minutes)"
# `go install pkg@version` builds the module exactly as its go.mod pins it; the version
# ldflag makes `helm version` print the release instead of "v3.x-dev".
GOBIN="$WORK/gobin" go install -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION} -X helm.sh/helm/v3/internal/version.gitTreeState=clean" \
  "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}" >&2
mv "$WORK/gobin/helm" "$OUT/helm"
"$OUT/helm" version --short >&2
echo "$OUT/helm"

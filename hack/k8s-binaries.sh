#!/usr/bin/env bash
# Builds the real Kubernetes control-plane binaries that fleetgate's tests and demo run
# (kube-apiserver, kube-controller-manager, kube-scheduler, etcd, kwok) from the Go module
# proxy into a versioned cache directory outside the repo, and prints that directory.
#
# Why a wrapper module: k8s.io/kubernetes requires its staging modules at v0.0.0 with
# `replace => ./staging/...`, and a dependency's replace lines are ignored. Our wrapper
# replaces each staging module with its published v0.<minor>.<patch>; the list is derived
# from that version's real go.mod, never written by hand.
#
# Idempotent: with every binary present (and reporting the right version) it exits at once.
# KUBEBUILDER_ASSETS (the envtest convention) short-circuits everything.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.36.3}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
KWOK_VERSION=${KWOK_VERSION:-v0.7.0}
CACHE=${FLEETGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fleetgate}
OUT="$CACHE/k8s-${K8S_VERSION}/bin"
BINS=(kube-apiserver kube-controller-manager kube-scheduler etcd kwok)

log() { echo "k8s-binaries: $*" >&2; }

if [[ -n "${KUBEBUILDER_ASSETS:-}" ]]; then
  for b in kube-apiserver etcd; do
    [[ -x "$KUBEBUILDER_ASSETS/$b" ]] || { log "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS has no $b"; exit 1; }
  done
  echo "$KUBEBUILDER_ASSETS"
  exit 0
fi

missing=()
for b in "${BINS[@]}"; do [[ -x "$OUT/$b" ]] || missing+=("$b"); done
if ((${#missing[@]} == 0)); then
  echo "$OUT"
  exit 0
fi

command -v go >/dev/null || { log "Go is required (https://go.dev/dl); none on PATH"; exit 1; }
mkdir -p "$OUT"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fleetgate-k8s-build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=${GOTOOLCHAIN:-local}

minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
patch=${K8S_VERSION##*.}
staging="v0.${minor}.${patch}"
build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)

need() { [[ " ${missing[*]} " == *" $1 "* ]]; }

if need kube-apiserver || need kube-controller-manager || need kube-scheduler; then
  log "building Kubernetes ${K8S_VERSION} (staging modules ${staging}); a cold build takes 10-20 minutes"
  gomod=$(go mod download -json "k8s.io/kubernetes@${K8S_VERSION}" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
  [[ -f "$gomod" ]] || { log "could not download k8s.io/kubernetes@${K8S_VERSION} go.mod"; exit 1; }
  d="$WORK/kubernetes"; mkdir -p "$d"
  {
    echo "module fleetgate.local/k8s-binaries"
    echo
    grep -E '^go [0-9]' "$gomod"
    grep -E '^godebug ' "$gomod" || true
    echo
    echo "require k8s.io/kubernetes ${K8S_VERSION}"
    echo
    echo "replace ("
    grep -E '^\s*k8s\.io/[^ ]+ => \./staging/' "$gomod" | awk -v v="$staging" '{print "\t" $1 " => " $1 " " v}'
    echo ")"
  } >"$d/go.mod"
  cat >"$d/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
GO
  ldflags="-s -w -X k8s.io/component-base/version.gitVersion=${K8S_VERSION} \
    -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${minor} \
    -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/component-base/version.buildDate=${build_date} \
    -X k8s.io/client-go/pkg/version.gitVersion=${K8S_VERSION} -X k8s.io/client-go/pkg/version.gitMajor=1 \
    -X k8s.io/client-go/pkg/version.gitMinor=${minor}"
  (cd "$d" && go mod tidy -e >/dev/null 2>&1 || true
   cd "$d" && go get "k8s.io/kubernetes@${K8S_VERSION}" >&2)
  for b in kube-apiserver kube-controller-manager kube-scheduler; do
    need "$b" || continue
    log "go build $b"
    (cd "$d" && go build -trimpath -ldflags "$ldflags" -o "$OUT/$b.tmp" "k8s.io/kubernetes/cmd/$b")
    mv "$OUT/$b.tmp" "$OUT/$b"
  done
fi

if need etcd; then
  log "building etcd ${ETCD_VERSION}"
  d="$WORK/etcd"; mkdir -p "$d"
  cat >"$d/go.mod" <<GOMOD
module fleetgate.local/etcd-binary

go 1.24

require go.etcd.io/etcd/server/v3 ${ETCD_VERSION}
GOMOD
  printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' >"$d/tools.go"
  (cd "$d" && go get "go.etcd.io/etcd/server/v3@${ETCD_VERSION}" >&2 && \
   go build -trimpath -ldflags "-s -w" -o "$OUT/etcd.tmp" go.etcd.io/etcd/server/v3)
  mv "$OUT/etcd.tmp" "$OUT/etcd"
fi

if need kwok; then
  log "building kwok ${KWOK_VERSION}"
  GOBIN="$WORK/gobin" go install -trimpath -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION}" \
    "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}" >&2
  mv "$WORK/gobin/kwok" "$OUT/kwok"
fi

"$OUT/kube-apiserver" --version >&2
echo "$OUT"

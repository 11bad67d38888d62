#!/usr/bin/env bash
# Installs the Debian packages fleetgate builds and tests against, idempotently:
# gpgme (signature verification), OpenSSL + pkg-config (libssh2's crypto for git2's ssh), gnupg (test keys),
# git (git daemon in tests), prometheus (metric-gate tests), openssh-client (ssh-keygen: SSH
# signatures and status keys in tests), buildah + mmdebstrap (`make image` and tests/image.rs build
# and run the container image without a Docker engine). Skips packages already present.
set -euo pipefail
pkgs=(libgpgme-dev libssl-dev pkg-config gnupg git prometheus build-essential openssh-client buildah mmdebstrap)
# chromium (headless: tests/status_html.rs renders the status page), zsh + fish (tests/cli_habits.rs
# loads the shell completions fleetgate prints), openssh-server + tinyproxy (tests/git_access.rs
# runs its own sshd and proxy on loopback).
pkgs+=(chromium zsh fish openssh-server tinyproxy)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
((${#missing[@]} == 0)) && exit 0
SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
echo "deps: installing ${missing[*]}" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
# These packages start system services; tests run their own instances (on their own ports).
for svc in prometheus ssh tinyproxy; do
  if command -v systemctl >/dev/null && systemctl is-active --quiet "$svc" 2>/dev/null; then
    $SUDO systemctl stop "$svc" || true
    $SUDO systemctl disable "$svc" 2>/dev/null || true
  fi
done

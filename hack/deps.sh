#!/usr/bin/env bash
# Installs the Debian packages fleetgate builds and tests against, idempotently:
# gpgme (signature verification), OpenSSL + pkg-config (git2's https/ssh), gnupg (test keys),
# git (git daemon in tests), prometheus (metric-gate tests), openssh-client (ssh-keygen: SSH
# signatures and status keys in tests), buildah + mmdebstrap (`make image` and tests/image.rs build
# and run the container image without a Docker engine). Skips packages already present.
set -euo pipefail
pkgs=(libgpgme-dev libssl-dev pkg-config gnupg git prometheus build-essential openssh-client buildah mmdebstrap)
# chromium (headless: tests/status_html.rs renders the status page), zsh + fish (tests/cli_habits.rs
# loads the shell completions fleetgate prints).
pkgs+=(chromium zsh fish)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
((${#missing[@]} == 0)) && exit 0
SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
echo "deps: installing ${missing[*]}" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
# The prometheus package starts a system service; tests run their own instances.
if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
  $SUDO systemctl stop prometheus || true
fi

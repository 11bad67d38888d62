#!/usr/bin/env bash
# Installs the Debian packages fleetgate needs, idempotently, leaving the machine's services as
# they were:
#
#   hack/deps.sh demo    what `make build`, `make demo` and `make testenv` need
#   hack/deps.sh image   what `make image` needs
#   hack/deps.sh test    all of it plus what only tests use (`make test`)
#
# Packages already installed are skipped; with none missing this asks for nothing (no sudo, no apt).
# While apt installs, /usr/sbin/policy-rc.d answers 101 ("action forbidden"), which invoke-rc.d
# and deb-systemd-invoke ask before they start, stop or restart any service: no package starts its
# daemon, and none restarts one that runs. It is put there only when there is none (a machine's
# own is left as it is) and removed however this ends. Debian still enables a new package's
# service for the next boot; the ones this run enabled or started are disabled and stopped again,
# so a reboot brings up no sshd or Prometheus the machine never ran. A service that ran or was
# enabled before is never stopped or disabled.
#
# DEPS_ROOT (default empty: /) prefixes policy-rc.d's path; tests/cli/setup.rs runs this script with
# it and fake apt-get, dpkg-query, systemctl, id and sudo on PATH.
set -euo pipefail

# build-essential + pkg-config + libgpgme-dev + libssl-dev: the Rust build (gpgme verifies
# signatures; OpenSSL is libssh2's crypto for git2's ssh). gnupg: the demo's signing keys. git:
# the fleet repo and `git daemon`. curl + python3: hack/demo.sh talks to Gitea and the agents.
demo=(build-essential pkg-config libgpgme-dev libssl-dev gnupg git curl python3)
# buildah + mmdebstrap: hack/image.sh builds and runs the container image without a Docker engine.
image=(buildah mmdebstrap)
# prometheus (metric-gate tests), openssh-client (ssh-keygen: SSH signatures and status keys in
# tests), chromium (headless: tests/status/status_html.rs renders the status page), zsh + fish
# (tests/cli/cli_habits.rs loads the shell completions fleetgate prints), openssh-server + tinyproxy
# (tests/trust/git_access.rs runs its own sshd and proxy on loopback); tests/cli/image.rs builds the image.
# unzip: hack/upstream-operators.sh takes real operators' manifests out of Go module zips.
test_only=(prometheus openssh-client chromium zsh fish openssh-server tinyproxy unzip)
# The services those packages bring (tests start their own instances, on their own ports).
declare -A unit_of=([prometheus]=prometheus [openssh-server]=ssh [tinyproxy]=tinyproxy)

case ${1:-} in
demo) pkgs=("${demo[@]}") ;;
image) pkgs=("${image[@]}") ;;
test) pkgs=("${demo[@]}" "${image[@]}" "${test_only[@]}") ;;
*) echo "usage: hack/deps.sh demo|image|test" >&2; exit 2 ;;
esac

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
((${#missing[@]} == 0)) && exit 0
SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo

# Before: which services of the missing packages run or are enabled (none, unless a package was
# removed but not purged, or another one provides the unit).
units=() was_active=() was_enabled=()
if command -v systemctl >/dev/null; then
  for p in "${missing[@]}"; do
    u=${unit_of[$p]:-}
    [[ -n "$u" ]] || continue
    units+=("$u")
    systemctl is-active --quiet "$u" 2>/dev/null && was_active+=("$u")
    systemctl is-enabled --quiet "$u" 2>/dev/null && was_enabled+=("$u")
  done
fi

policy=${DEPS_ROOT:-}/usr/sbin/policy-rc.d
ours=""
trap '[[ -z "$ours" ]] || $SUDO rm -f "$policy"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
if [[ -e "$policy" ]]; then
  echo "deps: keeping the machine's own $policy" >&2
else
  # `set -C`: only if still absent, so one that appears meanwhile is not overwritten (nor removed).
  $SUDO sh -c 'set -C; printf "#!/bin/sh\n# hack/deps.sh: no service starts or stops while it installs packages.\nexit 101\n" >"$1"' sh "$policy"
  ours=1
  $SUDO chmod 0755 "$policy"
fi

echo "deps: installing ${missing[*]}" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2

# After: back to how they were.
for u in "${units[@]}"; do
  if [[ " ${was_active[*]} " != *" $u "* ]] && systemctl is-active --quiet "$u" 2>/dev/null; then
    $SUDO systemctl stop "$u"
  fi
  if [[ " ${was_enabled[*]} " != *" $u "* ]] && systemctl is-enabled --quiet "$u" 2>/dev/null; then
    $SUDO systemctl disable --quiet "$u"
  fi
done

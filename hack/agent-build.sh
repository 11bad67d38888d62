#!/usr/bin/env bash
# Builds the binary the container image ships, target/agent/fleetgate: the `agent` profile
# (Cargo.toml: optimised for size), linked so that little of it stays resident (docs/BENCHMARKS.md,
# "Agent footprint"). `make image` (hack/image.sh), the Dockerfile's build stage, `make bench` and
# `make agent-order` build it here. Every other build — the CLI, tests, `cargo install` — is plain
# cargo; these settings are this build's alone:
#
#   * v0 symbol names in every crate (RUSTFLAGS), which spell out generic arguments
#     (`<Vec<u8>>::push`), so that link/agent.order can name one instance of a generic function;
#   * the functions the agent runs first in `.text`, in link/agent.order's order (made by
#     hack/agent-order.sh): the kernel keeps 64 KiB of code resident around each page it faults in,
#     so the same functions spread over the binary kept nearly all of it resident. The list names
#     functions without their symbols' crate hashes; link/cc, the linker of this one link, finds
#     their symbols for lld (which rustc links x86_64 Linux with since 1.90, the crate's
#     rust-version). Names the build lacks are skipped: a stale list costs memory, not a link;
#   * relative relocations packed into a bitmap (DT_RELR) instead of 24 bytes each: the dynamic
#     loader reads every one at start, so the 1.9 MB table they took was resident in every process.
#     Needs lld 15 or binutils 2.38 to link and glibc 2.36 to run (an older glibc refuses the
#     binary by name, GLIBC_ABI_DT_RELR); the image's base is Debian 12's 2.36.
#
# The link settings go to the binary's link only (`cargo rustc … -- ARGS`), not to build scripts.
# Arguments go to cargo (tests/cli/setup.rs passes --manifest-path). FLEETGATE_LINK_ORDER names
# another list (hack/agent-order.sh links with every function that ran); CARGO_TARGET_DIR is honoured.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
ORDER=${FLEETGATE_LINK_ORDER:-$ROOT/link/agent.order}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
[[ "$TARGET" == /* ]] || TARGET=$ROOT/$TARGET

# Cargo relinks when the link's arguments change, not when a file they name does: the list goes
# to the linker under a name made of its checksum and link/cc's, so that a new list (or linker)
# relinks and the same ones do not.
sum=$(cat "$ORDER" link/cc | cksum | cut -d' ' -f1)
mkdir -p "$TARGET/agent-link"
list=$TARGET/agent-link/$sum.order
[[ -f "$list" ]] || { cp "$ORDER" "$list.tmp" && mv "$list.tmp" "$list"; }

export RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-C symbol-mangling-version=v0"
"${CARGO:-cargo}" rustc --profile agent --locked --bin fleetgate "$@" -- \
  -C "linker=$ROOT/link/cc" \
  -C link-arg=-Wl,-z,pack-relative-relocs \
  -C "link-arg=-Wl,--symbol-ordering-file=$list" \
  -C link-arg=-Wl,--no-warn-symbol-ordering

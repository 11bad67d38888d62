#!/usr/bin/env bash
# Regenerates link/agent.order: the functions the agent runs, hottest first, which
# hack/agent-build.sh hands the linker so that they sit together at the start of `.text`
# (docs/BENCHMARKS.md, "Agent footprint": the kernel keeps 64 KiB of code resident around every
# page it faults in, so code the agent runs, scattered over the binary, kept nearly all of `.text`
# resident).
#
#   1. builds the `agent` profile (hack/agent-build.sh) with LLVM's profiling counters in every
#      function the build compiles, the standard library's generic functions included (`-C profile-generate`, with
#      the pre-inliner off so that small functions keep counters of their own) into target/agent-order;
#   2. runs the demo story with that binary as hack/agent-footprint.sh does (10 s poll, 15 s
#      lease); each agent writes its counters when it stops (SIGTERM, at the end of the demo);
#   3. keeps the functions with a count in any agent, most executed first, by name without the
#      crate hashes of their symbols (link/cc finds the symbols at link time);
#   4. builds the `agent` profile as it ships and keeps, of those, the ones it has as functions of
#      their own (most ran inlined into others). link/cc puts the standard library's functions
#      after them, with no list.
#
# What is not listed still links, after: the C of libgit2 and libssh2 (no counters), code paths
# the story does not take, functions added since the list was made. A stale list costs memory,
# never correctness; re-run this after large changes to the agent (`make agent-order`) and
# compare with hack/agent-footprint.sh.
#
# Needs llvm-profdata of the toolchain (`rustup component add llvm-tools`) and what `make demo`
# needs (`make agent-order` builds it).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=$ROOT/target/agent-order
HOST=$(rustc -vV | sed -n 's/^host: //p')
PROFDATA=$(rustc --print sysroot)/lib/rustlib/$HOST/bin/llvm-profdata
[[ -x "$PROFDATA" ]] || { echo "llvm-profdata is missing: rustup component add llvm-tools" >&2; exit 2; }

# Proc macros and build scripts get the counters too (RUSTFLAGS without --target, which would
# change the build's crate hashes): what they write while compiling goes to the bin.
mkdir -p "$OUT/build-profraw"
LLVM_PROFILE_FILE="$OUT/build-profraw/%p.profraw" CARGO_TARGET_DIR=$OUT \
  RUSTFLAGS="-C profile-generate -C llvm-args=-disable-preinline" bash hack/agent-build.sh
rm -rf "$OUT/build-profraw" "$OUT/profraw"
mkdir -p "$OUT/profraw"

DEMO=$(mktemp -d /tmp/fg-order.XXXXXX)
# The CLI commands of the story run the same binary: their counters (25 MB a process) go nowhere.
LLVM_PROFILE_FILE=/dev/null DEMO_AGENT_ENV="LLVM_PROFILE_FILE=$OUT/profraw/%p.profraw" \
  FLEETGATE_BIN=$OUT/agent/fleetgate \
  DEMO_DIR=$DEMO DEMO_INTERVAL=10s DEMO_LEASE_DURATION=15s bash hack/demo.sh

raws=()
for f in "$DEMO"/agent-*.pid; do
  raw=$OUT/profraw/$(cat "$f").profraw
  [[ -s "$raw" ]] || { echo "no counters from the agent of $f ($raw): did it stop on SIGTERM?" >&2; exit 1; }
  raws+=("$raw")
done
"$PROFDATA" merge --sparse -o "$OUT/agent.profdata" "${raws[@]}"
"$PROFDATA" show --all-functions --counts "$OUT/agent.profdata" | python3 -c '
import re, sys
# `show --counts` prints, per function, "  NAME:" then indented fields, among them
# "Block counts: [..]". A local function is named "FILE;SYMBOL": the linker knows it as SYMBOL.
funcs, name = {}, None
for line in sys.stdin:
    m = re.match(r"^  (\S.*):$", line)
    if m:
        name = m[1].rsplit(";", 1)[-1]
        continue
    m = re.match(r"^\s+Block counts: \[([^\]]*)\]$", line.rstrip())
    if m and name:
        counts = [int(c) for c in m[1].replace(",", " ").split()]
        funcs[name] = max(funcs.get(name, 0), max(counts, default=0))
hot = sorted((n for n, c in funcs.items() if c > 0), key=lambda n: (-funcs[n], n))
sys.stdout.write("".join(n + "\n" for n in hot))
print(f"{len(hot)} functions ran in the agents", file=sys.stderr)
' | c++filt | sed 's/\[[0-9a-f]*\]//g' | awk '!seen[$0]++' >"$OUT/ran.txt"
rm -rf "$DEMO"

# 4. Most of them ran inlined into others: keep the names the real build has. (What link/cc puts
#    after them, the standard library's functions, needs no list.) The real build links with the
#    whole list first (hack/agent-build.sh relinks the next build, with the list written here);
#    link/cc leaves every function it saw next to the binary.
FLEETGATE_LINK_ORDER=$OUT/ran.txt bash hack/agent-build.sh
TARGET=${CARGO_TARGET_DIR:-target}
functions=$(ls -t "$TARGET"/agent/deps/fleetgate-*.functions | head -1)
cut -f2 "$functions" | awk 'NR == FNR { found[$0]; next } $0 in found' - "$OUT/ran.txt" >link/agent.order
echo "wrote link/agent.order: $(wc -l <link/agent.order) functions of the $(wc -l <"$OUT/ran.txt") that ran;" \
  "hack/agent-build.sh links with it"

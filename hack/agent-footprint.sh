#!/usr/bin/env bash
# The agent's footprint through the demo story (docs/BENCHMARKS.md "Agent footprint"): runs
# hack/demo.sh with the agent as the image ships it (the `agent` profile), each agent polling every 10 s with the default lease
# (15 s), then, while the agents still run, reports for each agent
#
#   * VmHWM (peak RSS over the whole story: rel-1, the bad rel-2 rolled back, rel-3) and VmRSS;
#   * CPU time (utime + stime from /proc/PID/stat) over an idle minute, as % of one core;
#   * where the resident memory is, by mapping (/proc/PID/smaps): the binary, shared libraries,
#     malloc's main heap and its per-thread arenas, thread stacks, Git pack windows, other
#     anonymous mappings;
#   * glibc's own arena statistics (malloc_stats() called through gdb, when gdb is installed; it
#     prints to the agent's stderr, so it lands in agent-CLUSTER.log).
#
#   hack/agent-footprint.sh            # FOOTPRINT_IDLE=60 (seconds), DEMO_DIR=… to keep the files
#   hack/agent-footprint.sh --measure DIR   # only the measurement, on a demo that still runs
#
# Binaries: FLEETGATE_BIN (default target/agent/fleetgate, the image's build by hack/agent-build.sh; target/release/fleetgate
# is the CLI's), TESTENV_BIN (default the release build if there is one, else
# target/debug/fleetgate-testenv).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
IDLE=${FOOTPRINT_IDLE:-60}

measure() { # measure DIR
  local dir=$1
  uptime | sed 's/^/    load: /'
  python3 - "$dir" "$IDLE" <<'PY'
import glob, os, re, subprocess, sys, time

dir, idle = sys.argv[1], int(sys.argv[2])
tick = os.sysconf("SC_CLK_TCK")
agents = {}
for f in sorted(glob.glob(os.path.join(dir, "agent-*.pid"))):
    cluster = os.path.basename(f)[len("agent-"):-len(".pid")]
    agents[cluster] = int(open(f).read().strip())

def status(pid):
    out = {}
    for line in open(f"/proc/{pid}/status"):
        k, _, v = line.partition(":")
        if k in ("VmHWM", "VmRSS", "Threads", "RssAnon", "RssFile"):
            out[k] = int(v.split()[0])
    return out

def cpu_ticks(pid):
    # Fields after the command name (which may hold spaces): utime is the 14th field, stime the 15th.
    rest = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(rest[11]) + int(rest[12])

def smaps(pid, binary):
    """Resident KiB by kind of mapping."""
    maps = []
    cur = None
    for line in open(f"/proc/{pid}/smaps"):
        m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \S+\s*(.*)$", line)
        if m:
            cur = {"start": int(m[1], 16), "end": int(m[2], 16), "perms": m[3], "path": m[4].strip(), "rss": 0}
            maps.append(cur)
        elif line.startswith("Rss:"):
            cur["rss"] = int(line.split()[1])
    kinds = {}
    for i, m in enumerate(maps):
        prev = maps[i - 1] if i else None
        nxt = maps[i + 1] if i + 1 < len(maps) else None
        path = m["path"]
        if path == binary or path.endswith("/fleetgate"):
            kind = "binary code" if "x" in m["perms"] else "binary data"
        elif ".so" in path:
            kind = os.path.basename(path).split(".so")[0]
        elif path.endswith((".pack", ".idx")):
            kind = "Git pack windows"
        elif path == "[heap]":
            kind = "malloc main heap"
        elif path == "[stack]":
            kind = "main thread stack"
        elif path:
            kind = "other files"
        elif m["perms"].startswith("rw") and nxt and nxt["start"] == m["end"] and nxt["perms"].startswith("---") \
                and (nxt["end"] - m["start"]) == 64 << 20:
            kind = "malloc thread arenas"
        elif m["perms"].startswith("rw") and prev and prev["end"] == m["start"] and prev["perms"].startswith("---") \
                and prev["end"] - prev["start"] <= 64 << 10:
            kind = "thread stacks"
        else:
            kind = "other anonymous"
        kinds[kind] = kinds.get(kind, 0) + m["rss"]
    return kinds

before = {}
for c, pid in agents.items():
    s = status(pid)
    before[c] = (cpu_ticks(pid), time.monotonic())
    print(f"    {c}: pid {pid}, after the story: VmHWM {s['VmHWM'] / 1024:.1f} MiB, VmRSS {s['VmRSS'] / 1024:.1f} MiB "
          f"(anon {s['RssAnon'] / 1024:.1f}, file {s['RssFile'] / 1024:.1f}), {s['Threads']} threads")
print(f"    idle for {idle} s …", flush=True)
time.sleep(idle)
for c, pid in agents.items():
    t0, m0 = before[c]
    used = (cpu_ticks(pid) - t0) / tick
    wall = time.monotonic() - m0
    s = status(pid)
    print(f"    {c}: idle CPU {used:.2f} s in {wall:.0f} s = {100 * used / wall:.2f} % of a core; "
          f"VmHWM {s['VmHWM'] / 1024:.1f} MiB, VmRSS {s['VmRSS'] / 1024:.1f} MiB, {s['Threads']} threads")
    kinds = smaps(pid, os.readlink(f"/proc/{pid}/exe"))
    # Shared libraries by name (they start with "lib" or "ld-"), the rest by kind.
    libs = {k: v for k, v in kinds.items() if k.startswith(("lib", "ld-"))}
    rest = {k: v for k, v in kinds.items() if k not in libs}
    rest["shared libraries"] = sum(libs.values())
    show = lambda d: ", ".join(f"{k} {v / 1024:.1f}" for k, v in sorted(d.items(), key=lambda kv: -kv[1]) if v >= 51)
    print(f"      resident MiB: {show(rest)}")
    print(f"      shared libraries MiB: {show(libs)}")
gdb = subprocess.run(["sh", "-c", "command -v gdb"], capture_output=True, text=True).stdout.strip()
if gdb:
    for c, pid in agents.items():
        subprocess.run([gdb, "-p", str(pid), "-batch", "-ex", "call (void) malloc_stats()"], capture_output=True)
    print(f"    malloc_stats() of each agent: the 'Arena'/'Total' lines at the end of {dir}/agent-*.log")
PY
}

if [[ "${1:-}" == --measure ]]; then
  measure "$2"
  exit
fi

export FLEETGATE_BIN=${FLEETGATE_BIN:-$ROOT/target/agent/fleetgate}
if [[ -z "${TESTENV_BIN:-}" ]]; then
  TESTENV_BIN=$ROOT/target/release/fleetgate-testenv
  [[ -x "$TESTENV_BIN" ]] || TESTENV_BIN=$ROOT/target/debug/fleetgate-testenv
  export TESTENV_BIN
fi
[[ -x "$FLEETGATE_BIN" ]] || { echo "build first: bash hack/agent-build.sh"; exit 2; }
echo "agent: $FLEETGATE_BIN"
uptime | sed 's/^/load at the start: /'
DEMO_INTERVAL=10s DEMO_LEASE_DURATION=15s DEMO_AFTER="bash $0 --measure" exec bash "$ROOT/hack/demo.sh"

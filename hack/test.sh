#!/usr/bin/env bash
# `make test`: build, then every test, in as little wall time as two cores allow.
#
# * The Rust build runs beside testenv's Go builds (Kubernetes, helm, Gitea): on a cold machine
#   they overlap their downloads and link steps (about 19 minutes for both here, against ~35 one
#   after the other).
# * tests/e2e.rs (the demo: three control planes, ~200 s, one test that mostly waits on bakes)
#   runs beside the other test binaries, which cargo runs one after another with TEST_THREADS
#   tests each; its output is printed whole once the rest is done.
set -uo pipefail
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}
THREADS=${TEST_THREADS:-2}
E2E=three_releases_through_three_waves_with_the_canary_agent_killed_twice

$CARGO build --workspace --all-targets & build=$!
${MAKE:-make} --no-print-directory testenv; testenv=$?
wait $build || { echo 'make test: cargo build failed (above)' >&2; exit 1; }
((testenv == 0)) || exit $testenv

log=$(mktemp)
trap 'rm -f "$log"' EXIT
$CARGO test --test e2e -- --exact "$E2E" >"$log" 2>&1 & e2e=$!
$CARGO test --workspace --no-fail-fast -- --test-threads="$THREADS" --skip "$E2E"; rest=$?
wait $e2e; e2e_rc=$?
cat "$log"
((rest == 0 && e2e_rc == 0)) || { echo "make test: failed (tests/e2e.rs exit $e2e_rc, the rest exit $rest)" >&2; exit 1; }

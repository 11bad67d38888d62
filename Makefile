# fleetgate — one command to run the main job (`make demo`), one to run the tests (`make test`).
# Both install what they need (Debian packages, Kubernetes binaries built from Go modules) first;
# every step is idempotent and cached (~/.cache/fleetgate, ~/.cargo, ~/go).

SHELL := /bin/bash
CARGO ?= cargo
# Tests start real control planes; two cores fit two at a time.
TEST_THREADS ?= 2

.PHONY: all deps testenv build test demo bench clean-testenv

all: build

deps:
	@bash hack/deps.sh

testenv: deps
	@bash hack/k8s-binaries.sh >/dev/null

build: deps
	$(CARGO) build --workspace --bins

test: testenv
	$(CARGO) build --workspace --all-targets
	$(CARGO) test --workspace --no-fail-fast -- --test-threads=$(TEST_THREADS)

demo: testenv
	$(CARGO) build --workspace --bins
	@bash hack/demo.sh

bench: testenv
	@bash hack/bench.sh

# Stops stray test processes (should never be needed: every handle kills its processes on drop).
clean-testenv:
	-@pkill -f '/.cache/fleetgate/k8s-' || true

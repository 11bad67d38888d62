# fleetgate — one command to run the main job (`make demo`), one to run the tests (`make test`).
# Both install what they need (Debian packages, Kubernetes binaries built from Go modules) first;
# every step is idempotent and cached (~/.cache/fleetgate, ~/.cargo, ~/go), and no running service
# is stopped (hack/deps.sh). `make install` puts the CLI on PATH.

SHELL := /bin/bash
CARGO ?= cargo
# Tests start real control planes; two cores fit two at a time.
TEST_THREADS ?= 2

.PHONY: all deps deps-test testenv build install test demo bench agent-order fuzz image clean-testenv

all: build

# The Debian packages of the build and the demo; deps-test adds the ones only tests use.
deps:
	@bash hack/deps.sh demo

deps-test:
	@bash hack/deps.sh test

testenv: deps
	@bash hack/k8s-binaries.sh >/dev/null
	@bash hack/helm-binary.sh >/dev/null
	@bash hack/upstream-operators.sh >/dev/null
	@# Gitea is optional: if its build fails here (proxy, disk) or hangs on a slow module proxy
	@# (cold: about 4 min on a quiet 2-core machine), its tests say SKIPPED and the rest run.
	@timeout 1200 bash hack/gitea-binary.sh >/dev/null || echo 'testenv: Gitea was not built within 20 min (see the error above); tests/cli/forge_gitea.rs will skip' >&2

build: deps
	$(CARGO) build --workspace --bins

# The CLI into $(PREFIX)/bin: a plain release build, as `cargo install --path . --locked` makes it
# (PREFIX empty: cargo's own root, ~/.cargo/bin). Needs a C compiler, pkg-config and the gpgme and
# OpenSSL headers (`make deps` installs them on Debian/Ubuntu).
PREFIX ?=
install:
	$(CARGO) install --path . --locked $(if $(PREFIX),--root $(PREFIX))

# The Rust build runs beside the Go builds of `testenv`: on a cold machine they overlap their
# downloads and link steps (about 19 minutes for both at once here, against ~35 one after the other).
test: deps-test
	@$(CARGO) build --workspace --all-targets & build=$$!; \
	  $(MAKE) --no-print-directory testenv; testenv=$$?; \
	  wait $$build || { echo 'make test: cargo build failed (above)' >&2; exit 1; }; \
	  exit $$testenv
	$(CARGO) test --workspace --no-fail-fast -- --test-threads=$(TEST_THREADS)

demo: testenv
	$(CARGO) build --workspace --bins
	@bash hack/demo.sh

# The figures in docs/BENCHMARKS.md: the apply engine vs Flux's fluxcd/pkg/ssa (bench/ssa, built by
# hack/flux-ssa-bench.sh) and the status matrix at 1,000 and 10,000 clusters × 20 releases, release
# profile; then the agent's peak RSS and idle CPU through the demo story, built as the image ships
# it (hack/agent-build.sh; hack/agent-footprint.sh). `uptime` notes the load.
bench: testenv
	@uptime
	bash hack/flux-ssa-bench.sh
	$(CARGO) run --release --example apply_bench
	$(CARGO) run --release --example status_matrix
	$(CARGO) run --release --example status_matrix 10000 20
	bash hack/agent-build.sh
	$(CARGO) build -p fleetgate-testenv --bin fleetgate-testenv
	bash hack/agent-footprint.sh
	@uptime

# link/agent.order, the functions the agent runs, which the image's build (hack/agent-build.sh)
# links first: a profiling build of the agent through the demo story (hack/agent-order.sh). Re-run
# after large changes to the agent, then `make bench` shows what it did.
agent-order: testenv
	$(CARGO) build -p fleetgate-testenv --bin fleetgate-testenv
	bash hack/agent-order.sh

# The parser properties of tests/fuzz_parsers.rs at 20,000 cases each (make test runs 256).
fuzz: deps
	PROPTEST_CASES=20000 $(CARGO) test --test fuzz_parsers --release

# The container image, built with buildah (no Docker engine needed; see hack/image.sh).
image: deps
	@bash hack/deps.sh image
	@bash hack/image.sh

# Stops stray test processes (should never be needed: every handle kills its processes on drop).
clean-testenv:
	-@pkill -f "$$HOME/.cache/fleetgate/k8s-" || true
	-@pkill -f 'git-daemon --reuseaddr --base-path=/tmp/fg-git' || true

# kernelbridge developer entry points. Every target sets up what it needs first (scripts/setup.sh is
# idempotent and takes about a second when everything is already there).

VENV := .venv
PY := $(VENV)/bin/python

.PHONY: all setup setup-venv test test-fast test-kube test-under-load lint typecheck format demo bench image clean

all: test

setup:
	scripts/setup.sh

setup-venv:
	scripts/setup.sh --venv-only

# Four workers on two cores: a test waits on its containers, its timeouts and its bridges' restarts
# part of the time, and the suite is CPU-bound otherwise (both cores were 89% busy through a run
# with three workers, 96-98% with four: README, "How long the suite takes"); tests/conftest.py
# keeps tests that share a machine-wide resource in one worker. TEST_WORKERS=0: this process.
TEST_WORKERS ?= 4
# The slowest tests are listed at the end (the suite's pytest time: README, Development).
PYTEST_PARALLEL = -n $(TEST_WORKERS) --dist loadgroup --durations=30

# The static checks, before any test: ruff (lint and format) and mypy (pyproject.toml's [tool.mypy]).
# mypy runs twice: the sandbox's `mcp` package (kernelbridge/inside/pythonpath) takes the MCP SDK's
# name, so it is checked on its own, with its directory first on the search path.
SANDBOX_MCP = $(shell find kernelbridge/inside/pythonpath -name '*.py' | sort)
define TYPECHECK
	$(VENV)/bin/mypy
	MYPYPATH=kernelbridge/inside/pythonpath $(VENV)/bin/mypy --explicit-package-bases $(SANDBOX_MCP)
endef
define CHECKS
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(TYPECHECK)
endef

# The kube tier (tests/kube, and the kube backend of the runtime suite) runs in `make test` when the
# cluster's binaries are built on this machine; when they are not, its tests skip and this says so.
KUBE_BUILT = scripts/kube-cluster.sh built 2>/dev/null
define KUBE_NOTE
	@$(KUBE_BUILT) || echo "kube tier skipped: the Kubernetes binaries are not built; \`make test-kube\` builds them (once, 11-35 min) and runs it"
endef

test: setup
	$(CHECKS)
	$(KUBE_NOTE)
	$(VENV)/bin/pytest $(PYTEST_PARALLEL)

# Everything but the slow tests (building and installing the package, the unprivileged user):
# for quick iterations; `make test` runs them all.
test-fast: setup
	$(CHECKS)
	$(VENV)/bin/pytest $(PYTEST_PARALLEL) -m "not install"

# The kube tier: a real single-node Kubernetes cluster (scripts/kube-cluster.sh), built once (about
# 25 minutes on 2 cores the first time; cached in ~/.cache/kernelbridge/kube) and started and
# stopped by the tier's fixture. Root only.
test-kube: setup
	scripts/kube-cluster.sh build
	$(VENV)/bin/pytest --durations=10 tests/kube tests/runtime/test_conformance.py -k kube

# The suite (or the tests named in TESTS) on a machine made busy: LOAD busy-loop processes beside
# it (scripts/under-load), all at nice 10, bounded, ended with the run. What CI and users have.
LOAD ?= 4
TESTS ?=
test-under-load: setup
	nice -n 10 scripts/under-load $(LOAD) $(VENV)/bin/pytest $(PYTEST_PARALLEL) $(TESTS)

lint: setup-venv
	$(CHECKS)

typecheck: setup-venv
	$(TYPECHECK)

format: setup-venv
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

demo: setup
	$(VENV)/bin/kernelbridge demo

# Runs every script in bench/ (each prints its own figures).
bench: setup
	@set -e; for f in bench/*.py; do \
		[ -e "$$f" ] || { echo "no benchmarks in bench/"; break; }; \
		echo "== $$f"; $(PY) "$$f"; \
	done

# Rebuild the sandbox image even if it is current.
image: setup-venv
	$(PY) -m kernelbridge.image --force

clean:
	rm -rf .pytest_cache .ruff_cache .mypy_cache build *.egg-info

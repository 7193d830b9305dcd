# kernelbridge developer entry points. Every target sets up what it needs first (scripts/setup.sh is
# idempotent and takes about a second when everything is already there).

VENV := .venv
PY := $(VENV)/bin/python

.PHONY: all setup setup-venv test test-fast lint typecheck format demo bench image clean

all: test

setup:
	scripts/setup.sh

setup-venv:
	scripts/setup.sh --venv-only

# Two workers: most tests wait on containers, not on the CPU (tests/conftest.py keeps tests that
# share a machine-wide resource in one worker). TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2
# The slowest tests are listed at the end: the default suite is kept under 15 minutes.
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

test: setup
	$(CHECKS)
	$(VENV)/bin/pytest $(PYTEST_PARALLEL)

# Everything but the slow tests (building and installing the package, the unprivileged user):
# for quick iterations; `make test` runs them all.
test-fast: setup
	$(CHECKS)
	$(VENV)/bin/pytest $(PYTEST_PARALLEL) -m "not install"

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

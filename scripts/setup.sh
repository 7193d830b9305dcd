#!/usr/bin/env bash
# One-command set-up of a kernelbridge checkout on Debian or Ubuntu; safe to re-run (each step is
# skipped when its result is already there, so a second run takes about a second).
#
#   scripts/setup.sh              system packages (chromium for the lab tier too), .venv, the sandbox
#                                 image, the npm test peers
#   scripts/setup.sh --venv-only  system python bits and .venv only (enough for lint)
#
# As root it installs missing Debian packages itself; otherwise it prints what to install and
# exits 1. Environment: PYTHON creates the venv (default: the distribution's python3, below);
# KERNELBRIDGE_SKIP_IMAGE=1 and KERNELBRIDGE_SKIP_NPM=1 skip those steps.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The virtualenv's interpreter runs every bridge, command and test: PYTHON when set, else the
# distribution's /usr/bin/python3 when it is 3.11 or newer and can make a venv, else the first
# python3 on PATH. Debian builds its python3 with PGO and LTO; one earlier on PATH may be built
# without (pyenv's default): the suite's processes spent 10% more CPU on such a build, side by side
# (README, "How long the suite takes").
DISTRIBUTION_PYTHON=/usr/bin/python3
if [[ -z ${PYTHON:-} ]]; then
    PYTHON=python3
    if "$DISTRIBUTION_PYTHON" -c 'import ensurepip, sys, venv; sys.exit(sys.version_info < (3, 11))' \
        >/dev/null 2>&1; then
        PYTHON=$DISTRIBUTION_PYTHON
    fi
fi
VENV=.venv
STAMP=$VENV/.kernelbridge-installed
NPM_PREFIX=.cache/npm
# The MCP inspector releases after 0.15.0 need Node >= 22; 0.15.0 works with Node 20.
NPM_PACKAGES=(@modelcontextprotocol/inspector@0.15.0 @modelcontextprotocol/server-everything)

venv_only=0
[[ ${1:-} == --venv-only ]] && venv_only=1

say() { printf 'setup: %s\n' "$*"; }

# -- system packages -----------------------------------------------------------------------------------
missing=()
need() {  # need COMMAND PACKAGE: PACKAGE provides COMMAND
    command -v "$1" >/dev/null 2>&1 || missing+=("$2")
}
command -v "$PYTHON" >/dev/null 2>&1 || missing+=(python3)
if [[ ! -x $VENV/bin/python ]] && ! "$PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1; then
    missing+=(python3-venv)
fi
if ((!venv_only)); then
    need podman podman
    # dockerd for the docker backends' tests, which start their own (no bridge, no iptables rules);
    # sshd for the ssh:// engine test, which runs its own in a network namespace.
    need dockerd docker.io
    need sshd openssh-server
    need runc runc
    need mmdebstrap mmdebstrap
    need newuidmap uidmap
    # the lab tier (tests/lab) looks at `kernelbridge lab` in Debian's chromium through its driver
    need chromium chromium
    need chromedriver chromium-driver
    if [[ ${KERNELBRIDGE_SKIP_NPM:-0} != 1 ]] && ! command -v npx >/dev/null 2>&1; then
        missing+=(nodejs npm)
    fi
fi

if ((${#missing[@]})); then
    if [[ $(id -u) != 0 ]]; then
        say "missing system packages: ${missing[*]}"
        say "install them with: sudo apt-get update && sudo apt-get install -y ${missing[*]}"
        exit 1
    fi
    say "installing ${missing[*]} ..."
    export DEBIAN_FRONTEND=noninteractive
    # Keep package scripts from starting services: docker.io's would start a system dockerd that
    # adds a bridge and iptables rules to the host. Only when no policy is in place already.
    no_policy=0
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        no_policy=1
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
    fi
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
    if ((no_policy)); then rm -f /usr/sbin/policy-rc.d; fi
fi

# -- the virtualenv --------------------------------------------------------------------------------------
if [[ ! -x $VENV/bin/python ]]; then
    say "creating $VENV with $("$PYTHON" --version 2>&1)"
    "$PYTHON" -m venv "$VENV"
fi
if [[ ! -f $STAMP || pyproject.toml -nt $STAMP ]]; then
    say "installing kernelbridge, its lab extra and its test dependencies into $VENV ..."
    # The distribution was called `kernelbridge` before it took its index name (kernelbridge-mcp):
    # an old editable install of that name would claim the same scripts and entry points.
    if "$VENV/bin/python" -m pip show -q kernelbridge >/dev/null 2>&1; then
        "$VENV/bin/python" -m pip uninstall -y -q kernelbridge >/dev/null 2>&1 || true
    fi
    # setuptools is chatty on stderr during an editable build: keep its output for failures only.
    if ! "$VENV/bin/python" -m pip install --disable-pip-version-check -e '.[test,lab]' >"$VENV/pip-install.log" 2>&1
    then
        tail -n 20 "$VENV/pip-install.log" >&2
        say "pip install -e '.[test,lab]' failed (full log: $VENV/pip-install.log)"
        exit 1
    fi
    touch "$STAMP"
fi
# The checkout's own bytecode, written now: a shell with PYTHONDONTWRITEBYTECODE=1 (CI's has it)
# would otherwise have every bridge and command the suite starts compile the package again
# (~0.25 CPU-s each, ~250 processes a run). compileall writes only what is stale.
"$VENV/bin/python" -m compileall -q kernelbridge  # -q: silent unless a file does not compile
((venv_only)) && exit 0

# -- the sandbox image -----------------------------------------------------------------------------------
if [[ ${KERNELBRIDGE_SKIP_IMAGE:-0} != 1 ]]; then
    # The image of this tree and of the configured profile and extra packages
    # (KERNELBRIDGE_IMAGE_PROFILE, KERNELBRIDGE_IMAGE_PACKAGES...),
    # in the store of the runtime a bridge would use: `image status` prints "<tag>: <status>".
    status=$("$VENV/bin/kernelbridge" image status 2>&1) || true
    status=${status##*: }
    if [[ $status != current ]]; then
        say "sandbox image is $status: building it (2-5 minutes here) ..."
        "$VENV/bin/python" -m kernelbridge.image
    fi
fi

# -- MCP peers used by the tests (no network at test time) ---------------------------------------------
if [[ ${KERNELBRIDGE_SKIP_NPM:-0} != 1 ]]; then
    have_all=1
    for spec in "${NPM_PACKAGES[@]}"; do
        # "@scope/name@1.2" -> "@scope/name": drop a version, not the scope's leading "@".
        if [[ $spec == @* ]]; then rest=${spec#@}; name=@${rest%@*}; else name=${spec%@*}; fi
        [[ -f $NPM_PREFIX/node_modules/$name/package.json ]] || have_all=0
    done
    if ((!have_all)); then
        say "installing ${NPM_PACKAGES[*]} into $NPM_PREFIX ..."
        mkdir -p "$NPM_PREFIX"
        npm install --prefix "$NPM_PREFIX" --no-audit --no-fund --loglevel=error "${NPM_PACKAGES[@]}" >/dev/null
    fi
fi
say "ready"

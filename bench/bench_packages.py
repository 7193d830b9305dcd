"""`%pip install` through the host beside `pip install` into a local venv, in one run.

    .venv/bin/python bench/bench_packages.py [--rounds 3] [--quick]

Time to importable: from asking for the package until ``import`` of it returns, for a small
pure-Python wheel (tabulate) and a large binary one (scikit-learn 1.8.0: the image has 1.9.1, so
this one is installed into the session; its dependencies are the image's), each

- **cold**: nothing cached (a fresh state directory: the host's pip resolves against the index and
  downloads the wheel), then ``%pip install X`` and ``import X`` in one ``run_python`` over MCP stdio;
- **cached**: a new session of the same bridge (the wheel and its resolution are in the cache);

beside the same in a local venv (with the image's packages already there, so it too installs only
the wheel itself): cold is ``pip install X`` with pip's cache off, from the same index; cached is
``pip install --no-index --find-links DIR X`` of the same wheel file; both followed by
``python -c "import X"``. The sandbox's times include the MCP round trip. Medians of the rounds,
and their ratios. ``--quick`` runs one round of the small package (a check that it works).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters

PACKAGES = {"tabulate": ("tabulate", "tabulate"), "scikit-learn==1.8.0": ("sklearn", "scikit-learn")}
"""requirement -> (module to import, project name)."""
IMAGE_DEPENDENCIES = ["numpy==2.4.6", "scipy==1.17.1", "joblib", "threadpoolctl"]
"""What the image has that scikit-learn needs (the local venv gets them first, untimed)."""


def kernelbridge_env(state: Path) -> dict[str, str]:
    # A throwaway state directory: sessions end with the bridge (none is left running detached).
    env = {"KERNELBRIDGE_STATE_DIR": str(state), "KERNELBRIDGE_WARM_POOL": "1", "KERNELBRIDGE_DURABLE": "0"}
    env.update({k: v for k, v in os.environ.items() if k.startswith("PIP_") or k in ("PATH", "HOME")})
    return env


async def sandbox_times(requirement: str, rounds: int) -> tuple[list[float], list[float]]:
    """(cold, cached) seconds per round, each cold round on a fresh state directory."""
    module, _ = PACKAGES[requirement]
    cold: list[float] = []
    cached: list[float] = []
    code = f"%pip install -q '{requirement}'\nimport {module}\nprint({module}.__file__)"
    for index in range(rounds):
        with tempfile.TemporaryDirectory(prefix="kb-bench-pkg-") as tmp:
            params = StdioServerParameters(
                command=str(Path(sys.executable).with_name("kernelbridge")),
                args=["serve"],
                env=kernelbridge_env(Path(tmp) / "state"),
            )
            async with Client(params, read_timeout_seconds=600) as client:
                for session in ("warm-up", "cold", "cached"):
                    if session == "warm-up":  # the sessions' sandboxes start outside the timing
                        await client.call_tool("run_python", {"code": "1", "session": "cold"})
                        await client.call_tool("run_python", {"code": "1", "session": "cached"})
                        continue
                    began = time.perf_counter()
                    result = await client.call_tool(
                        "run_python", {"code": code, "session": session, "timeout": 300}
                    )
                    elapsed = time.perf_counter() - began
                    text = (result.structured_content or {}).get("stdout", "")
                    assert "/packages/site/" in text, result.content
                    (cold if session == "cold" else cached).append(elapsed)
        print(
            f"  {requirement} round {index + 1}: cold {cold[-1]:.2f} s, cached {cached[-1]:.2f} s", flush=True
        )
    return cold, cached


def local_times(requirement: str, rounds: int) -> tuple[list[float], list[float]]:
    """(cold, cached) seconds for the same wheel into a local venv of this machine's Python."""
    module, project = PACKAGES[requirement]
    cold: list[float] = []
    cached: list[float] = []
    with tempfile.TemporaryDirectory(prefix="kb-bench-venv-") as tmp:
        wheels = Path(tmp) / "wheels"
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(wheels), requirement],
            check=True,
            env={**os.environ, "PIP_CONSTRAINT": ""},
        )
        for index in range(rounds):
            for kind in ("cold", "cached"):
                venv = Path(tmp) / f"venv-{index}-{kind}"
                subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
                pip = [
                    str(venv / "bin" / "python"),
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                ]
                env = {**os.environ, "PIP_CONSTRAINT": ""}
                if project == "scikit-learn":
                    subprocess.run([*pip, *IMAGE_DEPENDENCIES], check=True, env=env)  # the image's, untimed
                began = time.perf_counter()
                if kind == "cold":
                    subprocess.run([*pip, "--no-cache-dir", "--no-deps", requirement], check=True, env=env)
                else:
                    source = ["--no-index", "--find-links", str(wheels), "--no-deps", requirement]
                    subprocess.run([*pip, *source], check=True, env=env)
                subprocess.run([str(venv / "bin" / "python"), "-c", f"import {module}"], check=True)
                (cold if kind == "cold" else cached).append(time.perf_counter() - began)
                shutil.rmtree(venv)
    return cold, cached


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one round of the small package")
    args = parser.parse_args()
    requirements = ["tabulate"] if args.quick else list(PACKAGES)
    rounds = 1 if args.quick else args.rounds
    rows = []
    for requirement in requirements:
        sandbox_cold, sandbox_cached = anyio.run(sandbox_times, requirement, rounds)
        venv_cold, venv_cached = local_times(requirement, rounds)
        for kind, ours, local in (("cold", sandbox_cold, venv_cold), ("cached", sandbox_cached, venv_cached)):
            a, b = statistics.median(ours), statistics.median(local)
            rows.append((requirement, kind, a, b))
    header = [
        "time to importable, median",
        "`%pip install` in the sandbox",
        "`pip install` into a local venv",
    ]
    print("| " + " | ".join([*header, "ratio"]) + " |")
    print("|---|---|---|---|")
    for requirement, kind, ours, local in rows:
        print(f"| `{requirement}`, {kind} | {ours:.2f} s | {local:.2f} s | {ours / local:.2f}x |")
    print(json.dumps({"rounds": rounds, "rows": rows}))


if __name__ == "__main__":
    main()

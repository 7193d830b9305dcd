"""Third-party notebooks (``tests/corpus``: nbclient's and nbconvert's own test notebooks) run
through the ``kernelbridge`` kernelspec by nbclient give the outputs a local kernel gives, and
``kernelbridge replay`` of what the sandbox made says ``same`` for every cell.

Real parts: nbclient with the installed kernelspec (the provisioner, its tunnel process, a real
sandbox, started as ``jupyter nbconvert --execute`` starts one) against nbclient with the venv's
``python3`` kernel (the same ipykernel and IPython as the sandbox's, checked), each notebook in a
copy of its own directory (which the kernelspec mounts read-only on the sandbox's /workspace) and in
a fresh kernel: a kernel per notebook locally; in the sandboxes, a sandbox per chain of notebooks of
one directory, restarted in place for each next one (:func:`execute_in_sandboxes`: the notebooks
need a fresh kernel, which execution counts check, not a sandbox each); then ``replay_notebook``
(what ``kernelbridge replay`` runs) in a fresh sandbox each.

Volatile values are masked the way replay's judge masks them (addresses, times, ids), and paths of
installed packages in tracebacks (``.venv/.../site-packages`` here, ``/usr/local/.../dist-packages``
in the sandbox). What a sandbox must differ in is named below, notebook by notebook (:data:`DIFFERS`):
nothing else may differ.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import shutil
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import nbformat
import pytest
from local_kernel import local_notebook_client
from nbclient import NotebookClient

from kernelbridge.config import load_settings
from kernelbridge.jupyter.provisioner import SandboxProvisioner
from kernelbridge.replay import normalize_text, replay_notebook
from kernelbridge.replay.judge import png_size
from kernelbridge.session.text import strip_ansi

T = TypeVar("T")

pytestmark = [pytest.mark.anyio, pytest.mark.podman]

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
NOTEBOOKS = sorted([*CORPUS.glob("nbclient/*.ipynb"), *CORPUS.glob("nbconvert/*.ipynb")])

DIFFERS: dict[str, tuple[int, str, str]] = {
    # notebook: (code cell, what the sandbox shows instead, why it must)
    "Check History in Memory": (
        2,
        "AssertionError",
        "no host directory: the sandbox's input history lives in memory by its own design "
        "(inside/kernel/bounded_history), not in the file nbclient names with --HistoryManager.hist_file",
    ),
}
"""The cells where a sandbox must differ from a local kernel, with why; a notebook not named here
must match cell for cell, and each named cell must differ exactly so (or not at all)."""
REPLAY_DIFFERS: dict[str, tuple[int, str, str]] = {
    "Inline Image": (
        2,
        "FileNotFoundError",
        "kernelbridge replay runs a notebook in a fresh sandbox whose /workspace is its own (empty, "
        "writable: replayed sessions write there), so python.png beside the notebook is not there",
    ),
}
"""The cells where a replay must differ from the sandbox run through the kernelspec, with why."""
_SITE = re.compile(r"""[^\s"'()]*/(?:site|dist)-packages/""")


def coalesced(outputs: Iterable[Any]) -> list[dict[str, Any]]:
    """Consecutive stream outputs of one stream as one (as a notebook shows them, and as nbconvert's
    ``coalesce_streams`` and replay's judge take them): where a kernel cuts a ``print`` into
    messages depends on when its iopub thread flushes, which a busy machine moves."""
    merged: list[dict[str, Any]] = []
    for output in copy.deepcopy(list(outputs)):
        output = dict(output)
        last = merged[-1] if merged else None
        if output.get("output_type") == "stream" and last is not None and last.get("output_type") == "stream":
            if last.get("name") == output.get("name"):
                last["text"] = "".join(last["text"]) + "".join(output["text"])
                continue
        merged.append(output)
    return merged


def masked(outputs: list[Any]) -> list[dict[str, Any]]:
    """Outputs without what varies between two runs of the same code (see the module docstring)."""
    kept = []
    for output in coalesced(outputs):
        output = dict(output)
        if output.get("output_type") == "error":
            output["traceback"] = [
                # Site first: a checkout under /tmp has its venv's site-packages there too.
                normalize_text(_SITE.sub("<site>/", strip_ansi(line)))
                for line in output["traceback"]
            ]
            output["evalue"] = normalize_text(output["evalue"])
        elif output.get("output_type") == "stream":
            output["text"] = normalize_text(output["text"])
        elif "data" in output:
            output["data"] = {
                mime: png_size(value) if mime == "image/png" else normalize_text(str(value))
                for mime, value in output["data"].items()
            }
        kept.append(output)
    return kept


AT_ONCE = 4
"""Notebooks run (or replayed) at a time: each waits mostly on its kernel's start, as a user's
``jupyter nbconvert --execute`` of several notebooks in parallel would."""


async def at_once(work: Callable[[T], Awaitable[None]], items: Iterable[T]) -> None:
    """``work`` of each item, :data:`AT_ONCE` at a time."""
    limit = anyio.CapacityLimiter(AT_ONCE)

    async def limited(item: T) -> None:
        async with limit:
            await work(item)

    async with anyio.create_task_group() as tg:
        for item in items:
            tg.start_soon(limited, item)


def blank(path: Path) -> nbformat.NotebookNode:
    """The notebook at ``path`` without its outputs and execution counts."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nb


async def execute_locally(workdir: Path) -> dict[str, nbformat.NotebookNode]:
    """Every notebook of the corpus executed by nbclient as its users run it (a local ``python3``
    kernel per notebook, started and shut down by nbclient), each in its own directory (a copy, as
    nbclient's ``path``; no corpus notebook writes a file), :data:`AT_ONCE` at a time."""
    done: dict[str, nbformat.NotebookNode] = {}

    async def execute(path: Path) -> None:
        nb = blank(path)
        client = local_notebook_client(nb, workdir, timeout=60, allow_errors=True)
        await client.async_execute(cwd=str(workdir / path.parent.name))
        done[path.stem] = nb

    await at_once(execute, NOTEBOOKS)
    return done


def chains() -> list[list[Path]]:
    """The corpus as at most :data:`AT_ONCE` chains, each of notebooks of one directory (a chain
    runs in one sandbox): a chain a directory, the largest one's notebooks dealt over those left."""
    folders: dict[Path, list[Path]] = {}
    for path in NOTEBOOKS:
        folders.setdefault(path.parent, []).append(path)
    largest = max(folders, key=lambda folder: len(folders[folder]))
    found = []
    for folder, paths in folders.items():
        ways = max(1, AT_ONCE - len(folders) + 1) if folder == largest else 1
        found += [paths[start::ways] for start in range(min(ways, len(paths)))]
    return found


async def execute_in_sandboxes(workdir: Path) -> dict[str, nbformat.NotebookNode]:
    """Every notebook of the corpus executed by nbclient through the ``kernelbridge`` kernelspec
    (:data:`AT_ONCE` chains at a time, :func:`chains`), each in a fresh kernel. The first notebook
    of a chain starts its kernel as ``jupyter nbconvert --execute`` does (nbclient: the provisioner,
    its tunnel process, a fresh sandbox with the notebook's directory on /workspace); each next one
    runs in a fresh kernel of that sandbox (restarted in place, as a kernelbridge kernel restarts:
    a new kernel process, execution counts from 1); nbclient shuts the sandbox down after the last."""
    done: dict[str, nbformat.NotebookNode] = {}

    async def chain(paths: list[Path]) -> None:
        client: NotebookClient | None = None
        try:
            for path in paths:
                nb = blank(path)
                last = path == paths[-1]
                if client is None:
                    client = NotebookClient(nb, timeout=60, allow_errors=True, kernel_name="kernelbridge")
                else:
                    km = client.km
                    assert km is not None and isinstance(km.provisioner, SandboxProvisioner), km
                    assert await km.provisioner.restart_in_place(), km.provisioner.death_reason()
                    client = NotebookClient(nb, km=km, timeout=60, allow_errors=True)
                # nbclient ends the kernel it started after the chain's last notebook only.
                await client.async_execute(cwd=str(workdir / path.parent.name), cleanup_kc=last)
                if not last:
                    assert client.kc is not None
                    client.kc.stop_channels()
                done[path.stem] = nb
        except BaseException:
            if client is not None and client.km is not None:  # the sandbox nbclient left running
                with anyio.CancelScope(shield=True):
                    if await client.km.is_alive():
                        await client.km.shutdown_kernel(now=True)
            raise

    await at_once(chain, chains())
    return done


async def replay_all(notebooks: dict[str, nbformat.NotebookNode], folder: Path) -> dict[str, Any]:
    """``replay_notebook`` (what ``kernelbridge replay`` runs) of each notebook, a fresh sandbox
    each, :data:`AT_ONCE` at a time: name -> its report."""
    settings = load_settings()
    reports: dict[str, Any] = {}

    async def replay(name: str) -> None:
        path = folder / f"{name}.ipynb"
        nbformat.write(notebooks[name], path)
        with anyio.fail_after(120):
            reports[name] = await replay_notebook(settings, path)

    await at_once(replay, notebooks)
    return reports


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    for folder in ("nbclient", "nbconvert"):
        shutil.copytree(CORPUS / folder, root / folder)
    return root


async def test_the_corpus_runs_in_a_sandbox_as_on_a_local_kernel_and_replays_the_same(
    jupyter_env: dict[str, str], workdir: Path, tmp_path: Path
) -> None:
    with anyio.fail_after(600):
        local = await execute_locally(workdir)
        sandboxed = await execute_in_sandboxes(workdir)
    seen_differences: set[str] = set()
    for name, nb in sandboxed.items():
        code = [cell for cell in nb.cells if cell.cell_type == "code"]
        reference = [cell for cell in local[name].cells if cell.cell_type == "code"]
        for index, (cell, want) in enumerate(zip(code, reference, strict=True), 1):
            if name in DIFFERS and DIFFERS[name][0] == index and masked(cell.outputs) != masked(want.outputs):
                errors = {o["ename"] for o in cell.outputs if o["output_type"] == "error"}
                assert errors == {DIFFERS[name][1]}, (name, index, errors)
                seen_differences.add(name)
                continue
            assert masked(cell.outputs) == masked(want.outputs), f"{name}, cell {index}"
            assert cell.execution_count == want.execution_count, f"{name}, cell {index}"
    assert seen_differences <= set(DIFFERS)

    # What the sandbox made, replayed in a fresh sandbox (an empty, writable /workspace: a replayed
    # session writes there): every cell the same, but what a replay must differ in.
    for name, report in (await replay_all(sandboxed, tmp_path)).items():
        if name in REPLAY_DIFFERS:
            index, ename, _why = REPLAY_DIFFERS[name]
            verdict = report.cells[index - 1]
            assert verdict.verdict == "error" and ename in verdict.why, report.text()
            report.cells[index - 1] = dataclasses.replace(verdict, verdict="same")
        verdicts = {cell.verdict for cell in report.cells} - {"skipped"}  # skipped: empty cells only
        assert verdicts <= {"same"}, f"{name}: {report.text()}"
        assert all(c.why == "empty cell" for c in report.cells if c.verdict == "skipped"), report.text()


def test_the_corpus_keeps_its_licences() -> None:
    assert NOTEBOOKS and (CORPUS / "LICENSE-nbclient").is_file() and (CORPUS / "LICENSE-nbconvert").is_file()
    assert "BSD 3-Clause" in (CORPUS / "LICENSE-nbclient").read_text()
    for path in NOTEBOOKS:
        nbformat.read(path, as_version=4)

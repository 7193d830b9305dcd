"""Every generation kept, listed, named (``NAME@N``) and pruned only when asked: the CLI over a
state directory of several generations, namespaces and a journal from before generations."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernelbridge.errors import SessionError
from kernelbridge.session.generations import (
    history_bytes,
    history_over_budget,
    journal_of,
    list_generations,
    parse_ref,
    prune,
)
from kernelbridge.session.store import SessionStore

KERNELBRIDGE = Path(sys.executable).with_name("kernelbridge")
CELL = (
    '{"type": "cell", "code": "print(%d)", '
    '"outputs": [{"output_type": "stream", "name": "stdout", "text": "%d\\n"}]}'
)


def generation(store: SessionStore, name: str, n: int, *, live: bool = False) -> None:
    record = store.begin(name)
    store.journal_path(record).write_text(
        json.dumps({"type": "session", "session": name, "generation": record.generation})
        + "\n"
        + CELL % (n, n)
        + "\n"
    )
    if not live:
        store.end(record)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    store = SessionStore(tmp_path)
    store.open()
    (store.sessions_dir / "default.journal.jsonl").write_text(CELL % (0, 0) + "\n")  # before generations
    for n in (1, 2, 3):
        generation(store, "default", n)
        time.sleep(0.01)
    generation(store, "default", 4, live=True)  # this process's: live
    tenant = SessionStore.of_namespace(tmp_path, "alice")
    tenant.open()
    generation(tenant, "default", 5)
    return tmp_path


def test_names_and_generations() -> None:
    assert parse_ref("default") == ("default", None) and parse_ref("a.b-c@12") == ("a.b-c", 12)
    for bad in ("default@", "default@x", "default@01", "../etc@1", "a@1@2", "@3"):
        with pytest.raises(SessionError):
            parse_ref(bad)


def test_every_generation_is_listed_and_exportable_by_number(state: Path) -> None:
    listed = list_generations(state)
    assert [g.name for g in listed] == [
        "default@0", "default@1", "default@2", "default@3", "default@4", "alice/default@1"
    ]  # fmt: skip
    assert [g.state for g in listed] == ["ended", "ended", "ended", "ended", "attached", "ended"]
    assert [g.current for g in listed] == [False, False, False, False, True, True]
    store = SessionStore(state)
    assert journal_of(store, "default") == journal_of(store, "default@4")
    assert journal_of(store, "default@0") == state / "sessions" / "default.journal.jsonl"
    with pytest.raises(SessionError, match=r"no generation 9 with a journal \(it has 0, 1, 2, 3, 4\)"):
        journal_of(store, "default@9")
    # Another namespace's generations are not this one's to name.
    with pytest.raises(SessionError):
        journal_of(SessionStore.of_namespace(state, "alice"), "default@2")


def test_pruning_removes_the_oldest_old_ones_to_the_budget_and_never_a_live_one(state: Path) -> None:
    listed = list_generations(state)
    old = history_bytes(listed)
    assert history_over_budget(state, old) is None
    over = history_over_budget(state, 0)
    assert over is not None and "kernelbridge prune" in over and "KERNELBRIDGE_HISTORY_BUDGET" in over
    assert [g.name for g in prune(state, old - 1, dry_run=True)] == ["default@0"]
    assert {g.name for g in list_generations(state)} == {g.name for g in listed}  # a dry run removes nothing
    removed = prune(state, 0, session="default")
    assert [g.name for g in removed] == ["default@0", "default@1", "default@2", "default@3"]
    assert [g.name for g in list_generations(state)] == ["default@4", "alice/default@1"]
    assert [g.name for g in prune(state, 0)] == ["alice/default@1"]
    assert [g.name for g in list_generations(state)] == ["default@4"]  # live: kept whatever the budget


def cli(state: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(KERNELBRIDGE), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "KERNELBRIDGE_STATE_DIR": str(state), **env},
        check=False,
    )


def test_the_cli_lists_exports_and_prunes_generations(state: Path, tmp_path: Path) -> None:
    listing = cli(state, "sessions", "--all", KERNELBRIDGE_HISTORY_BUDGET="1k")
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    assert lines[0].split()[:2] == ["SESSION@GENERATION", "STATE"]
    assert [line.split()[0] for line in lines[1:7]] == [g.name for g in list_generations(state)]
    assert "over KERNELBRIDGE_HISTORY_BUDGET" in lines[-1] and "kernelbridge prune" in lines[-1]
    states = {g.listing()["name"]: g.listing()["state"] for g in list_generations(state)}
    assert states["default@4"] == "attached"

    exported = cli(state, "export", "default@2", "-o", str(tmp_path / "two.ipynb"))
    assert exported.returncode == 0, exported.stderr
    assert '"2\\n"' in (tmp_path / "two.ipynb").read_text()
    live = cli(state, "export", "default", "-o", str(tmp_path / "live.ipynb"))  # this process's
    assert live.returncode == 0 and '"4\\n"' in (tmp_path / "live.ipynb").read_text(), live.stderr
    missing = cli(state, "export", "default@7", "-o", str(tmp_path / "seven.ipynb"))
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1 and "no generation 7" in missing.stderr

    dry = cli(state, "prune", "--budget", "0", "--dry-run")
    assert (
        dry.stdout.splitlines()[0].startswith("would remove default@0") and len(list_generations(state)) == 6
    )
    done = cli(state, "prune", "--budget", "0")
    assert done.returncode == 0 and done.stdout.splitlines()[-1].startswith("removed 5 generation(s)")
    assert [g.name for g in list_generations(state)] == ["default@4"]

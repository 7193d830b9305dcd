"""The session store on disk: generations claimed once each (also by two stores at once), the
current generation, journals of older bridges, records read as untrusted input, and live sessions
over every namespace."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from pids import no_such_pid

from kernelbridge.config import namespace_names
from kernelbridge.errors import SessionError
from kernelbridge.session.store import (
    SessionRecord,
    SessionStore,
    list_session_records,
    live_sessions,
    validate_session_name,
)


def test_each_use_of_a_name_is_a_new_generation_with_its_own_files(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    store.open()
    first = store.begin("default", connection_file="/c/1.json", container="kb-default-1", container_id="abc")
    assert (first.generation, first.namespace, first.owner_pid, first.ended) == (1, "", os.getpid(), None)
    assert store.current("default") == first and first.journal == "1.journal.jsonl"
    (tmp_path / "sessions" / "default" / first.journal).write_text("{}\n")
    ended = store.end(first)
    assert ended.ended is not None and ended.connection_file is None and ended.container == "kb-default-1"
    second = store.begin("default")
    assert second.generation == 2 and store.generations("default") == [1, 2]
    # The current generation is the newest one with a journal: the second has none yet.
    assert store.journal("default") == tmp_path / "sessions" / "default" / "1.journal.jsonl"
    store.journal_path(second).write_text("{}\n")
    assert store.journal("default") == store.journal_path(second)
    assert store.record("default", 1) == ended and store.current("default") == second
    assert (tmp_path / "sessions" / "default" / "1.json").stat().st_mode & 0o777 == 0o600


def test_two_stores_on_one_directory_never_claim_the_same_generation(tmp_path: Path) -> None:
    stores = [SessionStore(tmp_path), SessionStore(tmp_path)]
    claimed: list[int] = []
    start = threading.Barrier(len(stores))

    def claim(store: SessionStore) -> None:
        start.wait()
        claimed.extend(store.begin("shared").generation for _ in range(20))

    threads = [threading.Thread(target=claim, args=(store,)) for store in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(claimed) == list(range(1, 41))


def test_a_journal_of_a_bridge_before_generations_is_generation_0(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    store.open()
    legacy = tmp_path / "sessions" / "old.journal.jsonl"
    legacy.write_text('{"type": "session", "session": "old"}\n')
    assert store.generations("old") == [0] and store.journal("old") == legacy
    assert store.current("old") is None  # it has a journal, not a record
    record = store.begin("old")
    assert record.generation == 1 and legacy.exists()  # never touched
    with pytest.raises(SessionError, match="no journal for session 'never'"):
        store.journal("never")


def test_records_that_do_not_decode_are_skipped(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    good = store.begin("good")
    directory = tmp_path / "sessions"
    for name, text in [("torn", '{"format": 1, "sess'), ("list", "[1]"), ("other", '{"format": 99}'),
                       ("wrong", json.dumps({**good.to_json(), "session": "good"}))]:  # fmt: skip
        (directory / name).mkdir()
        (directory / name / "1.json").write_text(text)
    (directory / "huge").mkdir()
    (directory / "huge" / "1.json").write_text(" " * 100_000)
    (directory / ".hidden").mkdir()
    assert [r.session for r in store.records()] == ["good"]
    assert SessionRecord.decode({**good.to_json(), "generation": "1"}) is None
    assert SessionRecord.decode({**good.to_json(), "session": "../up"}) is None
    assert SessionRecord.decode(good.to_json()) == good


def test_live_sessions_of_every_namespace_leave_out_dead_bridges_and_closed_sessions(tmp_path: Path) -> None:
    shared, alice = SessionStore(tmp_path), SessionStore.of_namespace(tmp_path, "alice")
    live = shared.begin("live", connection_file="/c/live.json", container="kb-live")
    theirs = alice.begin("default", connection_file="/c/alice.json")
    orphan = shared.begin("orphan")
    shared.update(orphan, owner_pid=no_such_pid())
    # A later process given the bridge's pid (pids wrap) is not that bridge.
    shared.update(shared.begin("reused"), owner_pid=os.getppid(), owner_start=0)
    shared.end(shared.begin("closed"))
    (tmp_path / "http" / "not a namespace").mkdir()
    assert namespace_names(tmp_path) == ["", "alice"]
    assert [r.name for r in live_sessions(tmp_path)] == ["live", "alice/default"]
    # What `kernelbridge sessions --json` prints (the same keys as before generations).
    assert list_session_records(tmp_path) == [
        {"name": "live", "connection_file": "/c/live.json", "container": "kb-live",
         "owner_pid": os.getpid(), "created": live.created, "state": "attached"},
        {"name": "alice/default", "connection_file": "/c/alice.json", "container": None,
         "owner_pid": os.getpid(), "created": theirs.created, "namespace": "alice", "state": "attached"},
    ]  # fmt: skip
    assert live_sessions(tmp_path / "missing") == []


def test_session_names_cannot_leave_the_store() -> None:
    for bad in ["", "../x", ".hidden", "a/b", "x" * 65, "sp ace", 3]:
        with pytest.raises(SessionError, match="invalid session name"):
            validate_session_name(bad)
    with pytest.raises(SessionError):
        SessionStore(Path("/nonexistent")).session_dir("../../etc")


def test_one_word_for_where_a_generation_is_in_every_listing(tmp_path: Path) -> None:
    from kernelbridge.session.generations import list_generations
    from kernelbridge.session.records import Standing

    store = SessionStore(tmp_path)
    durable = store.begin("kept", container="kb-1", container_id="c1", label="warm-0a1b2c3d", secret="a" * 64)
    held = store.claim("kept")
    assert held is not None and store.standing(durable) is Standing.ATTACHED
    held.release()  # its bridge let go: the sandbox runs on
    assert store.standing(durable) is Standing.DETACHED
    gone = store.update(store.begin("plain", container="kb-2"), owner_pid=no_such_pid())
    assert store.standing(gone) is Standing.ENDED  # it ended with its bridge
    listed = {r["name"]: r["state"] for r in list_session_records(tmp_path)}
    assert listed == {"kept": "detached"}
    every = {g.name: g.state for g in list_generations(tmp_path)}
    assert every == {"kept@1": "detached", "plain@1": "ended"}
    assert store.standing(store.end(durable)) is Standing.ENDED


def test_a_record_keeps_the_label_its_container_was_made_with(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    record = store.begin("s", container="kb-s", container_id="c1", label="warm-0a1b2c3d")
    assert store.current("s") == record and record.container_label == "warm-0a1b2c3d"
    assert SessionRecord.decode({**record.to_json(), "label": "x" * 300}).container_label == "s"
    assert SessionRecord.decode({**record.to_json(), "label": None}).container_label == "s"

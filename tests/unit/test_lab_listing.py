"""What `kernelbridge lab` lists, read from a real session store on disk: live sessions with a
tunnel as kernels (stable ids, one namespace only), journals as notebooks, the line for a session
that left, and `--token NAME` to its namespace. No jupyter_server: the tier in tests/lab runs it."""

from __future__ import annotations

from pathlib import Path

import pytest
from pids import no_such_pid

from kernelbridge.config import load_settings
from kernelbridge.errors import ConfigError
from kernelbridge.lab.listing import (
    gone_line,
    journalled_sessions,
    lab_namespace,
    live_sessions,
    session_of_notebook,
)
from kernelbridge.session.store import SessionStore


def store_of(root: Path, namespace: str = "") -> SessionStore:
    store = SessionStore.of_namespace(root, namespace)
    store.open()
    return store


def test_a_live_session_is_a_kernel_with_a_stable_id_and_one_that_ends_says_why(tmp_path: Path) -> None:
    store = store_of(tmp_path)
    record = store.begin("watched", connection_file=str(tmp_path / "c1.json"))
    listed = live_sessions(store)
    assert [(s.session, s.generation, s.notebook) for s in listed.values()] == [
        ("watched", 1, "watched.ipynb")
    ]
    assert live_sessions(store).keys() == listed.keys()  # the same id on every refresh
    [live] = listed.values()

    store.end(record)
    assert live_sessions(store) == {}
    line = gone_line(store, live)
    assert line.startswith("kernelbridge lab: session 'watched' was closed; this cell did not run.")
    assert "kernelbridge export watched -o watched.ipynb" in line

    again = store.begin("watched", connection_file=str(tmp_path / "c2.json"))
    [second] = live_sessions(store).values()
    assert second.kernel_id != live.kernel_id and second.generation == again.generation == 2
    assert "a new one of that name" in gone_line(store, live)


def test_a_session_without_a_tunnel_or_bridge_is_not_listed(tmp_path: Path) -> None:
    store = store_of(tmp_path)
    store.begin("no-tunnel")  # no connection file: nothing to connect to
    gone = store.begin("gone", connection_file=str(tmp_path / "c.json"))
    store.update(gone, owner_pid=no_such_pid())  # its bridge exited
    assert live_sessions(store) == {}


def test_a_lab_sees_its_own_namespace_only(tmp_path: Path) -> None:
    own, alice, bob = store_of(tmp_path), store_of(tmp_path, "alice"), store_of(tmp_path, "bob")
    own.begin("mine", connection_file="/c/0.json")
    alice.begin("hers", connection_file="/c/1.json")
    bob.begin("his", connection_file="/c/2.json")
    for store in (own, alice, bob):
        record = store.records()[0]
        (store.session_dir(record.session) / record.journal).write_text("{}\n")
    assert [s.session for s in live_sessions(alice).values()] == ["hers"]
    assert [s.session for s in live_sessions(own).values()] == ["mine"]
    assert journalled_sessions(alice) == ["hers"] and journalled_sessions(own) == ["mine"]


@pytest.mark.parametrize(
    ("path", "session"),
    [
        ("a.ipynb", "a"),
        ("/a.b.ipynb", "a.b"),
        ("x/a.ipynb", None),
        ("../a.ipynb", None),
        ("a.py", None),
        (".ipynb", None),
    ],
)
def test_a_notebook_path_names_a_session_at_the_top_only(path: str, session: str | None) -> None:
    assert session_of_notebook(path) == session


def test_token_names_a_namespace_of_the_bridge(tmp_path: Path) -> None:
    settings = load_settings(
        {
            "KERNELBRIDGE_STATE_DIR": str(tmp_path),
            "KERNELBRIDGE_HTTP_TOKENS": "alice:alice-token-0123456789ab",
        }
    )
    assert lab_namespace(settings, None) == ""
    assert lab_namespace(settings, "alice") == "alice"
    with pytest.raises(
        ConfigError, match=r"no HTTP token named 'bob' \(the tokens and namespaces here: alice\)"
    ):
        lab_namespace(settings, "bob")
    bare = load_settings({"KERNELBRIDGE_STATE_DIR": str(tmp_path / "other")})
    with pytest.raises(ConfigError, match="here: none"):
        lab_namespace(bare, "alice")
    assert not (tmp_path / "other" / "http-token").exists()  # asking made no token

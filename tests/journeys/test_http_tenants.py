"""The README's "Serving over HTTP (to several people)": one ``kernelbridge serve --http`` with two
bearer tokens (``KERNELBRIDGE_HTTP_TOKENS``, the setting this journey is about), each person's
sessions their own, through a restart of the server (SIGTERM, as a service manager stops it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from journey import User, http_clients_of, new_user, warm_pool_ready

pytestmark = [pytest.mark.anyio, pytest.mark.podman, pytest.mark.journey]

TOKENS = {"alice": "a" * 40, "bob": "b" * 40}


@pytest.fixture
def user(tmp_path: Path, sandbox_image: str) -> User:
    return new_user(tmp_path)


async def test_two_people_keep_their_own_sessions_through_a_restart(user: User) -> None:
    async with http_clients_of(user, TOKENS) as people:
        alice, bob = people["alice"], people["bob"]
        await warm_pool_ready(alice)
        assert (await alice.run("who = 'alice'", "default")).status == "ok"
        assert (await bob.run("who = 'bob'", "default")).status == "ok"
        assert (await bob.run("notes = [1, 2]", "scratch")).status == "ok"
        assert sorted(await alice.listed()) == ["default"]
        assert sorted(await bob.listed()) == ["default", "scratch"]
    _, shown, _ = await user.cli("sessions", "--json")
    states = {s["name"]: s["state"] for s in json.loads(shown)}
    assert states == {"alice/default": "detached", "bob/default": "detached", "bob/scratch": "detached"}

    async with http_clients_of(user, TOKENS) as people:
        alice, bob = people["alice"], people["bob"]
        mine = await alice.run("print(who)", "default")
        assert mine.stdout == "alice\n" and "adopted" in mine.codes, mine.text
        theirs = await bob.run("print(who, [1, 2])", "default")
        assert theirs.stdout == "bob [1, 2]\n" and "adopted" in theirs.codes, theirs.text
        # Alice cannot reach Bob's session by its name: hers is a new, empty one.
        fresh = await alice.run("print('notes' in globals())", "scratch")
        assert fresh.stdout == "False\n" and "adopted" not in fresh.codes, fresh.text
        assert (await bob.run("print(notes)", "scratch")).stdout == "[1, 2]\n"
        for person, names in ((alice, ("default", "scratch")), (bob, ("default", "scratch"))):
            for name in names:
                error, said = await person.call("close_session", session=name)
                assert not error, said

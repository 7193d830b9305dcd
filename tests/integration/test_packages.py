"""``%pip install`` through the host: real bridges, real sandboxes (``--network none``), the real
index (PyPI, and this machine's pip configuration).

One module bridge serves the ordinary cases (a session each); bridges of their own show the
policy (``none``, an allow-list), the caps, an index that is down (the cache shared across
sessions and bridges, offline) and a restore that reinstalls from the journal's record. Every bad
input is one line in the cell's output, nothing is installed half-way, and the session's
variables are kept.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from bridge_harness import CLIENT_TIMEOUT, Bridge, open_bridge, serve_params
from mcp.client.client import Client

pytestmark = [pytest.mark.anyio, pytest.mark.podman]

DEAD_INDEX = {
    # No config file of this machine (its mirrors), and an index nobody listens on.
    "PIP_CONFIG_FILE": "/dev/null",
    "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
    "PIP_EXTRA_INDEX_URL": "",
    "PIP_FIND_LINKS": "",
}
STATE_PROBE = "x = 41\n"
KEPT = "print('kept', x + 1)"


@pytest.fixture(scope="module")
async def bridge(tmp_path_factory: pytest.TempPathFactory, sandbox_image: str) -> AsyncIterator[Bridge]:
    state = tmp_path_factory.mktemp("packages") / "state"
    async with open_bridge(state, KERNELBRIDGE_MAX_SESSIONS="16") as opened:
        yield opened


@asynccontextmanager
async def second_bridge(state_dir: Path, **env: str) -> AsyncIterator[Bridge]:
    """Another ``kernelbridge serve`` on a state directory a bridge already uses (its wheel cache
    is shared)."""
    async with Client(serve_params(state_dir, **env), read_timeout_seconds=CLIENT_TIMEOUT) as client:
        yield Bridge(client, state_dir, 0)


def one_line_error(text: str) -> str:
    """The one line a refused ``%pip`` prints (IPython's UsageError: no traceback)."""
    lines = [line for line in text.splitlines() if line.startswith("UsageError: ")]
    assert len(lines) == 1, text
    assert "Traceback" not in text, text
    return lines[0]


async def test_a_pure_python_and_a_binary_wheel_install_and_import_in_the_next_cell(bridge: Bridge) -> None:
    session = "pure-and-binary"
    await bridge.run(STATE_PROBE, session)
    installed = await bridge.run("%pip install tabulate msgpack", session, timeout=120)
    assert installed.status == "ok", installed.text
    assert "Successfully installed" in installed.text and "msgpack-" in installed.text
    verdict = await bridge.probe(
        "import tabulate, msgpack, msgpack._cmsgpack, sys\n"
        "verdict = {'tabulate': tabulate.__file__, 'msgpack': msgpack._cmsgpack.__file__,"
        " 'roundtrip': msgpack.unpackb(msgpack.packb({'a': [1, 2]})),"
        " 'table': tabulate.tabulate([[1, 2]]), 'first': sys.path.index('/packages/site')}",
        session,
    )
    assert verdict["tabulate"].startswith("/packages/site/tabulate/")
    assert verdict["msgpack"].startswith("/packages/site/msgpack/") and verdict["msgpack"].endswith(".so")
    assert verdict["roundtrip"] == {"a": [1, 2]} and "1" in verdict["table"]
    kept = await bridge.run(KEPT, session)
    assert "kept 42" in kept.text, "the install kept the session's variables"
    # A child process sees them too (PYTHONPATH), and %pip list / show say where they are.
    child = await bridge.run("!python3 -c 'import tabulate; print(tabulate.__name__)'", session)
    assert "tabulate" in child.text
    listed = await bridge.run("%pip list", session)
    assert any(
        line.split()[:1] == ["tabulate"] and line.endswith("session") for line in listed.text.splitlines()
    )
    assert any(line.split()[:1] == ["numpy"] and line.endswith("image") for line in listed.text.splitlines())
    shown = await bridge.run("%pip show msgpack", session)
    assert "Location: /packages/site" in shown.text and "Installer: kernelbridge" in shown.text
    again = await bridge.run("%pip install tabulate", session)
    assert "Requirement already satisfied: tabulate" in again.text


async def test_shell_pip_and_requirements_files_go_through_the_host_too(bridge: Bridge) -> None:
    session = "shell-and-file"
    files = {"requirements.txt": "# what the notebook needs\nsix==1.16.0  # pinned\n\nujson\n"}
    placed = await bridge.run("", session, files=files)
    assert not placed.is_error and "Placed in /workspace: requirements.txt" in placed.text
    shell = await bridge.run("!pip install --quiet six==1.16.0", session)
    assert shell.status == "ok", shell.text
    from_file = await bridge.run("%pip install -r requirements.txt", session, timeout=120)
    assert from_file.status == "ok", from_file.text
    verdict = await bridge.probe("import six, ujson\nverdict = [six.__version__, ujson.__file__]", session)
    assert verdict[0] == "1.16.0" and verdict[1].startswith("/packages/site/")
    bad = await bridge.run(
        "open('bad.txt', 'w').write('six\\n--index-url http://evil.example/simple\\n')", session
    )
    assert bad.status == "ok"
    refused = await bridge.run("%pip install -r bad.txt", session)
    assert "bad.txt, line 2" in one_line_error(refused.text) and "option" in refused.text


async def test_no_second_numpy_unless_asked(bridge: Bridge) -> None:
    session = "numpy"
    # numpy-financial needs numpy, which the image has at a fitting version: it stays the image's.
    plain = await bridge.run("%pip install numpy-financial", session, timeout=120)
    assert plain.status == "ok", plain.text
    assert "numpy_financial-" in plain.text or "numpy-financial-" in plain.text, plain.text
    # An upgrade of what the image has at its newest version installs nothing.
    same = await bridge.run("%pip install -U seaborn", session, timeout=120)
    assert same.status == "ok" and "Requirement already satisfied: seaborn" in same.text, same.text
    verdict = await bridge.probe(
        "import os, numpy\nverdict = [numpy.__file__, sorted(os.listdir('/packages/site'))]", session
    )
    assert verdict[0].startswith("/usr/local/lib/python3.11/dist-packages/numpy")
    assert not any(name.startswith("numpy-") or name == "numpy" for name in verdict[1]), verdict[1]
    assert "numpy_financial" in verdict[1]


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("%pip install kb-no-such-package-4b2e", "no package kb-no-such-package-4b2e on the host's index"),
        ("%pip install docopt", "docopt has no binary wheel for the sandbox"),
        ("%pip install 'requests==2.20.0' 'idna==3.4'",
         "version conflict: you asked for idna==3.4; requests 2.20.0 depends on idna"),
        ("%pip install 'tabulate==0.0.1'", "no version of tabulate matches tabulate==0.0.1"),
        ("%pip install --index-url http://evil.example/simple six", "that option is not accepted here"),
        ("%pip install -e .", "that option is not accepted here"),
        ("%pip install 'six @ https://evil.example/six.whl'", "names a URL"),
        ("%pip install ./local/pkg", "is a URL or a path: only package requirements"),
        ("%pip install 'six --extra-index-url http://x.example'", "options, URLs, paths and -e are refused"),
        ("runtime.pip_install('--trusted-host=evil.example')", "is an option"),
    ],
)  # fmt: skip
async def test_bad_input_is_one_line_and_installs_nothing(bridge: Bridge, code: str, expected: str) -> None:
    session = "bad-input"
    await bridge.run(STATE_PROBE, session)
    result = await bridge.run(code, session, timeout=120)
    assert result.status == "error", result.text
    if code.startswith("%pip"):
        assert expected in one_line_error(result.text)
    else:
        assert expected in result.text
    if "docopt" in code:
        assert "kernelbridge image build --with docopt" in result.text
    after = await bridge.probe(
        "import os, importlib\nimportlib.invalidate_caches()\n"
        "verdict = [x, sorted(n for n in os.listdir('/packages/site') if not n.startswith('.'))]",
        session,
    )
    assert after[0] == 41, "the session's variables are kept"
    assert after[1] == [], f"nothing is installed after {code!r}: {after[1]}"


async def test_a_failure_half_way_through_an_install_leaves_nothing_of_it(bridge: Bridge) -> None:
    session = "half-way"
    # A file where one of requests' dependencies goes: the move of that wheel fails, and every
    # wheel of the install already moved is taken back out.
    await bridge.run(STATE_PROBE + "open('/packages/site/idna', 'w').write('in the way')", session)
    result = await bridge.run("%pip install requests", session, timeout=120)
    assert "idna is already installed by another package" in one_line_error(result.text)
    verdict = await bridge.probe(
        "import os, importlib.util\nimportlib.invalidate_caches()\n"
        "verdict = [x, sorted(os.listdir('/packages/site')), importlib.util.find_spec('requests') is None]",
        session,
    )
    assert verdict == [41, ["idna"], True]


async def test_cache_reuse_across_sessions_and_bridges_offline(bridge: Bridge) -> None:
    first = await bridge.run("%pip install tabulate", "cache-a", timeout=120)
    assert first.status == "ok", first.text
    second = await bridge.run("%pip install tabulate", "cache-b")
    assert second.status == "ok", second.text
    assert first.data["packages"][0]["source"] == "index"
    assert second.data["packages"] == [
        {
            "requirements": ["tabulate"],
            "installed": first.data["packages"][0]["installed"],
            "ok": True,
            "source": "cache",
        }
    ]
    wheels = list((bridge.state_dir / "packages" / "wheels").glob("*.whl"))
    assert any(len(w.stem) == 64 for w in wheels), "content-addressed by sha256"
    # Another bridge on the same state directory, whose index is down: the cached wheel still
    # installs, and a package it never saw says the index cannot be reached.
    async with second_bridge(bridge.state_dir, **DEAD_INDEX) as offline:
        cached = await offline.run(
            "%pip install tabulate\nimport tabulate\nprint(tabulate.__name__)", "offline"
        )
        assert cached.status == "ok" and "tabulate" in cached.text, cached.text
        assert cached.data["packages"][0]["source"] == "cache"
        down = await offline.run(STATE_PROBE + "%pip install toolz", "offline-down", timeout=120)
        assert "the host's package index could not be reached" in one_line_error(down.text)
        kept = await offline.run(KEPT, "offline-down")
        assert "kept 42" in kept.text


async def test_the_policy_none_and_an_allow_list(tmp_path: Path, sandbox_image: str) -> None:
    async with open_bridge(tmp_path / "none", KERNELBRIDGE_PACKAGES="none") as off:
        refused = await off.run("%pip install six", "s")
        assert "KERNELBRIDGE_PACKAGES=none" in one_line_error(refused.text)
        capabilities = (await off.client.read_resource("kernelbridge://capabilities")).contents[0].text
        assert "Installing more packages is turned off on this host" in capabilities
    async with open_bridge(tmp_path / "allowed", KERNELBRIDGE_PACKAGES="tabulate") as allowed:
        ok = await allowed.run("%pip install tabulate", "s", timeout=120)
        assert ok.status == "ok", ok.text
        other = await allowed.run("%pip install six", "s")
        assert "six is not allowed on this host (KERNELBRIDGE_PACKAGES allows tabulate)" in one_line_error(
            other.text
        )


async def test_the_caps_on_bytes_and_installs(tmp_path: Path, sandbox_image: str) -> None:
    # Three installs: the refused one counts too (it cost the host a resolution and a download).
    env = {"KERNELBRIDGE_PACKAGES_MAX_BYTES": "2m", "KERNELBRIDGE_PACKAGES_MAX_INSTALLS": "3"}
    async with open_bridge(tmp_path / "caps", **env) as capped:
        await capped.run(STATE_PROBE, "s")
        # networkx is a pure-Python wheel of about 2 MB that unpacks to about 8 MB.
        big = await capped.run("%pip install networkx", "s", timeout=120)
        line = one_line_error(big.text)
        assert (
            "networkx" in line
            and "KERNELBRIDGE_PACKAGES_MAX_BYTES" in line
            and "nothing was installed" in line
        )
        for name in ("six", "tabulate"):
            done = await capped.run(f"%pip install {name}", "s", timeout=120)
            assert done.status == "ok", done.text
        third = await capped.run("%pip install ujson", "s")
        assert "KERNELBRIDGE_PACKAGES_MAX_INSTALLS" in one_line_error(third.text)
        kept = await capped.run(KEPT, "s")
        assert "kept 42" in kept.text


async def test_a_restore_reinstalls_the_recorded_wheels(bridge: Bridge) -> None:
    made = await bridge.run(
        "%pip install tabulate==0.9.0\nimport tabulate\ntabulate.__version__", "to-restore", timeout=120
    )
    assert made.status == "ok" and "0.9.0" in made.text, made.text
    notebook = await bridge.notebook("to-restore")
    (cell,) = [c for c in json.loads(notebook)["cells"] if "%pip" in "".join(c["source"])]
    (record,) = cell["metadata"]["kernelbridge"]["packages"]
    assert record["ok"] is True and record["requirements"] == ["tabulate==0.9.0"]
    assert [w["name"] for w in record["installed"]] == ["tabulate"] and len(
        record["installed"][0]["sha256"]
    ) == 64
    restored = await bridge.run(
        "import tabulate\nprint(tabulate.__version__, tabulate.__file__)",
        "restored",
        restore="kernelbridge://sessions/to-restore/notebook",
        timeout=120,
    )
    assert restored.status == "ok", restored.text
    assert "0.9.0 /packages/site/tabulate" in restored.text
    assert "1 same" in restored.text, "the reinstall printed what the original did"
    again = await bridge.notebook("restored")
    (cell,) = [c for c in json.loads(again)["cells"] if "%pip" in "".join(c["source"])]
    (reinstall,) = cell["metadata"]["kernelbridge"]["packages"]
    assert reinstall["source"] == "recorded" and reinstall["installed"] == record["installed"]

"""The package's structure, checked from its source (an AST walk: nothing is imported or run).

- no import cycles between modules, lazy imports (inside functions) included; imports under
  ``if TYPE_CHECKING:`` never run and are left out;
- a module past 800 lines is a warning (is it still one concept?), never a failure;
- nothing outside ``kernelbridge/runtime/`` runs a container CLI (podman, docker) or speaks the
  engine API (its HTTP client, ``runtime.engine``);
- nothing under ``kernelbridge/inside/`` (it runs in the container) imports a host module: only
  the standard library, pyzmq, ipykernel/IPython, ``kernelbridge.frames``, the rest of ``inside``
  and the sandbox's own ``mcp`` package;
- the product never imports ``kernelbridge.testing``;
- the public API (``kernelbridge.__all__``) is pinned;
- no unit test starts a process (those are tests/process's);
- no test asserts how long something took (timing is bench/'s; tests bound their waits against a
  hang: tests/waiting.py).

Every failure names the offending module (and line). The checks are ``structure_checks``' (also
run here on small made-up sources, so that a check that can no longer fail shows); what this
repository allows for now, and its public API, are here.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from structure_checks import (
    ARCHITECTURE,
    LongModule,
    Module,
    architecture_layers,
    container_cli_spawns,
    engine_api_imports,
    host_imports_inside,
    import_cycles,
    imports_of_testing,
    layer_violations,
    long_module_docstrings,
    long_modules,
    made_up,
    package_modules,
    parse,
    process_spawns,
    timing_asserts,
)

import kernelbridge

TEMPORARY_CYCLES: dict[frozenset[str], str] = {}
"""Import cycles allowed for now (the modules of each), and why; a stale entry fails likewise."""

PUBLIC_API = frozenset(
    {
        "DISTRIBUTION",
        "AgentMismatch",
        "ConfigError",
        "EngineRefused",
        "ExitKind",
        "HubError",
        "ImageError",
        "KernelBridgeError",
        "KernelDied",
        "LimitsNotEnforced",
        "NoHostServers",
        "RpcError",
        "RuntimeUnavailable",
        "SandboxError",
        "SandboxFileError",
        "SandboxLimits",
        "SandboxStartFailed",
        "SandboxStartTimeout",
        "ServerFailure",
        "SessionError",
        "Settings",
        "SkillError",
        "__version__",
        "load_settings",
    }
)


@pytest.fixture(scope="module")
def modules() -> list[Module]:
    return package_modules()


# -- the package --------------------------------------------------------------------------------------------
def test_the_walk_sees_the_whole_package(modules: list[Module]) -> None:
    names = {m.name for m in modules}
    for expected in (
        "kernelbridge",
        "kernelbridge.cli.main",
        "kernelbridge.inside.agent.relay",
        "mcp._transport",
    ):
        assert expected in names
    relay = next(m for m in modules if m.name == "kernelbridge.inside.agent.relay")
    assert any(imp.target == "kernelbridge.frames" for imp in relay.imports)


def test_no_import_cycles(modules: list[Module]) -> None:
    cycles = import_cycles(modules, TEMPORARY_CYCLES)
    assert not cycles, "\n".join(cycles)


@pytest.mark.filterwarnings("default::structure_checks.LongModule")  # shown, never an error
def test_long_modules_are_pointed_out(modules: list[Module]) -> None:
    for line in long_modules(modules):
        warnings.warn(line, LongModule, stacklevel=1)


def test_module_docstrings_are_a_few_lines(modules: list[Module]) -> None:
    found = long_module_docstrings(modules)
    assert not found, "\n".join(found)


def test_a_long_module_docstring_is_found() -> None:
    def module(name: str, lines: int) -> Module:
        docstring = "\n".join(["One line."] * lines)
        return parse(name, f'"""{docstring}"""\n', path=name.replace(".", "/") + ".py")

    assert long_module_docstrings([module("kernelbridge.wordy", 13)], {}) == [
        "kernelbridge/wordy.py: a module docstring of 13 lines (> 12)"
    ]
    kept = {"kernelbridge.tree": "why"}
    assert (
        long_module_docstrings([module("kernelbridge.brief", 12), module("kernelbridge.tree", 30)], kept)
        == []
    )
    assert long_module_docstrings([module("kernelbridge.tree", 3)], kept) == [
        "kernelbridge.tree is kept long but is not: drop it from the list"
    ]


def test_only_the_runtime_runs_a_container_cli(modules: list[Module]) -> None:
    found = container_cli_spawns(modules)
    assert not found, "\n".join(found)


def test_only_the_runtime_speaks_the_engine_api(modules: list[Module]) -> None:
    found = engine_api_imports(modules)
    assert not found, "\n".join(found)


def test_inside_imports_no_host_module(modules: list[Module]) -> None:
    found = host_imports_inside(modules)
    assert not found, "\n".join(found)


def test_the_product_never_imports_testing(modules: list[Module]) -> None:
    found = imports_of_testing(modules)
    assert not found, "\n".join(found)


def test_public_api_is_pinned() -> None:
    assert len(kernelbridge.__all__) == len(set(kernelbridge.__all__))
    assert set(kernelbridge.__all__) == PUBLIC_API, (
        f"added: {sorted(set(kernelbridge.__all__) - PUBLIC_API)}, "
        f"removed: {sorted(PUBLIC_API - set(kernelbridge.__all__))} (change PUBLIC_API on purpose)"
    )
    public = {
        name
        for name, value in vars(kernelbridge).items()
        if not name.startswith("_") and not isinstance(value, type(kernelbridge))  # submodules
    }
    assert public == PUBLIC_API - {"__version__"}, f"public names outside __all__: {public - PUBLIC_API}"


def test_public_errors_are_named_where_they_are_imported_from() -> None:
    for name in sorted(PUBLIC_API):
        value = getattr(kernelbridge, name)
        if isinstance(value, type) and issubclass(value, BaseException | kernelbridge.ExitKind):
            assert value.__module__ == "kernelbridge", name
            assert f"{value.__module__}.{value.__qualname__}" == f"kernelbridge.{name}"


def test_a_lazy_import_cycle_is_found() -> None:
    found = import_cycles(
        made_up(
            {
                "kernelbridge.a": "from kernelbridge import b\n",
                "kernelbridge.b": "def f():\n    from kernelbridge.c import g\n",
                "kernelbridge.c": "import kernelbridge.a\n",
            }
        )
    )
    assert found == [
        "import cycle: kernelbridge.a (line 1) -> kernelbridge.b; "
        "kernelbridge.b (line 2 (lazy)) -> kernelbridge.c; kernelbridge.c (line 1) -> kernelbridge.a"
    ]


def test_a_type_checking_cycle_is_a_cycle() -> None:
    sources = {
        "kernelbridge.a": "import typing\nif typing.TYPE_CHECKING:\n    from kernelbridge.b import B\n",
        "kernelbridge.b": "from kernelbridge.a import A\n",
    }
    (found,) = import_cycles(made_up(sources))
    assert "kernelbridge.a (line 3) -> kernelbridge.b" in found, found


def test_the_code_keeps_the_layers_of_the_architecture(modules: list[Module]) -> None:
    layers = architecture_layers(ARCHITECTURE.read_text(encoding="utf-8"))
    names = [layer.name for layer in layers]
    assert names[0] == "cli" and names[-1] == "frames" and len(names) > 10, names  # the table was read
    found = layer_violations(modules, layers)
    assert not found, "\n".join(found)


def test_an_import_of_a_layer_above_and_a_module_in_no_layer_are_found() -> None:
    table = (
        "| layer | module(s) | owns | does not know |\n|---|---|---|---|\n"
        "| top | `kernelbridge/top/` | x | y |\n| low | `kernelbridge/low.py` | x | y |\n\nafter\n"
    )
    modules = made_up(
        {
            "kernelbridge.top.a": "import kernelbridge.low\n",
            "kernelbridge.low": "import kernelbridge.top.a\n",
            "kernelbridge.stray": "",
        }
    )
    for module in modules:
        module.path = module.name.replace(".", "/") + ".py"
    found = layer_violations(modules, architecture_layers(table))
    assert found == [
        "kernelbridge/low.py (low) imports kernelbridge.top.a (top, a layer above it) at line 1",
        "kernelbridge/stray.py is in no layer of docs/architecture.md",
    ], found


def test_an_allowed_cycle_is_allowed_until_it_is_gone() -> None:
    sources = {"kernelbridge.a": "import kernelbridge.b\n", "kernelbridge.b": "import kernelbridge.a\n"}
    allowed = {frozenset({"kernelbridge.a", "kernelbridge.b"}): "why"}
    assert import_cycles(made_up(sources), allowed) == []
    (stale,) = import_cycles(made_up({"kernelbridge.a": "", "kernelbridge.b": ""}), allowed)
    assert stale.startswith("the cycle of ['kernelbridge.a', 'kernelbridge.b'] is allowed")


def test_relative_imports_resolve() -> None:
    found = import_cycles(
        made_up(
            {"mcp": "from . import runtime\n", "mcp.runtime": "from . import _t\n", "mcp._t": "import mcp\n"},
            packages=("mcp",),
        )
    )
    assert len(found) == 1 and "mcp._t (line 1) -> mcp" in found[0]


def test_a_long_module_is_found() -> None:
    modules = [parse("kernelbridge.big", "x = 1\n" * 801, path="kernelbridge/big.py")]
    assert long_modules(modules) == ["kernelbridge/big.py has 801 lines (> 800): is it still one concept?"]
    assert long_modules([parse("kernelbridge.small", "x = 1\n" * 800, path="kernelbridge/small.py")]) == []


@pytest.mark.parametrize(
    "source",
    [
        "import subprocess\nsubprocess.run(['podman', 'ps'])\n",
        "ARGV = ('/usr/bin/docker', 'rm', '-f')\n",
        "def argv(args):\n    return ['podman', *args]\n",
        "import os\nos.system('podman rm -f x')\n",
        "import anyio\nasync def f():\n    await anyio.run_process(['docker', 'info'])\n",
    ],
)
def test_a_container_cli_outside_the_runtime_is_found(source: str) -> None:
    assert container_cli_spawns(made_up({"kernelbridge.host.x": source}))
    assert not container_cli_spawns(made_up({"kernelbridge.runtime.cli.x": source}))


def test_setup_may_look_for_podman() -> None:
    source = (
        "import shutil\nNEEDED = {'podman': 'podman'}\nok = shutil.which('podman')\n"
        "RUNTIMES = ('podman', 'docker', 'podman-api')\n"
    )
    assert not container_cli_spawns(made_up({"kernelbridge.cli.setup": source}))


def test_the_engine_api_outside_the_runtime_is_found() -> None:
    sources = {
        "kernelbridge.runtime.engine.api": "",
        "kernelbridge.host.x": "def f():\n    from kernelbridge.runtime.engine.api import open_engine\n",
        "kernelbridge.image.y": "import httpcore2\n",
    }
    found = engine_api_imports(made_up(sources))
    assert [line.split(" ")[0] for line in found] == ["kernelbridge.host.x:2", "kernelbridge.image.y:1"]


def test_a_host_import_inside_is_found() -> None:
    sources = {
        "kernelbridge.config": "",
        "kernelbridge.frames": "",
        "kernelbridge.inside.agent.x": (
            "import json, zmq\nfrom kernelbridge import frames\nfrom kernelbridge.config import Settings\n"
        ),
        "mcp": "import mcp.runtime\nimport anyio\n",
        "mcp.runtime": "",
    }
    found = host_imports_inside(made_up(sources))
    assert [line.split(": ")[0] for line in found] == [
        "kernelbridge.inside.agent.x:3 imports kernelbridge.config",
        "mcp:2 imports anyio",
    ]


def test_a_product_import_of_testing_is_found() -> None:
    sources = {
        "kernelbridge.testing": "",
        "kernelbridge.server.app": "def f():\n    from kernelbridge.testing import LocalProcessRuntime\n",
        "kernelbridge.testing.images": "import kernelbridge.testing\n",
    }
    assert [line.split(" ")[0] for line in imports_of_testing(made_up(sources))] == [
        "kernelbridge.server.app:2"
    ]


def test_no_two_test_modules_share_a_basename() -> None:
    # tests/ has no __init__.py files: pytest's default import mode imports each test module by its
    # basename, so a second test_x.py in another folder fails collection ("import file mismatch")
    # depending on which one a worker collects first.
    tests = Path(__file__).resolve().parents[1]
    seen: dict[str, list[str]] = {}
    for path in sorted(tests.rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(tests)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


def test_the_unit_tier_starts_no_process() -> None:
    # The unit tier is the fast one (a minute at most): a test that needs a real process, a CLI
    # command or a pipe to a child is a process test (tests/process).
    assert process_spawns(sorted(Path(__file__).parent.glob("*.py"))) == []


def test_a_process_spawn_in_a_test_is_found(tmp_path: Path) -> None:
    for name, source in {
        "a.py": "import subprocess\n",
        "b.py": "import anyio\nasync def f():\n    await anyio.run_process(['true'])\n",
        "c.py": "from subprocess import run\n",
    }.items():
        (tmp_path / name).write_text(source)
    assert process_spawns(sorted(tmp_path.glob("*.py"))) == [
        "a.py:1 imports subprocess",
        "b.py:3 calls anyio.run_process",
        "c.py:1 imports subprocess",
    ]


def test_no_test_asserts_how_long_something_took() -> None:
    # A bound on a duration fails under load (a unit test did, on a busy CI machine): tests assert
    # what happened and guard their waits against a hang; bench/ prints the times.
    tests = Path(__file__).resolve().parents[1]
    paths = sorted(path for path in tests.rglob("*.py") if "__pycache__" not in path.parts)
    assert timing_asserts(paths) == []


def test_an_assert_on_a_duration_is_found(tmp_path: Path) -> None:
    (tmp_path / "test_a.py").write_text(
        "import time\n"
        "def test_direct():\n"
        "    started = time.monotonic()\n"
        "    assert time.monotonic() - started < 5\n"
        "def test_named():\n"
        "    began = time.perf_counter()\n"
        "    took = time.perf_counter() - began\n"
        "    assert took < 5, took\n"
        "async def test_result(bridge):\n"
        "    result = await bridge.run('1')\n"
        "    assert result.status == 'ok' and result.seconds < 5\n"
        "    assert verdict['seconds'] >= 1\n"
        "    assert result['duration_ms'] < 20_000\n"
        "    assert 0 <= result['duration_ms'] < 20_000\n"
        "def test_allowed(clock, deadline, note):\n"
        "    assert time.monotonic() < deadline, 'a wait bounded against a hang'\n"
        "    assert clock.now() - 100.0 == 58.0  # a fake clock\n"
        "    assert note.seconds == 50.0\n"
        "    assert record.updated <= time.time()\n"
        "    assert cell['duration_ms'] >= 0  # a valid field\n"
    )
    assert timing_asserts([tmp_path / "test_a.py"]) == [
        f"test_a.py:{line} asserts how long something took" for line in (4, 8, 11, 12, 13, 14)
    ]

"""Checks of the package's structure from its source: an AST walk, nothing imported or run.

:func:`package_modules` parses every module of ``kernelbridge/`` (the sandbox's ``mcp`` package,
``kernelbridge/inside/pythonpath/mcp``, under its name in the kernel: ``mcp``) with its imports,
lazy ones (inside functions) marked, and those under ``if TYPE_CHECKING:`` marked as never run
(but in a package whose names are imported on first use, ``kernelbridge.lazy``: lazy there).
Each check takes parsed modules and returns one line per offence, naming the module and line:
tests/unit/test_structure.py runs them on the package, and on made-up sources (:func:`made_up`)
to show each can fail.
"""

from __future__ import annotations

import ast
import itertools
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kernelbridge.image.recipe import AGENT_MODULES

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "kernelbridge"
SANDBOX_PATH = PACKAGE / "inside" / "pythonpath"
"""On the kernel's path in the container: its ``mcp`` package is top-level ``mcp`` there."""

LONG_MODULE = 800
"""Past this many lines a module is worth a second look (is it still one concept?): a warning,
never a failure. Size follows the concept; nothing is split for length alone."""
MODULE_DOCSTRING = 12
"""A module docstring states the module's contract or shows its use in a few lines; the design
and its reasons are in docs/ (architecture.md, design/), where one text covers many modules."""
LONG_DOCSTRINGS_KEPT = {
    "kernelbridge.errors": "the error tree, which every layer translates into",
    "mcp": "what help(mcp) shows the agent in the sandbox: its usage",
}
"""Module docstrings kept longer, each for why."""
CONTAINER_CLIS = frozenset({"podman", "docker"})
SPAWNERS = frozenset(
    {
        "subprocess.run",
        "subprocess.Popen",
        "subprocess.call",
        "subprocess.check_call",
        "subprocess.check_output",
        "subprocess.getoutput",
        "subprocess.getstatusoutput",
        "anyio.run_process",
        "anyio.open_process",
        "asyncio.create_subprocess_exec",
        "asyncio.create_subprocess_shell",
        "os.system",
        "os.popen",
    }
)
"""Calls that start a process from a command string (a list argv is caught wherever it is built)."""
ENGINE_API = ("httpcore2", "kernelbridge.runtime.engine")
"""What speaking the engine API takes: its HTTP client, or the engine backend's own modules."""
SANDBOX_THIRD_PARTY = frozenset({"zmq", "ipykernel", "IPython", "installer"})
"""Baked into the image (sandbox_kernel_image/requirements.txt); ``installer`` unpacks the wheels
``%pip install`` brings through the host (kernelbridge/inside/pythonpath/mcp/_packages.py)."""
SANDBOX_KERNELBRIDGE = (
    *(name.removesuffix(".py").replace("/", ".") for name in AGENT_MODULES),  # what the image carries
    "kernelbridge.inside",
    "mcp",
)


# -- the source, parsed ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Import:
    target: str
    """The module named (``from a.b import c``: ``a.b.c`` if that is a module, else ``a.b``)."""
    line: int
    lazy: bool
    """Inside a function: runs when called, not when the module is imported."""
    typing_only: bool
    """Under ``if TYPE_CHECKING:``: never runs."""

    def where(self) -> str:
        return f"line {self.line}{' (lazy)' if self.lazy else ''}"


@dataclass
class Module:
    name: str
    path: str
    """Relative to the repository, for messages."""
    tree: ast.Module
    lines: int
    package: bool
    imports: list[Import] = field(default_factory=list)

    @property
    def sandbox_package(self) -> bool:
        """Part of the sandbox's ``mcp`` package (top-level ``mcp`` in the kernel)."""
        return self.name == "mcp" or self.name.startswith("mcp.")

    @property
    def inside(self) -> bool:
        return self.sandbox_package or _within(self.name, "kernelbridge.inside")


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def module_name(path: Path) -> tuple[str, bool]:
    """The module's import name and whether it is a package, by where it lives."""
    root = SANDBOX_PATH if SANDBOX_PATH in path.parents else REPO
    parts = list(path.relative_to(root).with_suffix("").parts)
    package = parts[-1] == "__init__"
    if package:
        parts.pop()
    return ".".join(parts), package


def parse(name: str, source: str, *, path: str = "", package: bool = False) -> Module:
    return Module(name, path or name, ast.parse(source), len(source.splitlines()), package)


def package_modules() -> list[Module]:
    modules = []
    for directory, subdirs, files in os.walk(PACKAGE):  # links (sandbox_kernel_image) not followed
        subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
        for file in sorted(files):
            if file.endswith(".py"):
                path = Path(directory) / file
                name, package = module_name(path)
                rel = str(path.relative_to(REPO))
                modules.append(parse(name, path.read_text(encoding="utf-8"), path=rel, package=package))
    return resolve_imports(modules)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _raw_imports(tree: ast.AST) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool, bool]]:
    """Every import statement with (lazy, typing_only)."""

    def walk(
        node: ast.AST, lazy: bool, typing_only: bool
    ) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child, lazy, typing_only
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), lazy, True)
                for stmt in child.orelse:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), lazy, typing_only)
            else:
                inner = lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
                yield from walk(child, inner, typing_only)

    yield from walk(tree, False, False)


def _lazy_exports(module: Module) -> bool:
    """A package whose names are imported on first use (``kernelbridge.lazy``): its imports under
    ``if TYPE_CHECKING:`` do run, lazily."""
    return module.package and any(
        isinstance(node, ast.Name) and node.id == "lazy_exports" for node in ast.walk(module.tree)
    )


def resolve_imports(modules: list[Module]) -> list[Module]:
    """Fill each module's ``imports`` with the modules of this set it names. The host's ``mcp`` is
    the MCP SDK; only the sandbox's modules mean the sandbox package by it."""
    known = {m.name for m in modules}
    for module in modules:
        world = known if module.inside else {n for n in known if not _within(n, "mcp")}
        lazy_package = _lazy_exports(module)
        for node, lazy, typing_only in _raw_imports(module.tree):
            if lazy_package and typing_only:
                lazy, typing_only = True, False
            for target in _targets(module, node):
                resolved = _known_prefix(target, world)
                module.imports.append(Import(resolved or target, node.lineno, lazy, typing_only))
    return modules


def _targets(module: Module, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        parts = module.name.split(".")
        keep = len(parts) - node.level + (1 if module.package else 0)
        base = ".".join(parts[:keep] + ([base] if base else []))
    for alias in node.names:
        yield f"{base}.{alias.name}" if base else alias.name  # a submodule, or a name in ``base``


def _known_prefix(target: str, known: set[str]) -> str | None:
    parts = target.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in known:
            return ".".join(parts[:end])
    return None


# -- the checks (each returns its findings, one line per offence) ------------------------------------------
def import_cycles(modules: list[Module], allowed: dict[frozenset[str], str] | None = None) -> list[str]:
    """One line per cycle (a strongly connected component of the import graph, TYPE_CHECKING
    imports included: they never run, but a circle of types is a circle of concepts), with the
    import that makes each step; and one per ``allowed`` cycle that is gone."""
    allowed = allowed or {}
    by_name = {m.name: m for m in modules}
    edges: dict[str, dict[str, Import]] = {m.name: {} for m in modules}
    for module in modules:
        for imp in module.imports:
            if imp.target in by_name and imp.target != module.name:
                edges[module.name].setdefault(imp.target, imp)
    found = []
    components = _components(edges)
    for members, why in allowed.items():
        if set(members) not in [set(c) for c in components]:
            found.append(f"the cycle of {sorted(members)} is allowed ({why}) but gone: remove it")
    for component in components:
        if frozenset(component) in allowed:
            continue
        cycle = _cycle_in(component, edges)
        steps = [f"{a} ({edges[a][b].where()}) -> {b}" for a, b in itertools.pairwise(cycle)]
        found.append(f"import cycle: {'; '.join(steps)}")
    return found


def _components(edges: dict[str, dict[str, Import]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    result = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    result.append(sorted(component))
    return result


def _cycle_in(component: list[str], edges: dict[str, dict[str, Import]]) -> list[str]:
    """A cycle through the component's first module, as a path that ends where it starts."""
    members, start = set(component), component[0]
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for child in sorted(edges[node]):
            if child == start:
                return [*paths[node], start]
            if child in members and child not in paths:
                paths[child] = [*paths[node], child]
                queue.append(child)
    raise AssertionError(f"no cycle in the component {component}")


ARCHITECTURE = REPO / "docs" / "architecture.md"
"""Its first table lists the layers top to bottom, each with the modules it holds."""


@dataclass(frozen=True)
class Layer:
    name: str
    paths: tuple[str, ...]
    """Repository paths: a directory (ending in ``/``) holds everything below it."""

    def holds(self, path: str) -> int:
        """How specifically it holds ``path`` (the matching path's length), 0 if not."""
        return max(
            (len(p) for p in self.paths if path == p or (p.endswith("/") and path.startswith(p))), default=0
        )


def architecture_layers(text: str) -> list[Layer]:
    """The layer table of docs/architecture.md (its rows' first two columns), top to bottom."""
    layers = []
    in_table = False
    for line in text.splitlines():
        if line.startswith("| layer | module(s) |"):
            in_table = True
            continue
        if in_table and not line.startswith("|"):
            break
        if in_table and not line.startswith("|---"):
            name, modules = (cell.strip() for cell in line.split("|")[1:3])
            paths = tuple(part.strip().strip("`") for part in modules.split(","))
            layers.append(Layer(name, tuple(p for p in paths if p.startswith("kernelbridge/"))))
    return layers


def layer_violations(modules: list[Module], layers: list[Layer]) -> list[str]:
    """Modules in no layer, and imports of a layer above the importer's (lazy and TYPE_CHECKING
    ones too), one line each."""

    def layer_of(path: str) -> int | None:
        fits = [(layer.holds(path), index) for index, layer in enumerate(layers) if layer.holds(path)]
        return max(fits)[1] if fits else None

    by_name = {m.name: m for m in modules}
    found = []
    for module in modules:
        here = layer_of(module.path)
        if here is None:
            found.append(f"{module.path} is in no layer of docs/architecture.md")
            continue
        for imp in module.imports:
            target = by_name.get(imp.target)
            there = layer_of(target.path) if target is not None else None
            if there is not None and there < here:
                what = f"{module.path} ({layers[here].name}) imports {imp.target}"
                found.append(f"{what} ({layers[there].name}, a layer above it) at {imp.where()}")
    return found


class LongModule(UserWarning):
    """A module past :data:`LONG_MODULE` lines (shown in the test summary; never fails)."""


def long_modules(modules: list[Module]) -> list[str]:
    """One line per module past :data:`LONG_MODULE` lines."""
    return [
        f"{module.path} has {module.lines} lines (> {LONG_MODULE}): is it still one concept?"
        for module in modules
        if module.lines > LONG_MODULE
    ]


def long_module_docstrings(modules: list[Module], kept: dict[str, str] = LONG_DOCSTRINGS_KEPT) -> list[str]:
    """One line per module whose docstring is past :data:`MODULE_DOCSTRING` lines and not
    ``kept``, and per stale entry of ``kept`` (its module gone, or its docstring short now)."""
    found, long = [], set()
    for module in modules:
        docstring = ast.get_docstring(module.tree, clean=False) or ""
        lines = len(docstring.strip().splitlines())
        if lines > MODULE_DOCSTRING:
            long.add(module.name)
            if module.name not in kept:
                found.append(f"{module.path}: a module docstring of {lines} lines (> {MODULE_DOCSTRING})")
    found += [f"{name} is kept long but is not: drop it from the list" for name in sorted(set(kept) - long)]
    return found


def container_cli_spawns(modules: list[Module]) -> list[str]:
    """Places outside runtime/ that build a podman/docker argv or run one as a command string."""
    found = []
    for module in modules:
        if _within(module.name, "kernelbridge.runtime"):
            continue
        for node in ast.walk(module.tree):
            if isinstance(node, ast.List | ast.Tuple) and _is_cli_argv(node.elts):
                found.append(f"{module.path}:{node.lineno} builds a container CLI argv")
            elif isinstance(node, ast.Call) and _dotted(node.func) in SPAWNERS and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    if _names_cli(ast.Constant(first.value.split(" ", 1)[0])):
                        found.append(f"{module.path}:{node.lineno} runs a container CLI command")
    return found


def process_spawns(paths: list[Path]) -> list[str]:
    """Places in ``paths`` (test modules) that start a process: a :data:`SPAWNERS` call, or
    ``subprocess`` imported at all (its other names start processes too)."""
    found = []
    for path in paths:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _dotted(node.func) in SPAWNERS:
                found.append(f"{path.name}:{node.lineno} calls {_dotted(node.func)}")
            elif isinstance(node, ast.Import | ast.ImportFrom) and "subprocess" in _imported(node):
                found.append(f"{path.name}:{node.lineno} imports subprocess")
    return found


CLOCKS = frozenset({"time.monotonic", "time.perf_counter", "time.time", "monotonic", "perf_counter"})
DURATION_NAMES = frozenset({"seconds", "elapsed", "took", "duration", "duration_ms"})
"""Names, attributes and keys that hold how long something took (the harness's ``Result.seconds``,
a result's ``duration_ms``)."""


def timing_asserts(paths: list[Path]) -> list[str]:
    """Assertions in ``paths`` (test modules) on how long something took: a clock reading minus
    another, a name bound to one, or a duration field. Timing belongs in bench/; a test asserts
    what happened and bounds its waits against a hang (``anyio.fail_after``, a deadline that fails
    with what it waited for), far above the time the right behaviour takes."""
    found = []
    for path in paths:
        tree = ast.parse(path.read_text(), str(path))
        for scope in ast.walk(tree):
            if not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef | ast.Module):
                continue
            durations = set(DURATION_NAMES) | _names_bound_to_durations(scope)
            for node in _own_nodes(scope):
                if isinstance(node, ast.Assert) and _measures_time(node.test, durations):
                    found.append(f"{path.name}:{node.lineno} asserts how long something took")
    return found


def _own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``scope`` outside the functions nested in it (each is a scope of its own)."""
    for child in ast.iter_child_nodes(scope):
        if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            yield child
            yield from _own_nodes(child)


def _names_bound_to_durations(scope: ast.AST) -> set[str]:
    return {
        target.id
        for node in _own_nodes(scope)
        if isinstance(node, ast.Assign | ast.AnnAssign)
        and node.value is not None
        and _is_duration(node.value)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    }


def _is_duration(expr: ast.expr) -> bool:
    """``expr`` computes a clock reading minus another (``time.monotonic() - started``)."""
    return any(
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Sub)
        and any(isinstance(call, ast.Call) and _dotted(call.func) in CLOCKS for call in ast.walk(node.left))
        for node in ast.walk(expr)
    )


def _measures_time(test: ast.expr, durations: set[str]) -> bool:
    """``test`` orders a duration against a bound. (Equality is left alone: only a fake clock can
    make a duration equal to a number, as tests/unit's scripted runs do; so is a lone comparison
    with 0, which checks that a field is valid, not how long anything took.)"""
    return any(
        isinstance(node, ast.Compare)
        and any(isinstance(op, ast.Lt | ast.LtE | ast.Gt | ast.GtE) for op in node.ops)
        and not _checks_a_field_is_valid(node)
        and any(
            _is_duration(operand) or _names_duration(operand, durations)
            for operand in [node.left, *node.comparators]
        )
        for node in ast.walk(test)
    )


def _checks_a_field_is_valid(compare: ast.Compare) -> bool:
    """``x >= 0`` (or ``0 <= x``) alone: a chained ``0 <= x < 5`` still bounds a duration."""
    if len(compare.comparators) != 1:
        return False
    return any(
        isinstance(operand, ast.Constant) and operand.value == 0 and not isinstance(operand.value, bool)
        for operand in (compare.left, compare.comparators[0])
    )


def _names_duration(expr: ast.expr, durations: set[str]) -> bool:
    for node in ast.walk(expr):
        if isinstance(node, ast.Name) and node.id in durations:
            return True
        if isinstance(node, ast.Attribute) and node.attr in DURATION_NAMES:
            return True
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            if node.slice.value in DURATION_NAMES:
                return True
    return False


def _imported(node: ast.Import | ast.ImportFrom) -> set[str]:
    if isinstance(node, ast.ImportFrom):
        return {node.module or ""}
    return {alias.name for alias in node.names}


def _is_cli_argv(elements: list[ast.expr]) -> bool:
    """``["podman", "rm", ...]``, ``("docker", *args)``; not a tuple of names such as
    config.RUNTIMES ``("podman", "docker", ...)``, whose second element is no subcommand."""
    if not elements or not _names_cli(elements[0]):
        return False
    return len(elements) == 1 or not _names_cli(elements[1])


def _names_cli(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and os.path.basename(node.value) in CONTAINER_CLIS
    )


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def engine_api_imports(modules: list[Module]) -> list[str]:
    return [
        f"{module.path}:{imp.line} imports {imp.target} (the engine API is runtime/'s)"
        for module in modules
        if not _within(module.name, "kernelbridge.runtime")
        for imp in module.imports
        if any(_within(imp.target, api) for api in ENGINE_API)
    ]


def host_imports_inside(modules: list[Module]) -> list[str]:
    stdlib = sys.stdlib_module_names
    found = []
    for module in modules:
        if not module.inside:
            continue
        for imp in module.imports:
            top = imp.target.split(".")[0]
            if top in stdlib or top in SANDBOX_THIRD_PARTY:
                continue
            if any(_within(imp.target, allowed) for allowed in SANDBOX_KERNELBRIDGE):
                continue
            found.append(
                f"{module.path}:{imp.line} imports {imp.target}: code in the container may import only"
                " the standard library, pyzmq, ipykernel/IPython, installer, inside/ and AGENT_MODULES"
            )
    return found


def imports_of_testing(modules: list[Module]) -> list[str]:
    return [
        f"{module.path}:{imp.line} imports {imp.target} (test doubles are for tests and benches)"
        for module in modules
        if not _within(module.name, "kernelbridge.testing")
        for imp in module.imports
        if _within(imp.target, "kernelbridge.testing")
    ]


def made_up(sources: dict[str, str], packages: tuple[str, ...] = ()) -> list[Module]:
    return resolve_imports(
        [parse(name, source, package=name in packages) for name, source in sources.items()]
    )

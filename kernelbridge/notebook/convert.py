"""Journal entries <-> nbformat v4 notebooks, and notebook files read as untrusted input.

- :func:`entry_cell`: a journal's records (see
  :mod:`kernelbridge.notebook.journal`) as notebook cells, valid under ``nbformat.validate`` (an
  output nbformat refuses is replaced by a note, never the whole notebook lost);
- :func:`read_notebook` / :func:`parse_notebook`: a notebook file a person or a model names (for
  a replay or a restore), validated, within :data:`MAX_NOTEBOOK_BYTES`;
- :func:`strip_images`: a notebook without its images' bytes (all that judging reads of them is
  their size), what a worker process hands back to the bridge.

No I/O beyond reading the notebook file it is given; no sessions, no kernels, no MCP.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from kernelbridge.errors import ConfigError
from kernelbridge.notebook.access import SandboxAccess
from kernelbridge.notebook.journal import (
    BUDGET_SETTING,
    JournalCell,
    JournalEntry,
    JournalHeader,
    JournalTruncated,
)

KERNELSPEC: dict[str, str] = {
    "name": "kernelbridge",
    "display_name": "Python 3 (kernelbridge sandbox)",
    "language": "python",
}
LANGUAGE_INFO: dict[str, str] = {"name": "python", "file_extension": ".py", "mimetype": "text/x-python"}
MAX_NOTEBOOK_BYTES = 64 * 1024 * 1024
"""A notebook bigger than this is not read (a journal's outputs are capped far below it)."""
OUTPUT_TYPES = frozenset({"stream", "display_data", "execute_result", "error"})
_CELL_ID = re.compile(r"^[a-zA-Z0-9-_]{1,64}$")
"""nbformat 4.5's cell id."""
KEPT_PNG_CHARS = 64
"""Base64 characters of a PNG a restore keeps: its header, all that judging reads (its size)."""

# -- nbformat, typed ----------------------------------------------------------------------------
# nbformat ships no type hints. Its constructors are called here, once, through an Any-typed
# handle, and what they return is declared a NotebookNode (a dict with attribute access), so that
# the rest of the package stays checked. It is imported on first use: with jsonschema it is 0.2 s
# (more on a busy machine) that a bridge need not pay before it answers initialize.
if TYPE_CHECKING:
    from nbformat import NotebookNode as Node


def _nbformat() -> Any:
    import nbformat

    return nbformat


def code_cell(**fields: Any) -> Node:
    """``nbformat.v4.new_code_cell``."""
    return cast("Node", _nbformat().v4.new_code_cell(**fields))


def markdown_cell(text: str, **fields: Any) -> Node:
    return cast("Node", _nbformat().v4.new_markdown_cell(text, **fields))


def stream_output(name: str, text: str) -> Node:
    return cast("Node", _nbformat().v4.new_output("stream", name=name, text=text))


def blank_notebook(**fields: Any) -> Node:
    """``nbformat.v4.new_notebook``."""
    return cast("Node", _nbformat().v4.new_notebook(**fields))


def to_node(value: dict[str, Any]) -> Node:
    return cast("Node", _nbformat().from_dict(value))


def write_notebook_file(nb: Node, path: str | Path) -> None:
    """``nbformat.write`` as v4 (nbformat's own complaints kept quiet: the cells were checked)."""
    with quiet_nbformat():
        _nbformat().write(nb, str(path), version=4)


def _valid_count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _clean_output(output: dict[str, Any], count: int | None) -> Node:
    """Fix up one output so nbformat accepts it (execute_result needs an int or null count)."""
    out = dict(output)
    if out.get("output_type") == "execute_result":
        out["execution_count"] = _valid_count(out.get("execution_count")) or count
    return to_node(out)


def notebook_outputs(outputs: Iterable[Any], count: int | None) -> list[Node]:
    """nbformat output nodes from journal (or :class:`~kernelbridge.session.cell.CellResult`) outputs."""
    return [_clean_output(o, count) for o in outputs if isinstance(o, dict)]


def new_notebook(session: str, access: SandboxAccess | None = None) -> Node:
    """An empty notebook of ``session`` with kernelbridge's kernelspec, and the mounts and package
    policy its sandboxes had (``metadata.kernelbridge.sandbox``, from the journal's header)."""
    nb = blank_notebook()
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["language_info"] = dict(LANGUAGE_INFO)
    nb.metadata["kernelbridge"] = {"session": session}
    if access is not None:
        nb.metadata["kernelbridge"]["sandbox"] = access.to_json()
    return nb


def notebook_access(nb: Node) -> SandboxAccess | None:
    """The mounts and package policy a notebook's session had, if it records them (untrusted)."""
    meta = nb.metadata.get("kernelbridge")
    return SandboxAccess.from_json(meta.get("sandbox")) if isinstance(meta, dict) else None


def access_of(entry: JournalEntry, access: SandboxAccess | None) -> SandboxAccess | None:
    """``access`` as the journal's entries so far say it: a header's, else what was known."""
    return entry.access if isinstance(entry, JournalHeader) and entry.access is not None else access


def entry_cell(entry: JournalEntry) -> Node | None:
    """The notebook cell of one journal entry (valid under nbformat), or None (not a cell)."""
    if isinstance(entry, JournalTruncated):
        return _truncated_cell(entry)
    if not isinstance(entry, JournalCell):
        return None
    # The outputs go in after the cell is made: nbformat's constructor validates what it is given,
    # and one odd output (a hand-edited journal) must cost a note, not the cell (valid_cell below).
    cell = code_cell(source=entry.code, execution_count=entry.execution_count)
    cell.outputs = notebook_outputs(entry.outputs, entry.execution_count)
    meta: dict[str, Any] = {
        "source": entry.source,
        "servers": list(entry.servers),
        "status": entry.status,
        "duration_ms": entry.duration_ms,
        "state": entry.state,
    }
    if entry.client:
        meta["client"] = entry.client
    if entry.tool_calls:
        meta["tool_calls"] = entry.tool_calls
    if entry.packages:
        meta["packages"] = entry.packages
    if entry.timeout is not None:
        meta["timeout"] = entry.timeout
    cell.metadata["kernelbridge"] = meta
    return valid_cell(cell)


def _truncated_cell(entry: JournalTruncated) -> Node:
    """The notebook's own word that cells are missing after this point (a markdown cell)."""
    if entry.read_limit is not None:
        what = f"the journal continues past {entry.read_limit:,} bytes, which is all that is read"
    else:
        what = f"the session's journal reached its budget of {entry.budget} bytes"
    setting = (entry.setting or BUDGET_SETTING)[:60]
    text = (
        f"*kernelbridge: {what} (`{setting}`); the cells that ran after this point are not in this notebook.*"
    )
    return markdown_cell(text, metadata={"kernelbridge": {"truncated": True}})


def valid_cell(cell: Node) -> Node:
    """``cell`` if nbformat accepts it; else the same cell with each unacceptable output replaced
    by a note (one line saying what it was), so one odd output (metadata nested too deeply, an
    output type nbformat does not know) never makes a whole session unexportable."""
    if _accepted(cell):
        return cell
    kept = []
    for output in cell.outputs:
        probe = code_cell()
        probe.outputs = [output]
        if _accepted(probe):
            kept.append(output)
        else:
            kind = str(output.get("output_type", "unknown") if isinstance(output, dict) else "unknown")[:40]
            note = f"[kernelbridge: a {kind!r} output could not be kept in the notebook]"
            kept.append(stream_output("stderr", note + "\n"))
    cell.outputs = kept
    if not _accepted(cell):
        cell.metadata = {"kernelbridge": {"note": "metadata dropped: not valid in a notebook"}}
    return cell


def _accepted(cell: Node) -> bool:
    """Whether nbformat accepts ``cell`` in a notebook (its constructors validate what they are
    given: the cell goes in after the notebook is made)."""
    probe = blank_notebook()
    probe.cells = [cell]
    nbformat = _nbformat()
    try:
        nbformat.validate(probe)
    except (nbformat.ValidationError, RecursionError, ValueError, TypeError):
        return False
    return True


def strip_images(node: Node) -> Node:
    """A cell (or every cell of a notebook) with its images cut to their headers, in place."""
    for cell in node.cells if "cells" in node else [node]:
        for output in cell.get("outputs", []):
            data = output.get("data")
            for mime, value in list(data.items()) if isinstance(data, dict) else []:
                if mime.startswith("image/") and not mime.endswith("svg+xml") and isinstance(value, str):
                    data[mime] = value[:KEPT_PNG_CHARS] if mime == "image/png" else ""
    return node


def read_notebook(path: str | Path) -> Node:
    """Read and validate a v4 notebook. Raises ConfigError with one line (missing file, not JSON,
    not a notebook)."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise ConfigError(f"no such notebook: {path}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    if size > MAX_NOTEBOOK_BYTES:
        raise ConfigError(f"{path} is {size:,} bytes; notebooks over {MAX_NOTEBOOK_BYTES:,} are not replayed")
    try:
        return parse_notebook(path.read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None


def read_restorable(path: str | Path) -> Node:
    """:func:`read_notebook` without its images' bytes (all a restore judges of them is their
    size): what a worker process hands back to the bridge."""
    return strip_images(read_notebook(path))


def parse_notebook(text: str, name: str) -> Node:
    """Parse notebook JSON as nbclient takes it, and make it a valid v4.5 notebook. Raises
    ConfigError naming ``name`` for what nbclient could not run either (not JSON, no cells, an
    nbformat other than 3 or 4, cells that are not cells).

    nbformat's reader is lenient (it logs what does not validate and goes on); so is this, with the
    repairs a replay needs and nothing said by third parties: cells get the ids nbformat 4.5 asks
    for (nbformat would warn, ``MissingIDFieldWarning``, once per validation), a kernelspec without
    ``name`` gets kernelbridge's (it runs in a sandbox now), lists of lines become text. Outputs
    nbformat does not know are kept for the replay to say so (:func:`unknown_outputs`)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{name} is not a valid notebook: not JSON ({exc.msg} at line {exc.lineno})"
        ) from None
    if not isinstance(data, dict) or "nbformat" not in data or not ("cells" in data or "worksheets" in data):
        raise ConfigError(f"{name} is not a valid notebook: no 'cells' and 'nbformat' in it")
    major = data.get("nbformat")
    if major not in (3, 4) or isinstance(major, bool):
        raise ConfigError(f"{name} is not a notebook this reads: nbformat {major!r} (4.0-4.5 and 3 are read)")
    nbformat = _nbformat()
    try:
        with quiet_nbformat():
            nb = cast("Node", nbformat.reads(text, as_version=4))
    except (ValueError, TypeError, KeyError, AttributeError, nbformat.ValidationError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ConfigError(f"{name} is not a valid notebook: {first}") from None
    _repair(nb, name)
    return nb


def _repair(nb: Node, name: str) -> None:
    """Make a notebook nbclient would run a valid v4.5 one (see :func:`parse_notebook`)."""
    cells = nb.get("cells")
    if not isinstance(cells, list):
        raise ConfigError(f"{name} is not a valid notebook: 'cells' is not a list")
    for n, cell in enumerate(cells, 1):
        if not isinstance(cell, dict) or not isinstance(cell.get("cell_type"), str):
            raise ConfigError(f"{name} is not a valid notebook: cell {n} is not a cell")
        source = cell.get("source", "")
        cell["source"] = "".join(map(str, source)) if isinstance(source, list) else str(source)
        if not isinstance(cell.get("metadata"), dict):
            cell["metadata"] = to_node({})
        if cell["cell_type"] == "code" and not isinstance(cell.get("outputs"), list):
            cell["outputs"] = []
    ids: set[str] = set()
    for cell in cells:
        if not isinstance(cell.get("id"), str) or not _CELL_ID.match(cell["id"]) or cell["id"] in ids:
            cell["id"] = code_cell().id
        ids.add(cell["id"])
    nb.nbformat, nb.nbformat_minor = 4, max(_valid_count(nb.get("nbformat_minor")) or 0, 5)
    if not isinstance(nb.get("metadata"), dict):
        nb.metadata = to_node({})
    kernelspec = nb.metadata.get("kernelspec")
    if isinstance(kernelspec, dict) and not isinstance(kernelspec.get("name"), str):
        kernelspec["name"] = KERNELSPEC["name"]
        kernelspec.setdefault("display_name", KERNELSPEC["display_name"])
    elif kernelspec is not None and not isinstance(kernelspec, dict):
        nb.metadata["kernelspec"] = dict(KERNELSPEC)


def unknown_outputs(nb: Node) -> list[str]:
    """One line for each output of a code cell that nbformat does not know (not judged)."""
    lines: list[str] = []
    code = [cell for cell in nb.cells if cell.get("cell_type") == "code"]
    for n, cell in enumerate(code, 1):
        for m, output in enumerate(cell.get("outputs", []), 1):
            kind = output.get("output_type") if isinstance(output, dict) else None
            if kind not in OUTPUT_TYPES:
                what = f"output_type {kind[:40]!r}" if isinstance(kind, str) else "no output_type"
                lines.append(f"cell {n}: output {m} has {what}, which nbformat does not know: not judged")
    return lines


@contextlib.contextmanager
def quiet_nbformat() -> Iterator[None]:
    """nbformat's warnings and log lines (``MissingIDFieldWarning``, "Notebook JSON is invalid")
    kept off the terminal: the caller says what matters in its own words."""
    logger = logging.getLogger("nbformat")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)

"""The records sandboxed code reads about host servers and tools, and ranked search over them.

Records have the shapes of docs/rpc.md (ServerSummary, Server, Tool, ToolDoc, SearchHit), and only
their fields leave the hub: never a command, argument, environment value, URL or header.
:func:`search` scores each tool by the query's words, weighted by field (name 6, parameter 2.5,
server 2, description 1), plus 10 for the whole name and 3 for a name holding every word; ties keep
configuration and listing order, and a score of 0 is not returned. Design: docs/design/host.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any, Literal

import mcp_types as types

from kernelbridge.hub.config import ServerConfig
from kernelbridge.hub.signatures import python_signature

Detail = Literal["summary", "full"]

MAX_SUMMARY_CHARS = 200
"""A summary line is what a model skims in a list: one line, bounded."""

_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
_STOP = frozenset(
    {"a", "an", "the", "to", "of", "for", "and", "or", "in", "on", "with", "by", "is", "me", "my"}
)


@dataclass(frozen=True, slots=True)
class ToolEntry:
    """One tool of one server, with both aliases, as the docs and search see it."""

    server: str
    server_alias: str
    tool: types.Tool
    alias: str


def server_summary(name: str, alias: str, config: ServerConfig, *, granted: bool) -> dict[str, Any]:
    """ServerSummary: ``name, alias, description, granted, transport`` and nothing else."""
    return {
        "name": name,
        "alias": alias,
        "description": config.description,
        "granted": granted,
        "transport": config.transport,
    }


def tool_record(entry: ToolEntry) -> dict[str, Any]:
    """Tool: ``name, alias, description, input_schema``."""
    return {
        "name": entry.tool.name,
        "alias": entry.alias,
        "description": entry.tool.description or "",
        "input_schema": entry.tool.input_schema,
    }


def tool_doc(entry: ToolEntry, detail: Detail = "summary") -> dict[str, Any]:
    """ToolDoc. Summary: the first line of the description. Full: the whole description, the
    schemas and the proxy's Python signature."""
    doc: dict[str, Any] = {
        "server": entry.server,
        "server_alias": entry.server_alias,
        "tool": entry.tool.name,
        "alias": entry.alias,
        "description": summary_line(entry.tool.description),
    }
    if detail == "full":
        doc["description"] = entry.tool.description or ""
        doc["input_schema"] = entry.tool.input_schema
        doc["output_schema"] = entry.tool.output_schema
        doc["signature"] = python_signature(entry.alias, entry.tool.input_schema)
    return doc


def summary_line(description: str | None) -> str:
    lines = (description or "").strip().splitlines()
    line = lines[0].strip() if lines else ""
    return line if len(line) <= MAX_SUMMARY_CHARS else line[: MAX_SUMMARY_CHARS - 3] + "..."


def words(text: str) -> list[str]:
    """Lowercase words of a name or a text; identifiers are split at ``_``, ``-`` and case changes."""
    return [w.lower() for w in _WORD.findall(text)]


def search(query: str, entries: Iterable[ToolEntry], limit: int) -> list[tuple[float, ToolEntry]]:
    """The ``limit`` best-scoring entries for ``query``, best first (see the module docstring)."""
    query_words = [w for w in words(query) if w not in _STOP] or words(query)
    if not query_words:
        return []
    joined = "_".join(query_words)
    scored: list[tuple[float, int, ToolEntry]] = []
    for index, entry in enumerate(entries):
        score = _score(query_words, joined, entry)
        if score > 0:
            scored.append((round(score, 3), index, entry))
    scored.sort(key=lambda item: (-item[0], item[1]))
    return [(score, entry) for score, _, entry in scored[:limit]]


def _score(query_words: list[str], joined: str, entry: ToolEntry) -> float:
    name_words = set(words(entry.tool.name)) | set(words(entry.alias))
    fields = (
        (6.0, name_words),
        (2.5, {w for p in _parameter_names(entry.tool) for w in words(p)}),
        (2.0, set(words(entry.server)) | set(words(entry.server_alias))),
        (1.0, set(words(entry.tool.description or ""))),
    )
    total = 0.0
    for q in query_words:
        total += max(weight * _match(q, field) for weight, field in fields)
    if joined in ("_".join(words(entry.tool.name)), "_".join(words(entry.alias))):
        total += 10.0
    if all(q in name_words for q in query_words):
        total += 3.0
    return total


def _match(q: str, candidates: set[str]) -> float:
    if q in candidates:
        return 1.0
    best = 0.0
    for word in candidates:
        if len(q) >= 3 and (word.startswith(q) or (len(word) >= 3 and q.startswith(word))):
            best = max(best, 0.5)
        elif best < 1 / 3 and len(q) >= 5 and abs(len(word) - len(q)) <= 1:
            if SequenceMatcher(None, q, word).ratio() >= 0.8:
                best = 1 / 3
    return best


def _parameter_names(tool: types.Tool) -> list[str]:
    properties = tool.input_schema.get("properties")  # a dict: the SDK validated the schema
    return [name for name in properties if isinstance(name, str)] if isinstance(properties, dict) else []

"""Python signature strings for MCP tools, from their JSON Schema ``inputSchema``.

``python_signature("get_current_time", schema)`` gives ``get_current_time(*, timezone: str) -> dict``:
the signature a proxy function has in the sandbox (docs/rpc.md, ToolDoc ``signature``). Standard
library only and no kernelbridge imports, so the kernel side may vendor it; it builds its real
proxy functions itself.

Rules (JSON Schema is far richer than Python annotations; this is a readable approximation):

- every argument is keyword-only, in the schema's ``properties`` order; a required name missing
  from ``properties`` is added as ``Any``;
- an optional argument shows its ``default`` when that is a short JSON value, else ``= None``
  (and ``| None`` is added to its type);
- types: string ``str``, integer ``int``, number ``float``, boolean ``bool``, null ``None``,
  array ``list[item]``, object ``dict``; ``enum``/``const`` become ``Literal[...]``; a list of
  types, ``anyOf`` and ``oneOf`` become unions; ``$ref``, ``allOf`` and anything deeper than
  :data:`MAX_DEPTH` levels become ``Any``;
- a property whose name cannot be a Python parameter (``from``, ``max-results``) is reachable
  through ``**kwargs`` only, which the signature then shows.
"""

from __future__ import annotations

import keyword
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 3
"""Nested types deeper than this read as ``Any``: a signature is for reading, not validation."""
MAX_LITERALS = 12
"""An enum with more values than this shows its base type instead of a long ``Literal``."""
MAX_DEFAULT_CHARS = 40

_SIMPLE = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "null": "None"}


@dataclass(frozen=True, slots=True)
class Parameter:
    name: str
    annotation: str
    required: bool
    default: str | None = None
    """The Python source of the default (``None`` for a required parameter)."""


def is_parameter_name(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name)


def annotation(schema: object, depth: int = 0) -> str:
    """The Python annotation for one JSON Schema (a readable string, never raises)."""
    if not isinstance(schema, dict) or depth > MAX_DEPTH:
        return "Any"
    if "const" in schema and _is_literal(schema["const"]):
        return f"Literal[{schema['const']!r}]"
    enum = schema.get("enum")
    if isinstance(enum, list) and enum and len(enum) <= MAX_LITERALS and all(_is_literal(v) for v in enum):
        return "Literal[" + ", ".join(repr(v) for v in enum) + "]"
    for key in ("anyOf", "oneOf"):
        members = schema.get(key)
        if isinstance(members, list) and members:
            return _union(annotation(m, depth + 1) for m in members)
    kind = schema.get("type")
    if isinstance(kind, list):
        return _union(annotation({**schema, "type": k}, depth) for k in kind)
    if kind == "array":
        items = schema.get("items")
        return f"list[{annotation(items, depth + 1)}]" if isinstance(items, dict) else "list"
    if kind == "object":
        return "dict"
    if isinstance(kind, str) and kind in _SIMPLE:
        return _SIMPLE[kind]
    return "Any"


def parameters(input_schema: object) -> tuple[list[Parameter], bool]:
    """The keyword-only parameters of a proxy, and whether ``**kwargs`` is needed."""
    if not isinstance(input_schema, dict):
        return [], True
    properties = input_schema.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    required_list = input_schema.get("required")
    required = {r for r in required_list if isinstance(r, str)} if isinstance(required_list, list) else set()
    params: list[Parameter] = []
    needs_kwargs = False
    names = list(properties) + sorted(required - set(properties))
    for name in names:
        if not isinstance(name, str) or not is_parameter_name(name):
            needs_kwargs = True
            continue
        schema = properties.get(name, {})
        ann = annotation(schema)
        if name in required:
            params.append(Parameter(name, ann, True))
            continue
        default = _default_source(schema) or "None"
        if default == "None" and ann != "Any" and "None" not in _split_union(ann):
            ann += " | None"
        params.append(Parameter(name, ann, False, default))
    return params, needs_kwargs


def python_signature(name: str, input_schema: object, *, returns: str = "dict") -> str:
    """``name(*, a: int, b: str = 'x') -> dict`` for a tool's input schema."""
    params, needs_kwargs = parameters(input_schema)
    parts = [f"{p.name}: {p.annotation}" + ("" if p.required else f" = {p.default}") for p in params]
    if parts:
        parts.insert(0, "*")
    if needs_kwargs:
        parts.append("**kwargs: Any")
    return f"{name}({', '.join(parts)}) -> {returns}"


def _split_union(ann: str) -> list[str]:
    """The members of a union annotation, split only outside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(ann):
        depth += (char == "[") - (char == "]")
        if depth == 0 and ann.startswith(" | ", i):
            parts.append(ann[start:i])
            start = i + 3
    parts.append(ann[start:])
    return parts


def _union(members: Any) -> str:
    seen: list[str] = []
    for member in members:
        for part in _split_union(member):
            if part not in seen:
                seen.append(part)
    if "Any" in seen:
        return "Any"
    if "None" in seen:  # Optional reads best last
        seen.remove("None")
        seen.append("None")
    return " | ".join(seen)


def _is_literal(value: object) -> bool:
    return isinstance(value, str | int | float | bool) or value is None


def _default_source(schema: object) -> str | None:
    if not isinstance(schema, dict) or "default" not in schema:
        return None
    value = schema["default"]
    if not isinstance(value, str | int | float | bool | list | dict) and value is not None:
        return None
    text = repr(value)
    return text if len(text) <= MAX_DEFAULT_CHARS else None

"""Python signatures from MCP tool input schemas (JSON Schema), and argument checking against them.

The rules are docs/rpc.md's "Tool proxies": keyword-only parameters in the schema's order, JSON types
as annotations, keywords and other names made identifiers (the real name always accepted too).
Unknown, positional and missing required arguments raise TypeError before anything is sent. Schemas
come from third-party servers: nothing here raises on a strange one, it just describes less. Standard
library only, and no imports from the package: the host loads this file by path to render the same
signatures in its tool docs.
"""

from __future__ import annotations

import inspect
import keyword
import re
from dataclasses import dataclass
from typing import Any, Literal, Optional, Union

MAX_PARAMS = 200  # a schema with more properties is not a tool signature anyone can read
MAX_ENUM = 50  # a longer enum is shown as its base type; the docs still list it
MAX_PARAM_DOC_CHARS = 300
_SCALARS = (str, int, float, bool, type(None))
_SIMPLE_TYPES: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "object": dict,
    "null": type(None),
}
_NOT_IDENTIFIER = re.compile(r"[^0-9A-Za-z_]+")


@dataclass(frozen=True, slots=True)
class Param:
    """One schema property as a keyword-only parameter."""

    name: str
    """The Python name (``from_``); "" when the property cannot be a parameter (only ``**{wire: v}``)."""
    wire: str
    """The property name sent to the server (``from``)."""
    required: bool
    nullable: bool
    """The schema admits null: an explicit None is sent rather than treated as "left out"."""
    annotation: Any
    default: Any
    description: str


@dataclass(frozen=True, slots=True)
class ToolSignature:
    params: tuple[Param, ...]
    extra: bool
    """Unknown keyword arguments are accepted and sent as is (``additionalProperties``)."""
    signature: inspect.Signature

    def arguments(self, func_name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The ``arguments`` object to send for a call. Raises TypeError like a Python call would."""
        if args:
            raise TypeError(
                f"{func_name}() takes keyword arguments only ({len(args)} positional given);"
                f" call it as {func_name}({self.example()})"
            )
        by_name = {p.name: p for p in self.params if p.name}
        by_wire = {p.wire: p for p in self.params}
        sent: dict[str, Any] = {}
        given: set[str] = set()
        for key, value in kwargs.items():
            param = by_name.get(key) or by_wire.get(key)
            if param is None and not self.extra:
                accepted = ", ".join(p.name or repr(p.wire) for p in self.params) or "no arguments"
                raise TypeError(
                    f"{func_name}() got an unexpected keyword argument {key!r} (it takes: {accepted})"
                )
            wire = param.wire if param is not None else key
            if wire in given:
                raise TypeError(f"{func_name}() got multiple values for argument {wire!r}")
            given.add(wire)
            if value is None and param is not None and not param.required and not param.nullable:
                continue  # None means "left out" for an optional parameter that cannot be null
            sent[wire] = value
        missing = [p.name or p.wire for p in self.params if p.required and p.wire not in given]
        if missing:
            names = ", ".join(repr(m) for m in missing)
            plural = "s" if len(missing) > 1 else ""
            raise TypeError(f"{func_name}() missing required keyword argument{plural}: {names}")
        return sent

    def example(self) -> str:
        shown = [p for p in self.params if p.required] or list(self.params[:1])
        return ", ".join(f"{p.name or p.wire}=..." for p in shown)

    def doc_section(self) -> str:
        """The per-parameter part of the docstring."""
        if not self.params and not self.extra:
            return "Takes no arguments."
        lines = ["Parameters (keyword-only):"]
        for p in self.params:
            head = p.name if p.name else f"**{{{p.wire!r}: ...}}"
            kind = inspect.formatannotation(p.annotation)
            head += f": {kind}"
            head += ", required" if p.required else f" = {p.default!r}"
            if p.name and p.name != p.wire:
                head += f"  (sent as {p.wire!r})"
            lines.append(f"  {head}")
            if p.description:
                lines.append(f"      {_one_paragraph(p.description, MAX_PARAM_DOC_CHARS)}")
        if self.extra:
            lines.append("  **kwargs: further arguments are sent as given")
        return "\n".join(lines)


def tool_signature(schema: object) -> ToolSignature:
    """The signature for a tool's ``inputSchema``; never raises."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    props = props if isinstance(props, dict) else {}
    required_raw = schema.get("required") if isinstance(schema, dict) else None
    required = {r for r in required_raw if isinstance(r, str)} if isinstance(required_raw, list) else set()
    additional = schema.get("additionalProperties") if isinstance(schema, dict) else None
    extra = additional is True or isinstance(additional, dict)

    params: list[Param] = []
    taken = {str(k) for k in props}  # a derived name must not shadow another property's real name
    used: set[str] = set()
    for wire, prop in list(props.items())[:MAX_PARAMS]:
        wire = str(wire)
        prop = prop if isinstance(prop, dict) else {}
        name = _python_name(wire)
        if not name or name in used or (name != wire and name in taken):
            name = ""
            extra_needed = True
        else:
            used.add(name)
            extra_needed = False
        is_required = wire in required
        annotation = annotation_for(prop)
        nullable = _admits_none(annotation)
        default: Any = None
        if not is_required:
            default = prop.get("default")
            if default is None and not nullable and annotation is not Any:
                annotation = Optional[annotation]  # noqa: UP045 (shown as Optional[...] to a reader)
        description = prop.get("description")
        params.append(
            Param(
                name=name,
                wire=wire,
                required=is_required,
                nullable=nullable,
                annotation=annotation,
                default=default,
                description=description if isinstance(description, str) else "",
            )
        )
        extra = extra or extra_needed

    parameters = [
        inspect.Parameter(
            p.name,
            inspect.Parameter.KEYWORD_ONLY,
            annotation=p.annotation,
            default=inspect.Parameter.empty if p.required else p.default,
        )
        for p in params
        if p.name
    ]
    if extra:
        rest = "kwargs" if "kwargs" not in used else "extra_arguments"
        parameters.append(inspect.Parameter(rest, inspect.Parameter.VAR_KEYWORD, annotation=Any))
    signature = inspect.Signature(parameters, return_annotation=dict)
    return ToolSignature(params=tuple(params), extra=extra, signature=signature)


def annotation_for(schema: object, depth: int = 0) -> Any:
    """The Python annotation for a JSON Schema; Any when it cannot say better."""
    if not isinstance(schema, dict) or depth > 5:
        return Any
    enum = schema.get("enum")
    if isinstance(enum, list) and 0 < len(enum) <= MAX_ENUM and all(isinstance(v, _SCALARS) for v in enum):
        return Literal[tuple(dict.fromkeys(enum))]
    if "const" in schema and isinstance(schema["const"], _SCALARS):
        return Literal[schema["const"]]
    kind = schema.get("type")
    if isinstance(kind, str):
        return _annotation_of_type(kind, schema, depth)
    if isinstance(kind, list) and kind:
        return _union([_annotation_of_type(k, schema, depth) if isinstance(k, str) else Any for k in kind])
    for key in ("anyOf", "oneOf"):
        members = schema.get(key)
        if isinstance(members, list) and members:
            return _union([annotation_for(m, depth + 1) for m in members])
    return Any


def _annotation_of_type(kind: str, schema: dict[str, Any], depth: int) -> Any:
    if kind == "array":
        items = annotation_for(schema.get("items"), depth + 1)
        if items in (str, int, float, bool, dict):
            return list[items]  # type: ignore[valid-type]  # built at run time, for inspect.Signature
        return list
    return _SIMPLE_TYPES.get(kind, Any)


def _union(members: list[Any]) -> Any:
    if any(m is Any for m in members):
        return Any
    unique = list(dict.fromkeys(members))
    return unique[0] if len(unique) == 1 else Union[tuple(unique)]  # noqa: UP007


def _admits_none(annotation: Any) -> bool:
    if annotation is type(None) or annotation is Any:
        return annotation is type(None)
    args = getattr(annotation, "__args__", ())
    return type(None) in args or (getattr(annotation, "__origin__", None) is Literal and None in args)


def _python_name(wire: str) -> str:
    """The parameter name for a property name, or "" if it cannot have one."""
    name = _NOT_IDENTIFIER.sub("_", wire)
    if name and name[0].isdigit():
        name = "_" + name
    if keyword.iskeyword(name):
        name += "_"
    return name if name.isidentifier() else ""


def _one_paragraph(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."

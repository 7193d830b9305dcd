"""Python signature strings of tool proxies, for ``query_tool_docs(detail="full")``.

The text must be exactly the signature the proxy in the kernel has, so there is one set of rules:
the kernel's own ``mcp/_signature.py`` (standard library only, no package imports), loaded here by
path; it cannot be imported as ``mcp._signature`` on the host, where ``mcp`` is the MCP SDK.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType

import kernelbridge.inside

_RULES = Path(kernelbridge.inside.__file__).parent / "pythonpath" / "mcp" / "_signature.py"


def _load_rules() -> ModuleType:
    name = "kernelbridge.inside._proxy_signature"
    spec = importlib.util.spec_from_file_location(name, _RULES)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is created
    spec.loader.exec_module(module)
    return module


_rules = _load_rules()


def python_signature(name: str, input_schema: object) -> str:
    """``name(*, a: str, b: Optional[int] = None) -> dict``: the proxy's signature as text."""
    signature: inspect.Signature = _rules.tool_signature(input_schema).signature
    return f"{name}{signature}"

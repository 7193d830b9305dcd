"""The operator's policy over host MCP servers and tools (settings, not sandbox input).

Two layers decide what sandboxed code may do, and this module is the first:

1. **operator policy** (here, from ``Settings``): ``allow_servers`` / ``deny_servers`` patterns over
   server names and ``deny_tools`` patterns over ``server.tool``. A denied server is treated as
   not configured (invisible to docs, refused as a grant); a denied tool is absent from every list
   and its calls answer ``denied``.
   ``approve_tools`` patterns (the same form; ``*`` alone is every tool) mark the calls a person
   must approve first (:meth:`Policy.needs_approval`; the hub asks through the call's approver,
   see :mod:`.approval`).
2. **session grants** (``run_python(servers=[...])``, passed in every :class:`RpcCall`): which
   allowed servers a session may *call*. Docs cost no grant.

Patterns are ``fnmatch`` patterns matched case-sensitively against the real names (not aliases).
A tool pattern is matched against the string ``"<server>.<tool>"``, so dots inside server or
tool names need no escaping: ``github.*`` and ``*.delete_*`` mean what they say.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from kernelbridge.config import Settings


@dataclass(frozen=True, slots=True)
class Policy:
    allow_servers: tuple[str, ...] = ()
    """Empty: every server is allowed."""
    deny_servers: tuple[str, ...] = ()
    deny_tools: tuple[str, ...] = ()
    approve_tools: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, settings: Settings) -> Policy:
        return cls(settings.allow_servers, settings.deny_servers, settings.deny_tools, settings.approve_tools)

    def server_allowed(self, server: str) -> bool:
        if any(fnmatchcase(server, p) for p in self.deny_servers):
            return False
        return not self.allow_servers or any(fnmatchcase(server, p) for p in self.allow_servers)

    def tool_allowed(self, server: str, tool: str) -> bool:
        qualified = f"{server}.{tool}"
        return self.server_allowed(server) and not any(fnmatchcase(qualified, p) for p in self.deny_tools)

    def needs_approval(self, server: str, tool: str) -> bool:
        """Whether a call of ``server.tool`` (real names) waits for a person's approval."""
        qualified = f"{server}.{tool}"
        return any(fnmatchcase(qualified, p) for p in self.approve_tools)

    def approval_patterns(self, server: str) -> list[str]:
        """The approval patterns that can match a tool of ``server`` (for listings)."""
        return [
            p
            for p in self.approve_tools
            if p == "*" or ("." in p and fnmatchcase(server, p.rsplit(".", 1)[0]))
        ]

    def why_denied(self, server: str) -> str:
        """Which setting denies ``server`` (for a validation error the operator can act on)."""
        if any(fnmatchcase(server, p) for p in self.deny_servers):
            return "KERNELBRIDGE_DENY_SERVERS"
        return "KERNELBRIDGE_ALLOW_SERVERS"

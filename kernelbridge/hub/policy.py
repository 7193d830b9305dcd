"""The operator's policy over host MCP servers and tools (settings, not sandbox input).

``allow_servers``/``deny_servers`` match server names; ``deny_tools`` and ``approve_tools`` (``*``
alone: every tool) match ``"<server>.<tool>"``, so ``github.*`` and ``*.delete_*`` mean what they
say. All are ``fnmatch`` patterns, case-sensitive, over real names, never aliases. A denied server
is as if not configured (invisible, refused as a grant); a denied tool is absent from every list and
its calls answer ``denied``. A session's grants (:class:`RpcCall`) are the second layer, the hub's.
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

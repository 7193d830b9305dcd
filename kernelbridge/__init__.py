"""kernelbridge: a stateful, sandboxed Python for AI agents, served over MCP.

The public API is what ``__all__`` names, the settings and the errors, kept stable
(tests/unit/test_structure.py pins it); everything else may move. ``import kernelbridge`` imports
only those, so every command stays light. The layers and the processes: docs/architecture.md.

    import kernelbridge

    settings = kernelbridge.load_settings()  # from KERNELBRIDGE_* variables; raises ConfigError
    settings.limits.memory  # "512m"; each error kernelbridge raises is a KernelBridgeError
"""

from kernelbridge.config import SandboxLimits, Settings, load_settings
from kernelbridge.errors import (
    AgentMismatch,
    ConfigError,
    EngineRefused,
    ExitKind,
    HubError,
    ImageError,
    KernelBridgeError,
    KernelDied,
    LimitsNotEnforced,
    NoHostServers,
    RpcError,
    RuntimeUnavailable,
    SandboxError,
    SandboxFileError,
    SandboxStartFailed,
    SandboxStartTimeout,
    ServerFailure,
    SessionError,
    SkillError,
)

__version__ = "0.1.0"
DISTRIBUTION = "kernelbridge-mcp"
"""The name on the package index (``pipx install kernelbridge-mcp``, ``uvx kernelbridge-mcp``): the
index's ``kernelbridge`` is an unrelated project. The import package and the command stay
``kernelbridge``."""

__all__ = [
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
]

# As httpcore does: tracebacks and reprs name the errors where users import them from
# (``kernelbridge.SessionError``, not ``kernelbridge.errors.SessionError``); pickling finds them
# here too. Not the settings dataclasses: typing.get_type_hints resolves their (string)
# annotations in the namespace ``__module__`` names, which is errors.py's and config.py's own.
for _name in __all__:
    _value = globals()[_name]
    if isinstance(_value, type) and issubclass(_value, BaseException | ExitKind):
        _value.__module__ = "kernelbridge"
del _name, _value

"""kernelbridge: a stateful, sandboxed Python for AI agents, served over MCP.

General layout (one direction of dependency, top to bottom; docs/architecture.md is the map):

- ``cli``        the ``kernelbridge`` command: one module per command group, ``doctor``, ``setup``
- ``server``     MCP tools and resources; the one place results and notes become prose for a model
- ``session``    session registry, a session's state machine, the cell runner and its timeout policy,
                 the session store (records and journals by generation), one cell's outputs, outcomes
- ``notebook``   the journal, journal <-> nbformat, exports, replay
- ``hub``        the user's host MCP servers: config, client pool, policy, docs, skills, rpc dispatch
- ``jupyter``    jupyter_client integration: a KernelProvisioner whose kernel process is a tunnel
                 process, a kernel manager, the kernelspec (for plain Jupyter clients)
- ``host``       the bridge's side of one sandbox: ``Sandbox``, the one tunnel owner (also the tunnel
                 process's), the guarded sandbox state, its container, policy, warm pool
- ``tunnel``     host end of the tunnel: real ZMQ sockets <-> frames on the container's stdio; the
                 control channel's typed messages (``Ready``, ``Exited``, ``RpcRequest``, ...)
- ``runtime``    container engines behind one seam (the engine API, the CLI, the Pod manifest):
                 the only code that runs podman or docker or speaks their API
- ``image``      builds and checks the sandbox image, through the runtime's image store
- ``config``     ``Settings`` from ``KERNELBRIDGE_*`` variables
- ``errors``     every error the host raises (the tree in its docstring), ``ExitKind``
- ``ratelimit``  the one budget for host log lines a sandbox or a client can cause
- ``frames``     the frame codec shared with the sandbox agent (stdlib only)
- ``inside``     everything that runs inside the container: the agent, what it loads into the kernel
- ``testing``    test doubles for tests and benches (the product never imports it)

This module is the public API: what ``__all__`` names is kept stable (tests/unit/test_structure.py
pins it); everything else may move. It imports only the settings and the errors, so that
``import kernelbridge`` (every command does) stays light.
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

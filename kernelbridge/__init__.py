"""kernelbridge: a stateful, sandboxed Python for AI agents, served over MCP.

General layout (one direction of dependency, top to bottom; see docs/architecture.md):

- ``server``     MCP tools and resources; the one place results and notes become prose for a model
- ``session``    session registry, a session's state machine, the cell runner and its timeout policy,
                 the session store (records and journals by generation), one cell's outputs, outcomes
- ``notebook``   the journal, journal <-> nbformat, exports, replay
- ``jupyter``    jupyter_client integration: a KernelProvisioner whose kernel process is a tunnel
                 process, a kernel manager, the kernelspec (for plain Jupyter clients)
- ``host``       the bridge's side of one sandbox: ``Sandbox``, the one tunnel owner (also the tunnel
                 process's), the guarded sandbox state, its container, policy, warm pool
- ``tunnel``     host end of the tunnel: real ZMQ sockets <-> frames on the container's stdio; the
                 control channel's typed messages (``Ready``, ``Exited``, ``RpcRequest``, ...)
- ``runtime``    container runtimes (podman, docker): argv, start, stop, reap orphans
- ``image``      builds and checks the sandbox image
- ``errors``     every error the host raises (the tree in its docstring), ``ExitKind``
- ``frames``     the frame codec shared with the sandbox agent (stdlib only)
- ``inside``     everything that runs inside the container: the agent, what it loads into the kernel
"""

from kernelbridge.config import SandboxLimits, Settings, load_settings
from kernelbridge.errors import (
    AgentMismatch,
    ConfigError,
    ImageError,
    KernelBridgeError,
    KernelDied,
    RuntimeUnavailable,
    SandboxError,
    SessionError,
)

__version__ = "0.1.0"

__all__ = [
    "AgentMismatch",
    "ConfigError",
    "ImageError",
    "KernelBridgeError",
    "KernelDied",
    "RuntimeUnavailable",
    "SandboxError",
    "SandboxLimits",
    "SessionError",
    "Settings",
    "__version__",
    "load_settings",
]

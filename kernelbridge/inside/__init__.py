"""Everything that runs INSIDE the sandbox container: the agent (``agent/``, PID 1), what it loads into
ipykernel (``kernel/``) and the ``mcp`` package sandbox code imports (``pythonpath/mcp/``, docs/rpc.md).

Nothing here imports host code: the two sides share only :mod:`kernelbridge.frames` and
:mod:`kernelbridge.transitions` (stdlib only). The host takes from here only this package's location
(the image recipe copies these files; the hub loads ``pythonpath/mcp/_signature.py`` by path) and a
few names both sides must agree on (``handover``'s, ``kernel.HOST_CELL``).
"""

"""Everything that runs INSIDE the sandbox container. It shares one module with the host:
:mod:`kernelbridge.frames`, the frame codec (stdlib only); nothing here imports anything else of
kernelbridge. The host takes little from here: this package's location (the image recipe copies
these files, the hub loads the kernel's signature rules from ``pythonpath/mcp/_signature.py``), a
few names the two sides must agree on (``handover``'s, ``kernel.HOST_CELL``).

General layout:

``agent/``
    The agent process, the container's PID 1 (``python -m kernelbridge.inside.agent``, the
    image's CMD): the host link (frames on the container's stdin/stdout), the kernel process and
    the agent's ZMQ client of it, the rpc relay, file requests, PID-1 chores, and the poll loop
    that glues them. Standard library, pyzmq and ``kernelbridge.frames`` only.
``kernel/``
    Loaded INTO the ipykernel process by the agent's argv: the kernel class (history replies),
    the capped output stream, and the IPython extension that bounds history.
``pythonpath/mcp/``
    On the kernel's PYTHONPATH: the ``mcp`` package that sandbox code imports (docs/rpc.md).
``AGENT_HASH``
    In an image only: the agent hash the image builder wrote (``kernelbridge.image``); the agent
    refuses a host that expects another.
"""

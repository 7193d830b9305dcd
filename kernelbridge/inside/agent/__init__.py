"""The sandbox agent: the container's main process (PID 1), the container end of the tunnel.

Modules, each owning one thing (the poll loop only glues them):

``host_link.py``       the host: the ``hello``, frames in from stdin and out to stdout (never
                       blocking), rate-limited log frames, and the link's state
``kernel_process.py``  the ipykernel subprocess: argv, start, interrupt, stop escalation, restart
                       kill, its output pipe, exit descriptions
``kernel_client.py``   the ZMQ sockets to the kernel, sending and receiving, the proof that iopub
                       delivers before ``ready``
``rpc_relay.py``       the kernel's host MCP calls over a socketpair (docs/rpc.md)
``files.py``           the host's file requests on /workspace
``init.py``            PID-1 chores: non-dumpable, reaping orphans, SIGTERM/SIGHUP
``write_queue.py``     the non-blocking byte queue of stdout and of the rpc socket
``relay.py``           the poll loop: glue only
``__main__.py``        ``python -m kernelbridge.inside.agent``

Dependencies point one way: ``relay`` uses all the others; ``host_link`` and ``rpc_relay`` use
``write_queue``; ``kernel_process`` uses ``init``; nothing imports ``relay`` but ``__main__``.
Standard library, pyzmq and ``kernelbridge.frames`` only: this runs in the image.
"""

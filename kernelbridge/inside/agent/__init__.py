"""The sandbox agent: the container's main process (PID 1), the container end of the tunnel.

``python -m kernelbridge.inside.agent`` (the image's CMD). Each module owns one thing; ``relay``, the
poll loop, only glues them, and nothing imports it but ``__main__``. Standard library, pyzmq,
:mod:`kernelbridge.frames` and :mod:`kernelbridge.transitions` only: this runs in the image.
Design: docs/design/sandbox.md.
"""

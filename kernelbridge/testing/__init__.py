"""Test doubles and helpers that tests and benches import; nothing in the product uses them.

- :class:`LocalProcessRuntime`: a runtime that runs the agent as a plain local subprocess (no
  container, no isolation), for fast tests of the tunnel, the sessions and the server;
- :class:`MemoryImages`: an image store in memory (the local double's, and a seam for tests of
  the image builder);
- :func:`ensure_sandbox_image`: the current sandbox image in a runtime's store, built if needed,
  for the synchronous session fixtures of the container tests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from kernelbridge.testing.images import MemoryImages
from kernelbridge.testing.runtime import LocalProcessRuntime

if TYPE_CHECKING:
    from kernelbridge.image import ImageContents

__all__ = ["LocalProcessRuntime", "MemoryImages", "ensure_sandbox_image"]


def ensure_sandbox_image(
    runtime: str | None = "podman-cli",
    *,
    contents: ImageContents | None = None,
    log: Callable[[str], None] = lambda line: None,
) -> str:
    """The tag of the current sandbox image (of ``contents``) in the store of ``runtime`` (a
    ``KERNELBRIDGE_RUNTIME`` value; None: the settings'), built first if missing or stale.
    Synchronous: for session fixtures, outside any event loop. The default asks podman's store
    through its CLI: the same store as its API, without starting a service for one question."""
    from kernelbridge.config import load_settings
    from kernelbridge.image import DEFAULT_CONTENTS, ensure_image
    from kernelbridge.runtime import open_runtime

    settings = load_settings()
    if runtime is not None:
        settings = dataclasses.replace(settings, runtime=runtime)

    async def ensure() -> str:
        async with open_runtime(settings) as backend:
            return await ensure_image(backend.images, log=log, contents=contents or DEFAULT_CONTENTS)

    return anyio.run(ensure)

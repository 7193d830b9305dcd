"""An exec session (``attach_exec``) runs as it is told to, on every backend that can reattach: as
the given uid and gid, in the given working directory (not the container's /workspace), with the
given variables set over the container's own. The adoption's handover relies on each (issue 23:
a handover that started in /workspace imported what kernel code planted there).
"""

from __future__ import annotations

from dataclasses import replace

import anyio
import pytest
from runtime_harness import make_spec

from kernelbridge.runtime import RuntimeBackend
from kernelbridge.testing import LocalProcessRuntime

pytestmark = pytest.mark.anyio

STEP = 60.0
REPORT = ("sh", "-c", 'echo "$(id -u):$(id -g)|$(pwd)|$PATH|${LD_PRELOAD-unset}|${FROM_SPEC-unset}"')


async def test_an_exec_session_runs_as_told(backend: RuntimeBackend, sandbox_image: str) -> None:
    spec = replace(make_spec(sandbox_image, ("cat",), durable=True), env=(("FROM_SPEC", "1"),))
    with anyio.fail_after(STEP):
        if not (await backend.info()).reattach:
            pytest.skip(f"{backend.name} cannot attach again (RuntimeInfo.reattach is False)")
        container = await backend.create(spec)
        try:
            first = await backend.attach(container)
            exec_env = (("PATH", "/usr/bin:/bin"), ("LD_PRELOAD", ""))
            stream = await backend.attach_exec(
                container, REPORT, user="65533:65533", workdir="/", env=exec_env
            )
            said = b""
            while not said.endswith(b"\n"):
                said += await stream.receive()
            await stream.aclose()
            await first.aclose()
        finally:
            await backend.remove([container])
    ids, cwd, path, preload, from_spec = said.decode().strip().split("|")
    assert (cwd, path, preload) == ("/", "/usr/bin:/bin", ""), said
    if isinstance(backend, LocalProcessRuntime):
        return  # the double runs every "exec" as this user, and shares no environment
    assert ids == "65533:65533", said
    if backend.engine == "kubernetes":
        return  # pods/exec runs in the handover container, which has the pod's env, not the sandbox's
    assert from_spec == "1", said  # the container's own variables stay: the engine merges

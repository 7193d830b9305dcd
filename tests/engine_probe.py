"""What the engine says of one container, asked strictly: a failing engine is an error of the
test, never an answer (``podman ps`` printing nothing because it failed is not "gone")."""

from __future__ import annotations

import subprocess


def container_exists(container: str) -> bool:
    """Whether podman has ``container`` (a name or id). Raises RuntimeError when podman cannot say."""
    done = subprocess.run(
        ["podman", "container", "exists", container], capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode not in (0, 1):
        raise RuntimeError(f"podman container exists {container}: {done.stderr.strip() or done.returncode}")
    return done.returncode == 0


async def gone(container: str, timeout: float = 60.0) -> bool:
    """Wait (bounded) until podman has no ``container``; False if it still has it then."""
    import anyio

    with anyio.move_on_after(timeout):
        while True:
            if not container_exists(container):
                return True
            await anyio.sleep(0.2)
    return False

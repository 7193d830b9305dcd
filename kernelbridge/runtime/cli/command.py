"""One bounded call of the ``podman`` / ``docker`` command line, its failure in one line.

Shared by the CLI backend's containers (``backend``) and images (``images``): the "connection" of
the CLI is its executable, its working directory and the environment it inherits (``DOCKER_HOST``
and the like). The markers of the CLIs' stderr that mean "no such container" / "no such image"
are read here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import anyio

from kernelbridge.errors import RuntimeUnavailable

CLI_TIMEOUT = 30.0
"""Why 30 s: `podman ps`/`rm` answer in well under a second here, but a busy machine starting 20
sandboxes at once can stall the client for several seconds. Past this the runtime is wedged."""
ERROR_CHARS = 500

_NO_CONTAINER = ("no such container", "no container with name or id")
_NO_IMAGE = ("image not known", "no such image", "unable to find image", "not found: image", "no such object")


@dataclass(frozen=True, slots=True)
class Cli:
    """A runtime CLI: ``engine`` (``podman`` | ``docker``) run as ``executable`` in ``workdir``."""

    engine: str
    executable: str
    workdir: Path | None = None
    """Working directory of the CLI processes: podman's conmon drops an ``oom`` file in its working
    directory after an OOM kill, which must not land wherever the bridge was started."""

    def cwd(self) -> str | None:
        if self.workdir is None:
            return None
        self.workdir.mkdir(parents=True, exist_ok=True, mode=0o700)
        return str(self.workdir)

    async def run(self, *args: str, timeout: float = CLI_TIMEOUT) -> str:
        """``<executable> args...``; its stdout. Raises RuntimeUnavailable with the last line of
        its stderr (or why it did not run, or did not answer within ``timeout``)."""
        try:
            with anyio.fail_after(timeout):
                result = await anyio.run_process([self.executable, *args], check=False, cwd=self.cwd())
        except TimeoutError:
            raise RuntimeUnavailable(
                f"`{self.engine} {args[0]}` did not answer within {timeout:g} s"
            ) from None
        except OSError as exc:
            raise RuntimeUnavailable(f"cannot run {self.executable}: {exc.strerror}") from None
        if result.returncode != 0:
            err = result.stderr.decode(errors="replace").strip().splitlines()
            reason = err[-1] if err else f"exit status {result.returncode}"
            raise RuntimeUnavailable(f"`{self.engine} {args[0]}` failed: {reason[:ERROR_CHARS]}")
        return result.stdout.decode(errors="replace")


def container_gone(exc: Exception) -> bool:
    """The CLI said that the container does not exist."""
    text = str(exc).lower()
    return any(marker in text for marker in _NO_CONTAINER)


def image_missing(exc: Exception) -> bool:
    """The CLI said that the image does not exist."""
    text = str(exc).lower()
    return any(marker in text for marker in _NO_IMAGE)

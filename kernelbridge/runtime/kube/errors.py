"""The cluster's failures in kernelbridge's words: one line each, from lightkube's ``ApiError``,
httpx2's transport errors and the API server's ``Status`` bodies (``kernelbridge.errors``)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import anyio
import httpx2
from lightkube import ApiError

from kernelbridge.errors import EngineRefused, RuntimeUnavailable


class ClusterRefused(EngineRefused):
    """The API server answered with an error status (``status``: 403, 404, 409, ...)."""


def status_message(body: bytes) -> tuple[str, str]:
    """(message, reason) of a ``Status`` body, or its text."""
    text = body[:4096].decode(errors="replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return " ".join(text.split())[:300], ""
    if not isinstance(data, dict):
        return "", ""
    return " ".join(str(data.get("message") or "").split())[:300], str(data.get("reason") or "")


def refused(where: str, what: str, status: int, message: str, reason: str = "") -> ClusterRefused:
    hint = ""
    if status == 403:
        hint = " (the bridge's credentials lack this right: see docs/kubernetes.md for the Role it needs)"
    elif status == 401:
        hint = " (the credentials were not accepted)"
    text = f"{where} refused {what}: {message or f'HTTP {status}'}{hint}"
    return ClusterRefused(text, status, reason or message)


@contextlib.contextmanager
def translated(where: str, what: str, timeout: float) -> Iterator[None]:
    """Bound a call by ``timeout`` and turn every failure of the cluster into
    RuntimeUnavailable (ClusterRefused when it answered with an error status)."""
    try:
        with anyio.fail_after(timeout):
            yield
    except TimeoutError:
        raise RuntimeUnavailable(f"{where} did not answer {what} within {timeout:g} s") from None
    except ApiError as exc:
        status = exc.status
        raise refused(where, what, int(status.code or 0), status.message or "", status.reason or "") from None
    except httpx2.ConnectError as exc:
        raise RuntimeUnavailable(f"cannot reach {where}: {_reason(exc)}") from None
    except httpx2.TimeoutException:
        raise RuntimeUnavailable(f"{where} did not answer {what} within {timeout:g} s") from None
    except httpx2.HTTPError as exc:
        raise RuntimeUnavailable(f"{where} broke off {what}: {_reason(exc)}") from None
    except OSError as exc:
        raise RuntimeUnavailable(f"cannot reach {where}: {exc.strerror or exc}") from None


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] or type(exc).__name__


def is_status(exc: BaseException, *codes: int) -> bool:
    return isinstance(exc, ClusterRefused) and exc.status in codes

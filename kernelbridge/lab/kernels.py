"""The lab's kernels: one per live session of one namespace, connected, never owned.

Kernels are found, not started: :meth:`SessionKernels.refresh` connects a :class:`SessionKernel`
(``owns_kernel=False``) to each new live session's connection file, with a console and a notebook
(``<name>.ipynb``) session on it. A session that left keeps its kernel, marked gone and ``dead``,
while a page is connected to it; then it is forgotten. Starting, shutting down or restarting a kernel
from the page is refused with one line (HTTP 403); an interrupt is passed on as an
``interrupt_request``. When the lab stops it only closes its own sockets.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpec, KernelSpecManager, NoSuchKernel
from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager, ServerKernelManager
from jupyter_server.utils import ApiPath
from tornado import web
from traitlets import Unicode

from kernelbridge.jupyter.kernelspec import KERNEL_NAME
from kernelbridge.lab.listing import LiveSession, gone_line, live_sessions, session_of_notebook
from kernelbridge.session.store import SessionStore

log = logging.getLogger(__name__)

START_REFUSED = (
    "kernelbridge lab starts no kernels: it shows the agent's live sessions (under Running); "
    "a session begins when the agent runs code in it (run_python)"
)
DISPLAY_NAME = "kernelbridge (the agent's sessions)"
MAX_WAITING = 1000
"""The page's unanswered cells a kernel remembers (a person types a few)."""


def refused(live: LiveSession, what: str) -> web.HTTPError:
    """The page's one line for an action on the agent's kernel that the lab does not do."""
    return web.HTTPError(
        403,
        f"kernelbridge lab does not {what} session {live.session!r}: it belongs to the agent "
        "(the agent's close_session ends it, `kernelbridge sessions close` too)",
    )


class SessionKernel(ServerKernelManager):
    """jupyter_client's manager of one live session's kernel, connected through the session's
    connection file; it owns no process (``owns_kernel=False``)."""

    live: LiveSession
    gone: str | None = None
    """The line a cell sent after the session left gets (:func:`~.listing.gone_line`); None: live."""
    waiting: collections.OrderedDict[str, tuple[Any, dict[str, Any]]]
    """The page's execute requests without a reply yet: msg_id -> (its connection, its header)."""

    def wait_for_reply(self, request: dict[str, Any], connection: Any) -> None:
        msg_id = request.get("msg_id")
        if isinstance(msg_id, str):
            self.waiting[msg_id] = (connection, request)
            while len(self.waiting) > MAX_WAITING:
                self.waiting.popitem(last=False)

    def replied(self, msg_id: object) -> None:
        if isinstance(msg_id, str):
            self.waiting.pop(msg_id, None)

    def leave(self, line: str) -> None:
        """The session left: say so, and end the page's cells that wait for it with ``line``."""
        self.gone, self.execution_state, self.reason = line, "dead", line
        while self.waiting:
            connection, request = self.waiting.popitem(last=False)[1]
            connection.answer_gone(request, line)

    @property
    def ready(self) -> asyncio.Future[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    # jupyter_client types these as its sync wrappers; the async classes assign coroutines there.
    async def is_alive(self) -> bool:  # type: ignore[override]
        # Its life is the store's word (refresh); a page joining a gone one gets the line.
        return True

    async def interrupt_kernel(self) -> None:  # type: ignore[override]
        if self.gone is not None:
            raise web.HTTPError(409, self.gone)
        channel = self.connect_control()  # a ZMQStream: its sends wait for the loop unless flushed
        try:
            self.session.send(channel, "interrupt_request", {})
            channel.flush()
        finally:
            channel.close(linger=1000)  # what was sent still leaves


class SessionKernels(AsyncMappingKernelManager):
    """The live sessions of one namespace's state directory as jupyter_server's kernels."""

    state_dir = Unicode(help="the namespace's state directory (kernelbridge lab sets it)").tag(config=True)
    namespace = Unicode("", help="the HTTP token's namespace; empty: the user's own").tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.store = SessionStore.of_namespace(Path(self.state_dir), self.namespace)
        self.refreshing = asyncio.Lock()

    def session_kernel(self, kernel_id: str) -> SessionKernel:
        self._check_kernel_id(kernel_id)
        kernel: SessionKernel = self._kernels[kernel_id]
        return kernel

    # -- the list of sessions --------------------------------------------------------------------
    async def refresh(self) -> None:
        """Kernels for the sessions that came, gone marks for those that left (see the module
        docstring); the gone ones no page is connected to are forgotten."""
        async with self.refreshing:
            live = live_sessions(self.store)
            for kernel_id in list(self._kernels):
                kernel = self.session_kernel(kernel_id)
                if kernel_id not in live and kernel.gone is None:
                    kernel.leave(gone_line(self.store, kernel.live))
                    log.info("%s", kernel.gone)
                if kernel.gone is not None and not self._kernel_connections.get(kernel_id):
                    self.forget(kernel_id)
            for kernel_id, session in live.items():
                if kernel_id not in self._kernels:
                    await self.join(session)

    async def join(self, live: LiveSession) -> None:
        """Connect to ``live``'s kernel and give it a console and a notebook session."""
        kernel = SessionKernel(
            parent=self,
            log=self.log,
            context=self.context,
            connection_file=str(live.connection_file),
            kernel_name=KERNEL_NAME,
            kernel_id=live.kernel_id,
            owns_kernel=False,
        )
        try:
            kernel.load_connection_file()
        except (OSError, ValueError) as exc:  # it went away between the listing and now
            log.info("session %s: its connection file cannot be read (%s)", live.session, exc)
            return
        kernel.live, kernel.waiting = live, collections.OrderedDict()
        kernel.execution_state, kernel.reason = "idle", ""
        self._kernels[live.kernel_id] = kernel
        self._kernel_connections[live.kernel_id] = 0
        self._kernel_ports[live.kernel_id] = kernel.ports
        self.start_watching_activity(live.kernel_id)
        sessions = self.parent.session_manager  # type: ignore[union-attr]  # the ServerApp made it
        for path, kind in ((live.session, "console"), (live.notebook, "notebook")):
            await sessions.create_session(path=path, name=path, type=kind, kernel_id=live.kernel_id)
        log.info("session %s: listed as kernel %s", live.session, live.kernel_id)

    def forget(self, kernel_id: str) -> None:
        """Close the lab's sockets to a kernel and drop it (its sessions go with it)."""
        self.stop_watching_activity(kernel_id)
        self.stop_buffering(kernel_id)
        self._kernel_connections.pop(kernel_id, None)
        self._kernel_ports.pop(kernel_id, None)
        self.remove_kernel(kernel_id)

    # -- what the page may not do ----------------------------------------------------------------
    # Async, as AsyncMultiKernelManager's are (jupyter_client types them as its sync wrappers).
    async def start_kernel(  # type: ignore[override]
        self, *, kernel_id: str | None = None, path: ApiPath | None = None, **kwargs: Any
    ) -> str:
        if kernel_id is not None and kernel_id in self:
            return kernel_id
        session = session_of_notebook(path or "")
        if session is not None:
            raise web.HTTPError(
                403,
                f"session {session!r} is not live: {session}.ipynb is its journal, read-only "
                "(kernelbridge lab starts no kernels)",
            )
        raise web.HTTPError(403, START_REFUSED)

    async def shutdown_kernel(self, kernel_id: str, now: bool = False, restart: bool = False) -> None:  # type: ignore[override]
        kernel = self.session_kernel(kernel_id)
        if kernel.gone is not None:  # nothing left to shut down: the page may drop it
            self.forget(kernel_id)
            return
        raise refused(kernel.live, "shut down")

    async def restart_kernel(self, kernel_id: str, now: bool = False) -> None:  # type: ignore[override]
        raise refused(self.session_kernel(kernel_id).live, "restart")

    async def shutdown_all(self, now: bool = False) -> None:  # type: ignore[override]
        """The lab stops: its sockets close; every session runs on."""
        for kernel_id in list(self._kernels):
            self.forget(kernel_id)

    _async_start_kernel = start_kernel
    _async_shutdown_kernel = shutdown_kernel  # type: ignore[assignment]
    _async_restart_kernel = restart_kernel
    _async_shutdown_all = shutdown_all


class SessionSpecs(KernelSpecManager):
    """The one kernelspec the lab's kernels and the sessions' notebooks name (``kernelbridge``);
    never launched (:class:`SessionKernels` starts nothing)."""

    resources = Unicode(help="an empty directory: the spec's resources (kernelbridge lab makes it)").tag(
        config=True
    )

    def find_kernel_specs(self) -> dict[str, str]:
        return {KERNEL_NAME: self.resource_dir}

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        if kernel_name != KERNEL_NAME:
            raise NoSuchKernel(kernel_name)
        spec: KernelSpec = self.kernel_spec_class(
            resource_dir=self.resource_dir,
            argv=["false"],  # never run: a kernel spec must name a command
            display_name=DISPLAY_NAME,
            language="python",
            interrupt_mode="message",  # passed on as an interrupt_request (SessionKernel)
            metadata={"kernelbridge": {"lab": True}},
        )
        return spec

    def get_all_specs(self) -> dict[str, dict[str, Any]]:
        spec = self.get_kernel_spec(KERNEL_NAME)
        return {KERNEL_NAME: {"resource_dir": spec.resource_dir, "spec": spec.to_dict()}}

    @property
    def resource_dir(self) -> str:
        return str(self.resources)

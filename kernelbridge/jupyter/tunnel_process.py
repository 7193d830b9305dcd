"""The tunnel as a process of its own: what a plain Jupyter client's kernel "process" is::

    python -m kernelbridge.jupyter.tunnel_process --control-fd N [--log-file F]

:class:`~kernelbridge.jupyter.provisioner.SandboxProvisioner` starts it; everything else arrives
on the control channel (fd N, one end of the provisioner's ``socketpair``; nothing secret is in
argv): a ``Launch``, then ``Interrupt``/``Restart``/``Shutdown``; it answers ``Ready`` (started,
and after each restart) and, last, one ``Exited``. The sandbox runs through the same
:class:`~kernelbridge.host.owner.TunnelOwner` as a bridge's. Its kernel has no bridge: host MCP
calls are answered ``unavailable`` at once, ``%pip install``'s by a
:class:`~kernelbridge.packages.PackageService` of its own. SIGTERM (``terminate``, or its parent's
death: PR_SET_PDEATHSIG) stops the sandbox gracefully and removes its container; SIGINT interrupts.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import json
import logging
import logging.handlers
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial

import anyio
import anyio.abc

from kernelbridge.calls import NoHub, RpcCall, RpcHandler
from kernelbridge.errors import ExitKind, KernelBridgeError, NoHostServers, RpcError, exit_of
from kernelbridge.host.admission import ADMISSION
from kernelbridge.host.container import AttachedContainer, started_container
from kernelbridge.host.owner import AgentEvent, TunnelOwner
from kernelbridge.host.policy import preflight
from kernelbridge.jupyter.launch import settings_of, spec_of
from kernelbridge.packages import PackageService, WithPackages
from kernelbridge.runtime import ContainerSpec, RuntimeBackend, open_runtime
from kernelbridge.runtime.flags import WORKDIR, sandbox_flags, unsupported
from kernelbridge.tunnel import (
    ControlMessage,
    Exited,
    Interrupt,
    Launch,
    Restart,
    RpcRequest,
    RpcResponse,
    Shutdown,
    SocketControlChannel,
)

log = logging.getLogger("kernelbridge.tunnel")

LAUNCH_TIMEOUT = 30.0
"""Seconds to wait for the provisioner's ``Launch``."""
TELL_TIMEOUT = 5.0
"""Bound on telling the provisioner something (it may be gone)."""
LOG_FILE_BYTES = 1024 * 1024


async def serve(control: SocketControlChannel) -> int:
    """Run one sandbox for the provisioner on ``control``; returns the exit status.

    Signal handlers are armed first: a SIGTERM that arrives while the container is being created
    (jupyter_client giving up on a start) must still remove it, which ending by the default
    action would not.
    """
    status = 1
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        with anyio.fail_after(LAUNCH_TIMEOUT):
            launch = await control.receive()
        if not isinstance(launch, Launch):
            log.error("the first control message was a %s, not a launch", launch.TYPE)
            return 2
        try:
            connection = json.loads(await anyio.Path(launch.connection_file).read_text())
        except (OSError, ValueError) as exc:
            await _tell(control, Exited(None, *exit_of(exc)))
            return 1
        settings = settings_of(launch)
        spec = spec_of(launch, settings)
        packages = PackageService(settings)
        owner = TunnelOwner(
            spec.name,
            session=spec.session,
            agent_hash=launch.agent_hash,
            start_timeout=settings.kernel_start_timeout,
            connection=connection,
        )
        async with anyio.create_task_group() as outer:
            outer.start_soon(_on_signals, signals, owner, outer.cancel_scope)
            try:
                # The checks a bridge makes first (limits enforced, a kernelbridge image), then the start.
                async with open_runtime(settings) as runtime:
                    await preflight(settings, runtime, spec.image, launch.agent_hash)
                    spec = await _without_unsupported_notebook_dir(runtime, spec)
                    # A cold start takes its turn (host/admission.py), from creating the
                    # container until its kernel is ready; the provisioner's bound allows the wait.
                    async with contextlib.AsyncExitStack() as turn:
                        await turn.enter_async_context(ADMISSION.turn(spec.name))
                        async with started_container(runtime, spec) as container:
                            run = partial(_run_sandbox, control, owner, container, packages, spec)
                            exited = await run(started=turn.aclose)
                # The agent's own status, or 0 when it said nothing (the container just ended).
                status = 0 if exited.status == 0 or exited.kind is ExitKind.CONTAINER_EXITED else 1
            except (KernelBridgeError, OSError) as exc:  # before there was a sandbox
                await _tell(control, Exited(None, *exit_of(exc)))
            outer.cancel_scope.cancel()
    return status


async def _run_sandbox(
    control: SocketControlChannel,
    owner: TunnelOwner,
    container: AttachedContainer,
    packages: PackageService,
    spec: ContainerSpec,
    started: Callable[[], Awaitable[None]],
) -> Exited:
    """Run the sandbox until it ends; tell the provisioner ``Ready`` when it is (``started``
    first: its turn to start ends), and its last word as soon as it is known (before the
    container is removed, which may take a while)."""
    exited: Exited | None = None
    async with anyio.create_task_group() as tg:
        calls = WithPackages(packages, NoHub(NoHostServers.PLAIN_JUPYTER))  # the bridge's one router
        on_event = partial(_answer_rpc, owner, calls, spec, tg)
        try:
            await tg.start(partial(owner.serve, container, peer=None, on_event=on_event))
        except KernelBridgeError as exc:  # the start failed (caught here: not as an ExceptionGroup)
            exited = Exited(None, *exit_of(exc))
        else:
            assert owner.ready is not None
            await started()
            await _tell(control, owner.ready)
            tg.start_soon(_commands, control, owner, tg)
            await owner.ended.wait()
        tg.cancel_scope.cancel()
    if exited is None:
        exited = owner.exited or Exited(None, ExitKind.CONTAINER_EXITED, "the tunnel ended without an exit")
    await _tell(control, exited)
    return exited


async def _answer_rpc(
    owner: TunnelOwner,
    calls: RpcHandler,
    spec: ContainerSpec,
    tg: anyio.abc.TaskGroup,
    event: AgentEvent,
) -> None:
    """No bridge, no hub: ``calls`` answers (the package service, else ``unavailable``), each as a
    task (the event pump must not wait for pip)."""
    if isinstance(event, RpcRequest):
        call = RpcCall(spec.session, frozenset(), event.method, event.params, sandbox=spec.name)
        tg.start_soon(_answer, owner, calls, event.id, call)


async def _answer(owner: TunnelOwner, calls: RpcHandler, request_id: object, call: RpcCall) -> None:
    try:
        result = await calls.dispatch(call)
    except RpcError as exc:
        owner.send(RpcResponse(request_id, error=exc.to_wire()))
        return
    owner.send(RpcResponse(request_id, result=result))


async def _without_unsupported_notebook_dir(runtime: RuntimeBackend, spec: ContainerSpec) -> ContainerSpec:
    """``spec``, without the notebook's directory on /workspace if this engine cannot mount it as
    it must be (docker: not nosuid,nodev,noexec); the kernel then starts in an empty /workspace."""
    if not any(mount.target == WORKDIR for mount in spec.mounts):
        return spec
    info = await runtime.info()
    if unsupported(info.engine, sandbox_flags(spec)) is None:
        return spec
    log.warning(
        "the %s engine cannot mount the notebook's directory read-only; it is not mounted", info.engine
    )
    return dataclasses.replace(spec, mounts=tuple(m for m in spec.mounts if m.target != WORKDIR))


async def _commands(control: SocketControlChannel, owner: TunnelOwner, tg: anyio.abc.TaskGroup) -> None:
    """Provisioner -> owner. A restart is answered with ``Ready`` once the new kernel is (nothing
    if it is not within the start timeout: the provisioner's own wait then gives up)."""
    while True:
        try:
            command: ControlMessage = await control.receive()
        except anyio.EndOfStream:
            await owner.close()  # the provisioner is gone: stop the sandbox as if asked to
            return
        if isinstance(command, Interrupt):
            owner.interrupt()
        elif isinstance(command, Restart):
            tg.start_soon(_restart, control, owner)
        elif isinstance(command, Shutdown):
            tg.start_soon(owner.close)
        else:
            log.warning("ignored a %s from the provisioner", command.TYPE)


async def _restart(control: SocketControlChannel, owner: TunnelOwner) -> None:
    if await owner.restart(owner.start_timeout) and owner.ready is not None:
        await _tell(control, owner.ready)


async def _tell(control: SocketControlChannel, message: ControlMessage) -> None:
    with contextlib.suppress(anyio.BrokenResourceError), anyio.move_on_after(TELL_TIMEOUT):
        await control.send(message)


async def _on_signals(signals: AsyncIterator[int], owner: TunnelOwner, scope: anyio.CancelScope) -> None:
    """SIGINT: interrupt the kernel. SIGTERM/SIGHUP: stop the sandbox gracefully once it runs
    (bounded), or abandon a start in progress at once (its container is removed on the way out)."""
    async for signum in signals:
        if signum == signal.SIGINT:
            owner.interrupt()
        elif owner.ready is None or not owner.alive:  # starting, or a second SIGTERM
            scope.cancel()
            return
        else:
            await owner.close()  # then the sandbox's end is told and the process exits


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


def configure_logging(log_file: str | None) -> None:
    """Log to ``log_file`` (else stderr), capped: a sandbox must not fill the host's disk."""
    handler: logging.Handler = (
        logging.handlers.RotatingFileHandler(log_file, maxBytes=LOG_FILE_BYTES, backupCount=1)
        if log_file
        else logging.StreamHandler()
    )
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])


def main(argv: list[str] | None = None) -> int:
    _die_with_parent()
    os.umask(0o077)
    parser = argparse.ArgumentParser(prog="python -m kernelbridge.jupyter.tunnel_process")
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--log-file", default=None)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    configure_logging(args.log_file)
    control = SocketControlChannel(socket.socket(fileno=args.control_fd))
    try:
        return anyio.run(serve, control)
    except TimeoutError:
        log.error("no launch frame within %.0f s", LAUNCH_TIMEOUT)
        return 2


if __name__ == "__main__":
    sys.exit(main())

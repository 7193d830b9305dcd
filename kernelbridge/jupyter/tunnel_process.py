"""The tunnel as a process of its own: what a plain Jupyter client's kernel "process" is.

``jupyter console --kernel kernelbridge``, nbclient and jupyter_server manage kernels as
processes; :class:`~kernelbridge.kernel.provisioner.SandboxProvisioner` starts this one::

    python -m kernelbridge.kernel.tunnel_process --control-fd N [--log-file F]

Everything else arrives on the control channel (fd N, one end of a ``socketpair`` the provisioner
made, so nobody else can talk to this process): first a ``launch`` frame (the container spec, the
connection file, the runtime settings), then ``interrupt``/``restart``/``shutdown``; it answers
``ready`` and ``exit`` events with a structured kind. Nothing secret is in its argv.

Host MCP: a kernel started this way has no bridge, so every ``rpc_request`` of its code is
answered here with ``unavailable`` ("no host MCP servers in this kernel"), at once.

Signals keep Popen's meaning: SIGTERM (jupyter_client's ``terminate``) stops the sandbox
gracefully and removes its container; SIGINT becomes an ``interrupt``. The process also gets
SIGTERM when its parent dies (PR_SET_PDEATHSIG), so a killed Jupyter leaves no container running.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import logging
import logging.handlers
import os
import secrets
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.abc
import zmq

from kernelbridge import frames
from kernelbridge.config import EngineSettings, SandboxLimits, Settings
from kernelbridge.errors import AgentMismatch, ImageError, KernelBridgeError
from kernelbridge.kernel.launch import checked_container
from kernelbridge.runtime import ContainerSpec, open_runtime
from kernelbridge.tunnel import FrameChannel, SocketFrameChannel, Tunnel, memory_channel_pair

log = logging.getLogger("kernelbridge.tunnel")

LAUNCH_TIMEOUT = 30.0
"""Seconds to wait for the provisioner's ``launch`` frame."""
SHUTDOWN_GRACE = 3.0
LOG_FILE_BYTES = 1024 * 1024
NO_HUB = (
    "no host MCP servers in this kernel: it was started by a plain Jupyter client, "
    "not by a kernelbridge bridge"
)


class _Commands:
    """Where commands for the sandbox go once its tunnel runs (None while it starts)."""

    def __init__(self) -> None:
        self.channel: FrameChannel | None = None
        self.ended = anyio.Event()


async def serve(control: SocketFrameChannel) -> int:
    """Run one sandbox for the provisioner on ``control``; returns the exit status.

    Signal handlers are armed first: a SIGTERM that arrives while the container is being created
    (jupyter_client giving up on a start) must still remove it, which ending by the default
    action would not.
    """
    status = 1
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        with anyio.fail_after(LAUNCH_TIMEOUT):
            launch = await control.receive()
        if launch.get("type") != frames.LAUNCH:
            log.error("the first control frame was %s, not launch", launch.get("type"))
            return 2
        commands = _Commands()
        async with anyio.create_task_group() as outer:
            outer.start_soon(_on_signals, signals, commands, outer.cancel_scope)
            status = await _run_sandbox(control, launch, commands)
            outer.cancel_scope.cancel()
    return status


def _settings(launch: frames.Frame) -> Settings:
    engine = dict(launch.get("engine") or {})
    engine.update(
        urls=tuple(engine.get("urls") or ()),
        ssh_command=tuple(engine.get("ssh_command") or ("ssh",)),
        cert_path=Path(engine["cert_path"]) if engine.get("cert_path") else None,
        # One kernel is not worth a podman service of its own: use a system socket, else the CLI.
        start_service=False,
    )
    return Settings(
        state_dir=Path(str(launch["state_dir"])),
        runtime=launch.get("runtime"),
        engine=EngineSettings(**engine),
        limits=SandboxLimits(**launch.get("limits") or {}),
        kernel_start_timeout=float(launch.get("start_timeout") or 60.0),
        allow_unlimited=bool(launch.get("allow_unlimited")),
    )


async def _run_sandbox(control: SocketFrameChannel, launch: frames.Frame, commands: _Commands) -> int:
    settings = _settings(launch)
    container = dict(launch["container"])
    labels = tuple((str(k), str(v)) for k, v in container.pop("labels", []))
    spec = ContainerSpec(**container, labels=labels, limits=settings.limits)
    connection = json.loads(await anyio.Path(str(launch["connection_file"])).read_text())
    try:
        # The checks a bridge makes first (limits enforced, a kernelbridge image), then the start.
        agent = launch.get("agent_hash")
        async with (
            open_runtime(settings) as runtime,
            checked_container(settings, runtime, spec, agent) as (_, stream),
        ):
            owner_end, tunnel_end = memory_channel_pair()
            tunnel = Tunnel(
                stream,
                tunnel_end,
                connection=connection,
                session=spec.session,
                kernel_key=secrets.token_hex(32),
                agent_hash=launch.get("agent_hash"),
            )
            relayed = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(_relay_to_owner, owner_end, control, relayed)
                tg.start_soon(_relay_from_owner, control, owner_end)
                commands.channel = owner_end
                await tunnel.run()
                commands.channel = None
                commands.ended.set()
                # The tunnel's exit event is in the memory channel: close the tunnel's end so the
                # relay passes on what is buffered, then ends.
                await tunnel_end.aclose()
                with anyio.move_on_after(SHUTDOWN_GRACE):
                    await relayed.wait()
                tg.cancel_scope.cancel()
            exit_frame = tunnel.exit_frame
    except ImageError as exc:
        await _send_exit(control, frames.EXIT_IMAGE_MISSING, str(exc))
        return 1
    except AgentMismatch as exc:  # seen on the image's label, before starting it
        await _send_exit(control, frames.EXIT_AGENT_MISMATCH, str(exc))
        return 1
    except zmq.ZMQError as exc:
        await _send_exit(control, frames.EXIT_START_FAILED, f"cannot bind the kernel ports: {exc}")
        return 1
    except (KernelBridgeError, OSError) as exc:
        await _send_exit(control, frames.EXIT_START_FAILED, str(exc))
        return 1
    return 0 if exit_frame is None or exit_frame.get("status") == 0 else 1


async def _relay_to_owner(
    tunnel_events: FrameChannel, control: SocketFrameChannel, done: anyio.Event
) -> None:
    """Tunnel -> provisioner; rpc requests are answered here (no hub in a plain Jupyter kernel)."""
    try:
        while True:
            try:
                frame = await tunnel_events.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                return
            if frame["type"] == frames.RPC_REQUEST:
                error = {"kind": "unavailable", "message": NO_HUB}
                with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                    await tunnel_events.send(
                        {"type": frames.RPC_RESPONSE, "id": frame.get("id"), "error": error}
                    )
                continue
            with contextlib.suppress(anyio.BrokenResourceError):
                await control.send(frame)
    finally:
        done.set()


async def _relay_from_owner(control: SocketFrameChannel, tunnel_commands: FrameChannel) -> None:
    while True:
        try:
            frame = await control.receive()
        except anyio.EndOfStream:
            # The provisioner is gone: stop the sandbox as if asked to.
            await tunnel_commands.send({"type": frames.SHUTDOWN})
            return
        await tunnel_commands.send(frame)


async def _on_signals(signals: AsyncIterator[int], commands: _Commands, scope: anyio.CancelScope) -> None:
    """SIGINT: interrupt the kernel. SIGTERM/SIGHUP: stop the sandbox gracefully when it runs
    (bounded), or abandon a start in progress at once (its container is removed on the way out)."""
    async for signum in signals:
        channel = commands.channel
        if signum == signal.SIGINT:
            if channel is not None:
                await channel.send({"type": frames.INTERRUPT})
            continue
        if channel is not None:
            await channel.send({"type": frames.SHUTDOWN})
            with anyio.move_on_after(SHUTDOWN_GRACE):
                await commands.ended.wait()
        scope.cancel()
        return


async def _send_exit(control: SocketFrameChannel, kind: str, reason: str) -> None:
    with contextlib.suppress(anyio.BrokenResourceError), anyio.move_on_after(5):
        await control.send(
            {"type": frames.EXIT, "status": None, "kind": kind, "reason": frames.clip(reason, 500)}
        )


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
    parser = argparse.ArgumentParser(prog="python -m kernelbridge.kernel.tunnel_process")
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--log-file", default=None)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    configure_logging(args.log_file)
    control = SocketFrameChannel(socket.socket(fileno=args.control_fd))
    try:
        return anyio.run(serve, control)
    except TimeoutError:
        log.error("no launch frame within %.0f s", LAUNCH_TIMEOUT)
        return 2


if __name__ == "__main__":
    sys.exit(main())

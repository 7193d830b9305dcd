"""``kernelbridge setup``: make this machine ready for an installed kernelbridge, in one command.

Steps, in order, each said: the Debian packages (installed with apt-get as root only; anyone else
gets the ``sudo`` line), what mmdebstrap's unshare mode and rootless podman need, the state
directory, rootless podman's storage driver (switched to ``overlay`` only on a storage still empty),
the sandbox image, ``doctor``, and the ``mcpServers`` entry that works on this host as it is
(:func:`kernelbridge_command`, :func:`entry_env`). Every container chore goes through
:mod:`kernelbridge.runtime`; setup itself runs only apt-get.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from kernelbridge import DISTRIBUTION, __version__
from kernelbridge.cli.doctor import run_doctor
from kernelbridge.config import DEFAULT_IMAGE_PROFILE, IMAGE_PROFILES, Settings, check_state_dir
from kernelbridge.errors import KernelBridgeError

if TYPE_CHECKING:
    from kernelbridge.cli.command import Subcommands
    from kernelbridge.image import ImageContents
    from kernelbridge.runtime import RuntimeInfo

# command -> the Debian package that provides it
NEEDED = {"podman": "podman", "runc": "runc", "mmdebstrap": "mmdebstrap"}
ROOTLESS_NEEDED = {"newuidmap": "uidmap"}


def add_parsers(sub: Subcommands) -> None:
    setup = sub.add_parser("setup", help="check this machine, build the sandbox image, run doctor")
    setup.add_argument("--with", dest="packages", action="append", default=[], metavar="PACKAGE",
                       help="add a Python package to the image (repeatable)")  # fmt: skip
    setup.add_argument("--profile", choices=IMAGE_PROFILES,
                       help="the image's package set: full (default) or minimal (smaller)")  # fmt: skip
    setup.set_defaults(run=cmd_setup)


def cmd_setup(args: argparse.Namespace, settings: Settings) -> int:
    if args.profile is not None:
        settings = dataclasses.replace(settings, image_profile=args.profile)
    return run_setup(settings, packages=args.packages)


def say(message: str) -> None:
    print(f"setup: {message}", flush=True)


def missing_packages(root: bool) -> list[str]:
    """Debian packages whose commands are missing here."""
    needed = dict(NEEDED)
    if not root:
        needed.update(ROOTLESS_NEEDED)
    return sorted({package for command, package in needed.items() if shutil.which(command) is None})


SHIM_DIRS = ("PIPX_BIN_DIR", "UV_TOOL_BIN_DIR", "XDG_BIN_HOME")
"""Variables naming where pipx and uv put their command shims (default ``~/.local/bin``)."""
PASSED_SETTINGS = ("DOCKER_HOST", "CONTAINER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_TLS", "DOCKER_CERT_PATH")
"""Engine variables the bridge reads like docker and podman do: an MCP client's environment may
lack them, so the entry carries the ones setup saw."""
SECRET_SETTINGS = ("HTTP_TOKENS", "HTTP_TOKENS_FILE")


def kernelbridge_command(env: Mapping[str, str] | None = None) -> tuple[str, list[str]]:
    """The command and arguments an MCP client should run for this installation's ``serve``.

    The stable path, not the private one: pipx and ``uv tool install`` keep the package in a
    virtualenv of their own (``~/.local/share/pipx/venvs/...``, ``~/.local/share/uv/tools/...``)
    that an upgrade may rebuild, and link its scripts from a bin directory (``~/.local/bin``); the
    link is what a client should name. A throw-away environment (``uvx``, ``pipx run``) has no
    stable path at all: the entry then runs it the same way again.
    """
    env = os.environ if env is None else env
    own = Path(sys.executable).with_name("kernelbridge")
    prefix = Path(sys.prefix).resolve()
    if _ephemeral(prefix, env, "uv"):
        return "uvx", [DISTRIBUTION, "serve"]
    if _ephemeral(prefix, env, "pipx"):
        return "pipx", ["run", "--spec", DISTRIBUTION, "kernelbridge", "serve"]
    if own.exists():
        for shim in _shim_candidates(env):
            try:
                if (
                    shim.exists()
                    and shim.resolve() == own.resolve()
                    and shim.parent.resolve() != own.parent.resolve()
                ):
                    return str(shim), ["serve"]
            except OSError:
                continue
        return str(own), ["serve"]
    found = shutil.which("kernelbridge")
    return (found, ["serve"]) if found else (sys.executable, ["-m", "kernelbridge.cli", "serve"])


def _shim_candidates(env: Mapping[str, str]) -> list[Path]:
    home = Path(env.get("HOME") or os.path.expanduser("~"))
    dirs = [Path(env[name]) for name in SHIM_DIRS if env.get(name)]
    dirs.append(home / ".local" / "bin")
    dirs += [Path(p) for p in env.get("PATH", "").split(os.pathsep) if p]
    return [d / "kernelbridge" for d in dict.fromkeys(dirs)]


def _ephemeral(prefix: Path, env: Mapping[str, str], tool: str) -> bool:
    """Whether this interpreter's environment is a throw-away one of ``uvx`` or ``pipx run``."""
    home = Path(env.get("HOME") or os.path.expanduser("~"))
    cache_home = Path(env.get("XDG_CACHE_HOME") or home / ".cache")
    if tool == "uv":
        roots = [Path(env["UV_CACHE_DIR"])] if env.get("UV_CACHE_DIR") else []
        roots.append(cache_home / "uv")
    else:
        roots = [Path(env["PIPX_HOME"]) / ".cache"] if env.get("PIPX_HOME") else []
        roots += [home / ".local" / "pipx" / ".cache", home / ".local" / "share" / "pipx" / ".cache"]
        roots.append(cache_home / "pipx")
    for root in roots:
        try:
            if prefix.is_relative_to(root.resolve()):
                return True
        except OSError:
            continue
    return False


UNLIMITED_NEEDED = (
    "this host's container runtime ignores memory and pid limits (rootless podman on cgroup v1), so"
    " sandboxes start only with KERNELBRIDGE_ALLOW_UNLIMITED=1; sandboxed code can then use all the"
    " host's memory and processes. For enforced limits run podman as root, or on cgroup v2 with the"
    " memory and pids controllers delegated"
)


def settings_for_host(settings: Settings, info: RuntimeInfo | None) -> tuple[Settings, str | None]:
    """``settings`` as a bridge (or a kernelspec's kernel) needs them to start sandboxes on the
    runtime that said ``info`` (None: it did not answer, nothing is decided), and why they changed
    (None: they did not): ``KERNELBRIDGE_ALLOW_UNLIMITED`` where it cannot enforce limits, without
    which every sandbox is refused."""
    if info is None or info.limits_enforced or settings.allow_unlimited:
        return settings, None
    return dataclasses.replace(settings, allow_unlimited=True), UNLIMITED_NEEDED


def entry_env(
    settings: Settings, contents: ImageContents, env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment ``serve`` (the printed entry) and a kernelspec's kernels need on this host:
    the ``KERNELBRIDGE_*`` and engine variables of ``env`` (secrets excepted), the image's profile
    (unless it is the default) and extra packages, ``KERNELBRIDGE_ALLOW_UNLIMITED`` when
    ``settings`` allow it (:func:`settings_for_host`)."""
    env = os.environ if env is None else env
    out: dict[str, str] = {}
    for key in sorted(env):
        name = key.removeprefix("KERNELBRIDGE_").removeprefix("MCP_BRIDGE_")
        if name != key and name not in SECRET_SETTINGS and env[key].strip():
            out[f"KERNELBRIDGE_{name}"] = env[key]
        elif key in PASSED_SETTINGS and env[key].strip():
            out[key] = env[key]
    # The profile setup built (or `--profile` chose) wins over the environment's, which it replaced.
    out.pop("KERNELBRIDGE_IMAGE_PROFILE", None)
    if contents.profile != DEFAULT_IMAGE_PROFILE:
        out["KERNELBRIDGE_IMAGE_PROFILE"] = contents.profile
    if contents.extras:
        out["KERNELBRIDGE_IMAGE_PACKAGES"] = " ".join(contents.extras)
        out.pop("KERNELBRIDGE_IMAGE_REQUIREMENTS", None)  # folded into the packages above
    if settings.allow_unlimited:
        out["KERNELBRIDGE_ALLOW_UNLIMITED"] = "1"
    return out


async def storage_and_image(
    settings: Settings, contents: ImageContents, *, rootless: bool
) -> tuple[str, RuntimeInfo]:
    """Steps 4 and 5: the storage driver (rootless only), then the image; its tag and what the
    runtime said of itself. Raises KernelBridgeError (one line) when the runtime cannot be used
    or the build fails."""
    from kernelbridge.image import build_image
    from kernelbridge.runtime import VFS_WARNING, open_runtime, rootless_storage_conf, use_overlay_storage

    if rootless:
        async with open_runtime(settings) as runtime:
            info = await runtime.info()
        # The runtime is closed again first: a podman service of ours would keep the old storage open.
        if info.engine == "podman" and info.rootless and info.storage_driver == "vfs":
            switched = await use_overlay_storage()
            say(
                f"rootless podman's storage was empty and on vfs: switched it to {switched}"
                f" ({rootless_storage_conf()})"
                if switched
                else VFS_WARNING
            )
    async with open_runtime(settings) as runtime:
        tag = await build_image(runtime.images, contents=contents, log=say)
        return tag, await runtime.info()


def run_setup(settings: Settings, packages: list[str]) -> int:
    """Run every step (module docstring); returns the exit status."""
    from kernelbridge.image import contents_from_settings
    from kernelbridge.image.rootfs import unshare_problem

    root = os.geteuid() == 0
    who = "root" if root else "a normal user"
    command, _ = kernelbridge_command()
    say(f"{DISTRIBUTION} {__version__} ({command}), running as {who}")
    missing = missing_packages(root)
    if missing and not root:
        say(f"missing system packages: {' '.join(missing)}")
        say(f"install them with: sudo apt-get update && sudo apt-get install -y {' '.join(missing)}")
        return 1
    if missing:
        say(f"installing {' '.join(missing)} with apt-get ...")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *missing]):
            if subprocess.run(argv, env=env, check=False).returncode != 0:
                say(f"`{' '.join(argv)}` failed; install {' '.join(missing)} yourself and run setup again")
                return 1
    if not root and (problem := unshare_problem()) is not None:
        say(problem)
        return 1
    check_state_dir(settings)
    say(f"state directory: {settings.state_dir}")
    contents = contents_from_settings(settings).plus(packages)
    try:
        tag, info = anyio.run(partial(storage_and_image, rootless=not root), settings, contents)
    except KernelBridgeError as exc:
        say(str(exc))
        return 1
    say(f"sandbox image: {tag} ({contents.describe()})")
    settings, why = settings_for_host(settings, info)
    if why:
        say(f"{why}: the entry below sets it, without which every call is refused")
    # Doctor (and the bridge) must look for the image of these packages, not the plain one.
    settings = dataclasses.replace(settings, image_packages=contents.extras, image_requirements=None)
    say("doctor:")
    status = anyio.run(run_doctor, settings)
    env = entry_env(settings, contents)
    command, args = kernelbridge_command()
    entry = {"command": command, "args": args, **({"env": env} if env else {})}
    say("an MCP client runs it with this entry in its mcpServers:")
    print(json.dumps({"mcpServers": {"python": entry}}, indent=2))
    if status != 0:
        say("doctor found a problem (the FAIL lines above say what to do)")
    return status

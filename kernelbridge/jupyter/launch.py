"""The ``Launch`` message a provisioner sends its tunnel process: built from settings, read back.

The tunnel process has no bridge and no environment of its own to read settings from; everything
it needs (the container spec, the runtime and engine settings, the limits, the start timeout)
comes in this one message on its control socket, never in argv (visible in ``ps``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from kernelbridge.config import EngineSettings, Mount, PackageSettings, SandboxLimits, Settings
from kernelbridge.jupyter.client_env import display_env
from kernelbridge.runtime import ContainerSpec
from kernelbridge.tunnel import Launch


def launch_for(
    *, connection_file: str, spec: ContainerSpec, agent_hash: str | None, settings: Settings
) -> Launch:
    """What a tunnel process must start for ``spec``."""
    container = {
        "image": spec.image,
        "name": spec.name,
        "session": spec.session,
        "owner_pid": spec.owner_pid,
        "owner_host": spec.owner_host,
        "labels": [list(pair) for pair in spec.labels],
        "mounts": [[str(mount.source), mount.target] for mount in spec.mounts],
        "env": [list(pair) for pair in spec.env],
    }
    engine = dataclasses.asdict(settings.engine)
    engine["cert_path"] = str(engine["cert_path"]) if engine["cert_path"] else None
    return Launch(
        connection_file=connection_file,
        agent_hash=agent_hash,
        container=container,
        limits={name: getattr(settings.limits, name) for name in settings.limits.__slots__},
        runtime=settings.runtime,
        engine=engine,
        state_dir=str(settings.state_dir),
        start_timeout=settings.kernel_start_timeout,
        allow_unlimited=settings.allow_unlimited,
        packages={
            "policy": settings.packages.policy,
            "allowed": sorted(settings.packages.allowed),
            "max_bytes": settings.packages.max_bytes,
            "max_installs": settings.packages.max_installs,
            "cache_bytes": settings.packages.cache_bytes,
        },
    )


def settings_of(launch: Launch) -> Settings:
    """The tunnel process's settings, from its launch."""
    engine: dict[str, Any] = dict(launch.engine)
    engine.update(
        urls=tuple(engine.get("urls") or ()),
        ssh_command=tuple(engine.get("ssh_command") or ("ssh",)),
        cert_path=Path(engine["cert_path"]) if engine.get("cert_path") else None,
        # One kernel is not worth a podman service of its own: use a system socket, else the CLI.
        start_service=False,
    )
    return Settings(
        state_dir=Path(launch.state_dir),
        runtime=launch.runtime,
        engine=EngineSettings(**engine),
        limits=SandboxLimits(**launch.limits),
        kernel_start_timeout=launch.start_timeout,
        allow_unlimited=launch.allow_unlimited,
        packages=_packages_of(launch.packages),
    )


def _packages_of(raw: dict[str, Any]) -> PackageSettings:
    """The launch's package settings (the defaults for a provisioner that sent none)."""
    defaults = PackageSettings()
    try:
        return PackageSettings(
            policy=str(raw.get("policy", defaults.policy)),
            allowed=frozenset(str(name) for name in raw.get("allowed", [])),
            max_bytes=int(raw.get("max_bytes", defaults.max_bytes)),
            max_installs=int(raw.get("max_installs", defaults.max_installs)),
            cache_bytes=int(raw.get("cache_bytes", defaults.cache_bytes)),
        )
    except (TypeError, ValueError):
        return PackageSettings(policy="none")  # a launch we cannot read installs nothing


def spec_of(launch: Launch, settings: Settings) -> ContainerSpec:
    """The container to start, from its launch."""
    container = dict(launch.container)
    labels = tuple((str(k), str(v)) for k, v in container.pop("labels", []))
    # The provisioner checked each mount (config.check_mount) and the display settings; a forged
    # Launch could only come from the process that owns this one's control socket, and is checked
    # again all the same (the display settings).
    mounts = tuple(Mount(Path(source), str(target)) for source, target in container.pop("mounts", []))
    env = display_env(dict((str(k), str(v)) for k, v in container.pop("env", [])))
    return ContainerSpec(**container, labels=labels, env=env, limits=settings.limits, mounts=mounts)

"""What a bridge may start: the image and agent it expects, checked against its runtime.

:func:`preflight` checks what must hold before any sandbox starts (limits enforced, or allowed not
to be; a kernelbridge image with the expected agent); :class:`SandboxGate` holds the bridge's
verdict (:class:`SandboxPolicy`) and decides again while the verdict may still change (a daemon
started, an image built). The tunnel process of a plain Jupyter client runs :func:`preflight` itself.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import anyio

from kernelbridge.config import Settings
from kernelbridge.errors import KernelBridgeError, LimitsNotEnforced, SandboxError
from kernelbridge.image import (
    PACKAGES_LABEL,
    agent_hash,
    check_labels,
    contents_from_settings,
    default_image,
    parse_packages,
)
from kernelbridge.runtime import RuntimeBackend

log = logging.getLogger(__name__)

UNLIMITED_REFUSAL = (
    "sandboxes are refused on this host: its container runtime ({why}) ignores memory and process"
    " limits, so a sandbox could take all of the host's memory; the operator can run podman as root"
    " or on cgroup v2, or accept unlimited sandboxes with KERNELBRIDGE_ALLOW_UNLIMITED=1"
)


def expected_image(settings: Settings) -> tuple[str, str]:
    """(image, the agent hash the host expects inside it).

    An explicit ``KERNELBRIDGE_IMAGE`` is used as given (:func:`verify_image` checks its labels);
    without one, the image named after this kernelbridge's own files and the configured profile
    and extra packages. Either way the agent in the image must be this kernelbridge's: the agent itself
    refuses a host that expects another one. Raises ConfigError for a bad extras setting.
    """
    expected = agent_hash()
    if settings.image:
        return settings.image, expected
    return default_image(contents_from_settings(settings)), expected


async def verify_image(
    runtime: RuntimeBackend, image: str, expected_agent: str, *, explicit: bool = True
) -> dict[str, str]:
    """The labels of ``image``, once they show a kernelbridge image with the agent ``expected_agent``.

    Raises ImageError with one line (missing image, a plain image such as ``python:3.14-slim``
    that has no agent to talk to, an image of another kernelbridge) and how to build the right one.
    Checking before starting matters for a plain image: its own command would read our frames as
    input and never answer, so the start would only fail at its timeout.
    """
    labels = await runtime.images.labels(image)
    check_labels(image, labels, expected_agent, explicit=explicit)
    assert labels is not None
    return labels


@dataclass(frozen=True, slots=True)
class SandboxPolicy:
    """What a bridge may start, decided against its runtime: the image and agent it expects, the
    packages the image holds, and whether starting sandboxes is refused (and why)."""

    image: str
    agent_hash: str | None
    packages: tuple[str, ...] = ()
    """``name==version`` of the image's requested packages (its ``kernelbridge.packages`` label)."""
    refusal: str | None = None
    """Why no sandbox may start now (limits not enforced and not allowed, no runtime, a wrong or
    missing image); None: they may."""
    unlimited: bool = False
    """The runtime ignores memory and pid limits and the operator allowed that."""
    final: bool = True
    """Whether this answer holds for the bridge's life; a missing image or a stopped daemon may be
    fixed while it runs, so such a policy is decided again at the next call."""


async def preflight(
    settings: Settings, runtime: RuntimeBackend, image: str, agent: str | None
) -> tuple[dict[str, str], bool]:
    """Check what must hold before any sandbox starts: limits enforced (or allowed not to be) and
    the image a kernelbridge image with ``agent``. Returns (the image's labels, whether sandboxes
    run without limits). Raises LimitsNotEnforced, ImageError, RuntimeUnavailable (one line each)."""
    info = await runtime.info()
    if not info.limits_enforced and not settings.allow_unlimited:
        why = f"{'rootless ' if info.rootless else ''}{info.engine} on cgroups {info.cgroup_version or '?'}"
        raise LimitsNotEnforced(UNLIMITED_REFUSAL.format(why=why))
    if agent is None:
        labels = await runtime.images.labels(image) or {}
    else:
        labels = await verify_image(runtime, image, agent, explicit=bool(settings.image))
    return labels, not info.limits_enforced


async def sandbox_policy(settings: Settings, runtime: RuntimeBackend) -> SandboxPolicy:
    """Decide :class:`SandboxPolicy` for a bridge on ``runtime`` (never raises KernelBridgeError:
    what goes wrong becomes the refusal, one line)."""
    try:
        image, agent = expected_image(settings)
    except KernelBridgeError as exc:
        return SandboxPolicy(settings.image or "?", None, refusal=str(exc))
    try:
        labels, unlimited = await preflight(settings, runtime, image, agent)
    except LimitsNotEnforced as exc:
        return SandboxPolicy(image, agent, refusal=str(exc))
    except KernelBridgeError as exc:
        # A stopped daemon or a missing image can be fixed while the bridge runs.
        return SandboxPolicy(image, agent, refusal=str(exc), final=False)
    packages = tuple(parse_packages(labels.get(PACKAGES_LABEL)))
    return SandboxPolicy(image, agent, packages, unlimited=unlimited)


class SandboxGate:
    """The bridge's :class:`SandboxPolicy`, decided at start and again while it is not final."""

    def __init__(self, settings: Settings, runtime: RuntimeBackend, policy: SandboxPolicy) -> None:
        self.settings = settings
        self.runtime = runtime
        self.policy = policy
        self._lock = anyio.Lock()

    @classmethod
    async def open(cls, settings: Settings, runtime: RuntimeBackend) -> SandboxGate:
        policy = await sandbox_policy(settings, runtime)
        if policy.refusal:
            log.warning("%s", policy.refusal)
        return cls(settings, runtime, policy)

    async def check(self) -> SandboxPolicy:
        """The policy, once it allows sandboxes. Raises SandboxError with the refusal otherwise."""
        if self.policy.refusal and not self.policy.final:
            async with self._lock:
                if self.policy.refusal and not self.policy.final:
                    self.policy = await sandbox_policy(self.settings, self.runtime)
        if self.policy.refusal:
            raise SandboxError(self.policy.refusal)
        return self.policy

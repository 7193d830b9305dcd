"""A container's death as an engine's event log tells it, for one that is gone.

A durable sandbox is removed by the engine itself once it ends (``ContainerSpec.durable``), so
``inspect`` cannot tell how it ended; the engine's event log still can: its ``die`` event carries
the exit code and the container's labels. :func:`died` reads one event line in the two forms the
backends meet: the Docker events format (dockerd's API and CLI, podman's compat API: ``Action``
``die``, ``Actor.Attributes`` with ``exitCode``) and podman's own (``podman events --format
json``: ``Status`` ``died``, ``ContainerExitCode``, ``Attributes``). Lines are engine output, read
as untrusted: anything else is None.
"""

from __future__ import annotations

from typing import Any

from kernelbridge.runtime.base import ContainerInfo, ContainerState

ENGINE_ATTRIBUTES = frozenset(
    {"name", "image", "exitCode", "containerExitCode", "podId", "execDuration", "signal"}
)
"""Keys the engines add to an event's attributes beside the container's labels."""


def died(event: Any, container: str) -> ContainerInfo | None:
    """The exited container of one ``die`` event of ``container`` (id, name, labels, exit code),
    or None for anything else."""
    if not isinstance(event, dict):
        return None
    if event.get("Status") == "died":  # podman's own form
        attributes, cid, name = event.get("Attributes"), event.get("ID"), event.get("Name")
        code = event.get("ContainerExitCode")
    elif event.get("Action") == "die" and isinstance(event.get("Actor"), dict):
        actor = event["Actor"]
        attributes, cid = actor.get("Attributes"), actor.get("ID")
        code = name = None
        if isinstance(attributes, dict):
            code, name = (
                attributes.get("exitCode", attributes.get("containerExitCode")),
                attributes.get("name"),
            )
    else:
        return None
    labels = attributes if isinstance(attributes, dict) else {}
    text = str(code) if isinstance(code, int | str) else ""
    return ContainerInfo(
        id=str(cid or container),
        name=str(name or ""),
        labels={str(k): str(v) for k, v in labels.items() if k not in ENGINE_ATTRIBUTES},
        state=ContainerState.EXITED,
        exit_code=int(text) if text.lstrip("-").isdigit() else None,
    )

"""The rpc handler of ``kernelbridge replay``: recorded answers, live servers only where granted.

:class:`ReplayTools` answers ``call_tool`` from the recording
(:class:`~kernelbridge.replay.recorded.RecordedTools`), except calls to a server named with
``--grant``, which go to a hub that sees only those servers (on top of the operator's policy); the
docs methods from both; skills read only, ``save_tool`` refused (``denied``). A replay never makes
a host server do what the person did not ask for. Cells with unrecorded calls are skipped
(:meth:`ReplayTools.unrecorded`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import anyio

from kernelbridge.calls import RpcCall, RpcHandler
from kernelbridge.calls.wire import parse_request
from kernelbridge.config import Settings
from kernelbridge.errors import RpcError, SkillError
from kernelbridge.hub import skills
from kernelbridge.replay.recorded import RecordedTools, recorded_in_full, tool_calls

if TYPE_CHECKING:
    from kernelbridge.hub import Hub

WRITE_REFUSED = (
    "save_tool is refused during a replay: a replayed notebook never writes the saved tools "
    "(`kernelbridge skills` manages them)"
)


def live_settings(settings: Settings, grant: Iterable[str]) -> tuple[Settings, list[str]]:
    """Settings whose hub sees only the servers of ``grant`` (real names or aliases), and their
    real names. Raises HubError for a name that is not a configured server the operator allows."""
    from kernelbridge.hub import Hub

    live = Hub(settings).validate_grants(list(grant))  # reads the config; starts nothing
    exact = tuple("".join(f"[{c}]" if c in "*?[]" else c for c in name) for name in live)
    return dataclasses.replace(settings, allow_servers=exact), live


class ReplayTools(RpcHandler):
    """Answers a replay's rpc requests (see the module docstring)."""

    def __init__(self, cells: Iterable[Any], settings: Settings, hub: Hub | None, live: list[str]) -> None:
        self.recording = RecordedTools(cells)
        self._hub = hub
        self.live = list(live) if hub is not None else []
        self._store = settings.state_dir

    # -- for the runner and the session layer ---------------------------------------------------------
    def validate_grants(self, names: list[str]) -> list[str]:
        """A cell's ``servers``: live ones by the hub, the others by the recording. Raises HubError."""
        canonical: list[str] = []
        for name in names:
            live = self._live(name)
            for real in [live] if live is not None else self.recording.validate_grants([name]):
                if real not in canonical:
                    canonical.append(real)
        return canonical

    def unrecorded(self, cell: Any) -> list[str] | None:
        """The servers whose calls ``cell`` made were not recorded in full (it cannot be replayed
        faithfully), or None when it can be."""
        if recorded_in_full(cell, self.live):
            return None
        return sorted({str(c.get("server")) for c in tool_calls(cell)} - set(self.live))

    def begin(self, cell: Any) -> None:
        self.recording.begin(cell)

    # -- rpc ------------------------------------------------------------------------------------------
    def _live(self, name: object) -> str | None:
        if self._hub is None or not isinstance(name, str):
            return None
        real = self._hub.resolve(name)
        return real if real in self.live else None

    def _split(self, call: RpcCall) -> tuple[RpcCall, RpcCall]:
        """``call`` for the hub (live grants only) and for the recording (the others)."""
        live = frozenset(g for g in call.grants if g in self.live)
        return dataclasses.replace(call, grants=live), dataclasses.replace(call, grants=call.grants - live)

    async def dispatch(self, call: RpcCall) -> object:
        method, params = parse_request(call.method, call.params)
        if method == "save_tool":
            raise RpcError("denied", WRITE_REFUSED)
        if method in ("list_skills", "load_skill"):
            return await anyio.to_thread.run_sync(self._skills, method, params)
        to_hub, to_recording = self._split(call)
        if "server" in params:  # one server's business: whoever answers for it
            if self._hub is not None and self._live(params["server"]) is not None:
                return await self._hub.dispatch(to_hub)
            return await self.recording.dispatch(to_recording)
        recorded: Any = await self.recording.dispatch(to_recording)
        if self._hub is None:
            return recorded
        live: Any = await self._hub.dispatch(to_hub)
        key = next(iter(recorded))  # every answer without a server is one list under one key
        if method == "search_tool_docs":
            hits = sorted([*live[key], *recorded[key]], key=lambda hit: -float(hit.get("score", 0)))
            return {key: hits[: params["limit"]]}
        names = {_name(item) for item in live[key]}
        return {key: [*live[key], *(item for item in recorded[key] if _name(item) not in names)]}

    def _skills(self, method: str, params: dict[str, Any]) -> object:
        try:
            if method == "list_skills":
                infos = skills.list_skills(self._store)
                return {"skills": [{"name": i.name, "description": i.description, "saved_at": i.saved_at}
                                   for i in infos]}  # fmt: skip
            skill = skills.read_skill(self._store, params["name"])
        except SkillError as exc:
            raise RpcError("invalid_params", str(exc)) from None
        return {"name": skill.name, "source": skill.source, "description": skill.description}


def _name(item: Any) -> Any:
    return item.get("name") if isinstance(item, dict) else item

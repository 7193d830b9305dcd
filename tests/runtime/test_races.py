"""Many clients on one engine: a listing, a reap and a removal survive what the others do meanwhile.

Real podman, over a storage of the test's own (no other engineer's containers) served by two
``podman system service`` processes, as two bridges each with a service of their own are:

- deterministic: a container caught half-way through its removal (its storage gone, its record
  not yet: the moment podman's race shows, frozen) makes podman's own compat listing fail as a
  whole, as it did for the suite on a busy machine; our listing, inspect and reap get past it,
  through the engine API and the CLI;
- a race for real: another process creates, ends and removes containers in a tight loop, bounded
  in count and time, while this one lists and reaps; every listing and every reap succeeds, and
  the reaper removes the orphans it races the other process for.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx2
import pytest
from runtime_harness import Daemon, make_spec, remove_private_podman, start_private_podman, tiny_rootfs

from kernelbridge.runtime import CliRuntime, ContainerState, reap_orphans
from kernelbridge.runtime.base import ContainerSpec, RuntimeBackend
from kernelbridge.runtime.engine.api import open_engine
from kernelbridge.runtime.engine.endpoint import parse_endpoint
from kernelbridge.runtime.engine.transport import API_VERSION, EngineClient

pytestmark = [pytest.mark.anyio, pytest.mark.podman]

TINY = "localhost/kernelbridge-test-tiny:races"
RACE_LABEL = "kbtest.race"
CHURN_SECONDS = 20.0
CHURN_COUNT = 400
"""Bounds of the other process's loop (about 150 containers in 20 s on an idle machine here)."""
STEP = 120.0


@dataclass
class Engine:
    """A private podman storage and the services over it."""

    directory: Path
    services: list[Daemon]

    def podman(self, *args: str) -> str:
        """The podman CLI on this storage."""
        done = subprocess.run(
            [*self.cli_prefix(), *args], capture_output=True, text=True, timeout=60, check=True
        )
        return done.stdout.strip()

    def cli_prefix(self) -> list[str]:
        d = self.directory
        return ["podman", f"--root={d / 'root'}", f"--runroot={d / 'run'}", f"--tmpdir={d / 'tmp'}"]

    def url(self, n: int) -> str:
        return f"unix://{self.directory}/s{n}.sock"

    def restart(self) -> None:
        """Stop every service and start them again: they read the storage afresh."""
        for service in self.services:
            service.stop()
        self.services = [start_private_podman(self.directory, url=self.url(n)) for n in range(2)]


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed")
    directory = Path(tempfile.mkdtemp(prefix="kbrace-"))  # short: a socket path fits sun_path
    private = Engine(directory, [])
    try:
        private.restart()
        tarball = tiny_rootfs(directory / "tiny.tar")
        private.podman("import", "--change", 'CMD ["cat"]', str(tarball), TINY)
        yield private
    finally:
        for service in private.services:
            service.stop()
        remove_private_podman(directory)


@asynccontextmanager
async def engine_api(engine: Engine) -> AsyncIterator[RuntimeBackend]:
    """The engine API backend on service 0 (opened after any restart of the services)."""
    runtime = await open_engine(EngineClient(parse_endpoint(engine.url(0)), engine="podman"))
    try:
        yield runtime
    finally:
        await runtime.aclose()


def dead_pid() -> int:
    """The pid of a process that has exited: a bridge that is gone."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def orphan_spec(tag: str, owner: int) -> ContainerSpec:
    spec = make_spec(TINY, ("cat",), session="race")
    return dataclasses.replace(
        spec, owner_pid=owner, owner_host=socket.gethostname(), labels=(*spec.labels, (RACE_LABEL, tag))
    )


def half_remove(engine: Engine, container: str) -> None:
    """Drop ``container`` from the storage's own records, keeping podman's: the state its removal
    passes through (storage first, then the record), frozen. The services are restarted so that
    they read the storage afresh."""
    for service in engine.services:
        service.stop()
    records = engine.directory / "root" / "overlay-containers" / "containers.json"
    kept = [entry for entry in json.loads(records.read_text()) if entry["id"] != container]
    records.write_text(json.dumps(kept))
    engine.restart()


def compat_listing(engine: Engine) -> httpx2.Response:
    transport = httpx2.HTTPTransport(uds=f"{engine.directory}/s0.sock")
    with httpx2.Client(transport=transport, timeout=30) as client:
        return client.get(f"http://podman/{API_VERSION}/containers/json", params={"all": "true"})


def cli_on(engine: Engine, directory: Path) -> CliRuntime:
    """The CLI backend on the private storage: its executable is a shim adding the storage flags."""
    shim = directory / "podman-private"
    shim.write_text(f'#!/bin/sh\nexec {" ".join(engine.cli_prefix())} "$@"\n')
    shim.chmod(0o755)
    return CliRuntime(engine="podman", executable=str(shim), workdir=directory / "cli")


async def test_a_container_half_way_through_its_removal_fails_no_listing_nor_reap(
    engine: Engine, tmp_path: Path
) -> None:
    tag, owner = f"half-{os.getpid()}", dead_pid()
    with anyio.fail_after(STEP):
        async with engine_api(engine) as runtime:
            healthy = await runtime.create(orphan_spec(tag, owner))
            caught = await runtime.create(orphan_spec(tag, owner))
        half_remove(engine, caught)
        # What the suite met on a busy machine: podman's compat listing fails as a whole.
        refused = compat_listing(engine)
        assert refused.status_code == 500 and "container not known" in refused.text, refused.text
        async with engine_api(engine) as runtime, cli_on(engine, tmp_path) as cli:
            for backend in (runtime, cli):
                listed = {c.id for c in await backend.list({RACE_LABEL: tag})}
                assert healthy in listed, (backend.name, listed)
                assert await backend.inspect(caught) is None, backend.name  # going: gone
            # Both are orphans (their bridge is gone): the reap gets past the half-removed one.
            assert await reap_orphans(runtime) == 2
            assert await runtime.list({RACE_LABEL: tag}) == []
            assert await cli.list({RACE_LABEL: tag}) == []
        assert compat_listing(engine).status_code == 200


async def test_listings_and_reaps_while_another_process_creates_and_removes(engine: Engine) -> None:
    tag, owner = f"churn-{os.getpid()}", dead_pid()
    argv = [
        sys.executable, str(Path(__file__).with_name("churn.py")), engine.url(1), TINY,
        f"{RACE_LABEL}={tag}", str(owner), str(CHURN_SECONDS), str(CHURN_COUNT),
    ]  # fmt: skip
    churned: list[int] = []
    listings = reaped = 0

    async def other_process() -> None:  # killed if the test fails meanwhile (cancelled)
        done = await anyio.run_process(argv, check=True)
        churned.append(int(done.stdout.decode().strip() or "0"))

    async with engine_api(engine) as runtime:
        with anyio.fail_after(CHURN_SECONDS + STEP):
            async with anyio.create_task_group() as tg:
                tg.start_soon(other_process)
                while not churned:  # bounded: the other process ends within CHURN_SECONDS
                    listed = await runtime.list({RACE_LABEL: tag})
                    assert all(c.state is not ContainerState.UNKNOWN for c in listed), listed
                    reaped += await reap_orphans(runtime)
                    listings += 1
            # Once the other process is done, one more reap leaves none of its orphans behind.
            await reap_orphans(runtime)
            assert await runtime.list({RACE_LABEL: tag}) == []
    print(f"\n{churned[0]} containers churned; {listings} listings and reaps beside them, {reaped} reaped")
    assert churned[0] > 0 and listings > 10, (churned, listings)

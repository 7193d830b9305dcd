"""The package service's rpc methods on a seeded cache (no pip, no network): a plan, its chunks,
its record; the caps and the policy; plans belong to one sandbox; a restore's records are
installed as recorded; ``WithPackages`` routes only ``packages_*`` to it."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import zipfile
from pathlib import Path
from typing import Any

import anyio
import pytest

from kernelbridge.calls import RpcCall, RpcHandler
from kernelbridge.config import PackageSettings, load_settings
from kernelbridge.errors import RpcError
from kernelbridge.image.target import PIP_TARGET_FLAGS
from kernelbridge.packages import PackageService, WithPackages
from kernelbridge.packages.cache import resolution_key
from kernelbridge.packages.pip import Resolved
from kernelbridge.packages.record import InstallRecord, records_of
from kernelbridge.packages.service import CHUNK

ENVIRONMENT = ["numpy==2.4.6", "pandas==3.1.1"]


def make_wheel(directory: Path, name: str, version: str, payload: bytes) -> Path:
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}/__init__.py", payload)
        archive.writestr(f"{name}-{version}.dist-info/METADATA", f"Name: {name}\nVersion: {version}\n")
    return path


def service(tmp_path: Path, **packages: Any) -> PackageService:
    settings = load_settings({"KERNELBRIDGE_STATE_DIR": str(tmp_path / "state")})
    settings = dataclasses.replace(settings, packages=PackageSettings(**packages))
    return PackageService(settings)


def seed(
    svc: PackageService, tmp_path: Path, name: str, payload: bytes, requirement: str | None = None
) -> Resolved:
    """A wheel in the cache and a fresh resolution of ``requirement`` (default: the name) to it."""
    wheel = make_wheel(tmp_path, name, "1.0", payload)
    item = Resolved(name, "1.0", wheel.name, "", hashlib.sha256(wheel.read_bytes()).hexdigest(), True)
    svc.cache.add(wheel, item)
    svc.cache.store_resolution(resolution_key([requirement or name], PIP_TARGET_FLAGS), [item])
    return item


def call(method: str, params: object, session: str = "s", sandbox: str = "c1") -> RpcCall:
    return RpcCall(session, frozenset(), method, params, sandbox=sandbox)


def run(handler: RpcHandler, method: str, params: object, **where: str) -> Any:
    async def go() -> object:
        return await handler.dispatch(call(method, params, **where))

    return anyio.run(go)


def install(svc: PackageService, *requirements: str, **where: str) -> Any:
    params = {"requirements": list(requirements), "environment": ENVIRONMENT}
    return run(svc, "packages_install", params, **where)


def test_a_plan_its_chunks_and_its_record(tmp_path: Path) -> None:
    svc = service(tmp_path)
    payload = bytes(range(256)) * (CHUNK // 256 + 4000)  # over one chunk once zipped (stored, not deflated)
    item = seed(svc, tmp_path, "demo", payload)
    plan = install(svc, "demo")
    assert plan["source"] == "cache" and plan["satisfied"] == []
    (wheel,) = plan["install"]
    assert (wheel["name"], wheel["sha256"]) == ("demo", item.sha256)
    assert wheel["installed_size"] > wheel["size"] or wheel["installed_size"] >= len(payload)
    data, offset = b"", 0
    while offset < wheel["size"]:
        chunk = run(
            svc, "packages_fetch", {"plan": plan["plan"], "sha256": wheel["sha256"], "offset": offset}
        )
        piece = base64.b64decode(chunk["data"])
        assert 0 < len(piece) <= CHUNK and chunk["size"] == wheel["size"]
        data, offset = data + piece, offset + len(piece)
    assert hashlib.sha256(data).hexdigest() == item.sha256, "the wheel came through whole, in chunks"
    record = InstallRecord.from_json(run(svc, "packages_done", {"plan": plan["plan"], "ok": True}))
    assert record is not None and record.ok and record.requirements == ("demo",) and record.source == "cache"
    assert [(w.name, w.sha256) for w in record.installed] == [("demo", item.sha256)]
    with pytest.raises(RpcError, match="no such install"):
        run(svc, "packages_done", {"plan": plan["plan"], "ok": True})


def test_what_the_sandbox_has_is_satisfied_and_not_resolved(tmp_path: Path) -> None:
    svc = service(tmp_path)
    answer = install(svc, "numpy>=2", "pandas")
    assert answer == {
        "plan": None,
        "install": [],
        "satisfied": ["numpy 2.4.6", "pandas 3.1.1"],
        "source": "sandbox",
    }


def test_plans_belong_to_their_sandbox(tmp_path: Path) -> None:
    svc = service(tmp_path)
    seed(svc, tmp_path, "demo", b"x")
    plan = install(svc, "demo")
    sha = plan["install"][0]["sha256"]
    for other in ({"session": "other"}, {"sandbox": "c2"}):
        with pytest.raises(RpcError, match="no such install"):
            run(svc, "packages_fetch", {"plan": plan["plan"], "sha256": sha, "offset": 0}, **other)
    with pytest.raises(RpcError, match="not part of this install"):
        run(svc, "packages_fetch", {"plan": plan["plan"], "sha256": "0" * 64, "offset": 0})
    for offset in (-1, 10**9, True, "0"):
        with pytest.raises(RpcError, match="offset"):
            run(svc, "packages_fetch", {"plan": plan["plan"], "sha256": sha, "offset": offset})
    with pytest.raises(RpcError, match="unexpected parameter 'path'"):
        run(svc, "packages_fetch", {"plan": plan["plan"], "sha256": sha, "offset": 0, "path": "/etc/passwd"})


def test_the_caps_on_installs_and_bytes_and_the_policy(tmp_path: Path) -> None:
    svc = service(tmp_path, max_installs=2, max_bytes=10_000)
    seed(svc, tmp_path, "small", b"x" * 100)
    seed(svc, tmp_path, "big", b"y" * 50_000)
    with pytest.raises(RpcError) as too_big:
        install(svc, "big")
    assert too_big.value.kind == "too_large" and "KERNELBRIDGE_PACKAGES_MAX_BYTES" in too_big.value.message
    plan = install(svc, "small")
    run(svc, "packages_done", {"plan": plan["plan"], "ok": True})
    with pytest.raises(RpcError) as third:
        install(svc, "small", "big")
    assert third.value.kind == "denied" and "KERNELBRIDGE_PACKAGES_MAX_INSTALLS" in third.value.message
    assert "refused ones included" in third.value.message, "the refused install counted"
    fresh = install(svc, "small", sandbox="c2")  # a new sandbox of the session starts afresh
    assert fresh["plan"] is not None
    off = service(tmp_path, policy="none")
    with pytest.raises(RpcError, match="KERNELBRIDGE_PACKAGES=none"):
        install(off, "small")
    only = service(tmp_path, policy="names", allowed=frozenset({"small"}))
    assert install(only, "small")["plan"] is not None
    with pytest.raises(RpcError, match="big is not allowed"):
        install(only, "big")


def test_a_restore_installs_the_recorded_wheels(tmp_path: Path) -> None:
    svc = service(tmp_path)
    item = seed(svc, tmp_path, "demo", b"v1", requirement="elsewhere")  # no resolution of "demo"
    wheel = {"name": "demo", "version": "1.0", "filename": item.filename, "sha256": item.sha256}
    record = {"requirements": ["demo"], "ok": True, "installed": [{**wheel, "size": 1, "installed_size": 1}]}
    svc.prefer("", "s", records_of([record, {"junk": 1}, "x"]))
    plan = install(svc, "demo")
    assert plan["source"] == "recorded" and plan["install"][0]["sha256"] == item.sha256
    svc.prefer("", "s", [])


def test_with_packages_routes_only_packages_methods() -> None:
    class Inner(RpcHandler):
        async def dispatch(self, call: RpcCall) -> object:
            return {"inner": call.method}

    class Packages(PackageService):
        def __init__(self) -> None:
            pass

        async def dispatch(self, call: RpcCall) -> object:
            return {"packages": call.method}

    router = WithPackages(Packages(), Inner())
    assert run(router, "packages_install", {}) == {"packages": "packages_install"}
    assert run(router, "call_tool", {}) == {"inner": "call_tool"}
    assert run(router, "packages_nope", {}) == {"inner": "packages_nope"}, (
        "an unknown name is the hub's to refuse"
    )


def test_install_records_go_through_the_journal_into_the_notebook_and_back() -> None:
    import json

    from kernelbridge.notebook.convert import entry_cell
    from kernelbridge.notebook.journal import JournalCell, decode_entry

    wheel = {"name": "demo", "version": "1.0", "filename": "demo-1.0-py3-none-any.whl", "sha256": "ab" * 32,
             "size": 10, "installed_size": 20}  # fmt: skip
    record = InstallRecord.from_json(
        {"requirements": ["demo"], "installed": [wheel], "ok": True, "source": "index"}
    )
    assert record is not None
    line = json.dumps(JournalCell(code="%pip install demo", packages=[record.to_json()]).to_json())
    entry = decode_entry(line)
    assert isinstance(entry, JournalCell) and records_of(entry.packages) == [record]
    cell = entry_cell(entry)
    assert cell is not None and records_of(cell.metadata["kernelbridge"]["packages"]) == [record]
    plain = entry_cell(JournalCell(code="1"))
    assert plain is not None and "packages" not in plain.metadata["kernelbridge"], "only cells that installed"
    # Read back from a notebook, a record is untrusted: malformed wheels are dropped, fields bounded.
    forged = {
        "requirements": ["x" * 500, 3],
        "installed": [{**wheel, "sha256": "zz"}, {**wheel, "filename": "../x.whl"}],
    }
    (read,) = records_of([forged])
    assert read.installed == () and read.requirements == ("x" * 200,) and read.ok is False

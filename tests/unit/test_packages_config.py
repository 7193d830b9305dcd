"""The host's package service without a sandbox: requirement strings from the sandbox are parsed
and re-rendered (no option, URL or path survives), the policy and the mount rules say one line
each, pip's failures become one line each, and the wheel cache checks what it keeps."""

from __future__ import annotations

import hashlib
import json
import time
import zipfile
from pathlib import Path

import pytest

from kernelbridge.config import ConfigError, SandboxLimits, load_settings
from kernelbridge.errors import RpcError
from kernelbridge.image.target import PIP_TARGET_FLAGS, platforms
from kernelbridge.packages.cache import FRESH_FOR, CacheError, WheelCache, installed_size
from kernelbridge.packages.pip import Failure, Outcome, Resolved, classify, pip_env
from kernelbridge.packages.requirements import (
    PackagePolicy,
    parse_environment,
    parse_requirement,
    parse_requirements,
)

HOSTILE = [
    "--index-url=http://evil.example/simple",
    "--extra-index-url http://evil.example/simple",
    "-e .",
    "-e git+https://example.com/x.git#egg=x",
    "-r /etc/passwd",
    "--trusted-host evil.example",
    "-i http://evil.example",
    "requests --index-url http://evil.example",
    "requests @ https://evil.example/requests.whl",
    "pkg @ file:///etc/passwd",
    "./local/package",
    "../up",
    "/abs/path/pkg.whl",
    "git+https://github.com/x/y",
    "https://evil.example/x.tar.gz",
    "file:///tmp/x.whl",
    "x" * 300,
    "",
    "requests; os.system('id')",
]


@pytest.mark.parametrize("line", HOSTILE)
def test_hostile_requirement_lines_are_refused_in_one_line(line: str) -> None:
    with pytest.raises(RpcError) as caught:
        parse_requirement(line)
    assert caught.value.kind == "invalid_params"
    assert "\n" not in caught.value.message and len(caught.value.message) < 400


def test_requirements_are_rerendered_by_packaging_and_markers_judged_for_the_sandbox() -> None:
    wanted = parse_requirements(["Scikit_Learn>=1.0", "requests[socks] >= 2", "numpy; python_version < '3'"])
    assert [(w.name, w.text) for w in wanted] == [
        ("scikit-learn", "scikit-learn>=1.0"),
        ("requests", "requests[socks]>=2"),
    ], "the marker was false for CPython 3.11: numpy is dropped"
    windows_only = parse_requirement("pywin32; sys_platform == 'win32'")
    assert windows_only is None
    assert parse_requirement("tabulate==0.9.0").allows("0.9.0")  # type: ignore[union-attr]
    with pytest.raises(RpcError, match="named twice"):
        parse_requirements(["six", "Six>=1"])
    with pytest.raises(RpcError, match="non-empty list"):
        parse_requirements("six")
    with pytest.raises(RpcError, match="limit is 64"):
        parse_requirements([f"p{i}" for i in range(65)])


def test_the_sandbox_environment_is_checked_item_by_item() -> None:
    assert parse_environment(["NumPy==2.4.6", "zope.interface==7.0"]) == {
        "numpy": "2.4.6",
        "zope-interface": "7.0",
    }
    for bad in (["numpy"], ["--index-url==1"], ["numpy==not a version"], "numpy==1", [3]):
        with pytest.raises(RpcError):
            parse_environment(bad)


def test_the_policy_says_any_none_or_names() -> None:
    six = parse_requirements(["six"])
    PackagePolicy("any").check(six)
    with pytest.raises(RpcError, match="KERNELBRIDGE_PACKAGES=none") as off:
        PackagePolicy("none").check(six)
    assert off.value.kind == "denied"
    allowed = PackagePolicy("names", frozenset({"tabulate"}))
    allowed.check(parse_requirements(["tabulate>=0.9"]))
    with pytest.raises(RpcError, match=r"six is not allowed on this host .*allows tabulate"):
        allowed.check(six)


def test_package_settings() -> None:
    settings = load_settings(
        {"KERNELBRIDGE_PACKAGES": "Tabulate, six", "KERNELBRIDGE_PACKAGES_MAX_BYTES": "64m"}
    )
    assert settings.packages.policy == "names" and settings.packages.allowed == {"tabulate", "six"}
    assert settings.packages.max_bytes == 64 * 2**20
    assert settings.limits.packages_size == "96m", "the tmpfs holds the cap and a wheel being unpacked"
    assert load_settings({}).limits.packages_size == "192m" == SandboxLimits().packages_size
    assert load_settings({"KERNELBRIDGE_PACKAGES": "none"}).packages.policy == "none"
    assert load_settings({}).packages.policy == "any"
    with pytest.raises(ConfigError, match="KERNELBRIDGE_PACKAGES: '--index-url' is not a package name"):
        load_settings({"KERNELBRIDGE_PACKAGES": "--index-url"})


def test_mounts_refuse_the_state_directory_its_parents_files_and_system_paths(tmp_path: Path) -> None:
    state = tmp_path / "state"
    data = tmp_path / "data"
    data.mkdir()
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "link").symlink_to(state)
    state.mkdir()

    def mounts(raw: str) -> object:
        return load_settings({"KERNELBRIDGE_STATE_DIR": str(state), "KERNELBRIDGE_MOUNTS": raw}).mounts

    (mount,) = mounts(f"{data}:/data")  # type: ignore[misc]
    assert (mount.source, mount.target) == (data, "/data")
    refusals = {
        f"{state}:/d": "is the state directory",
        f"{tmp_path}:/d": "holds the state directory",
        "/:/d": "holds /proc",
        f"{state}/sessions:/d": "does not exist",
        f"{tmp_path / 'link'}:/d": "is the state directory",  # a symlink to it, resolved
        f"{tmp_path / 'file.txt'}:/d": "is not a directory",
        f"{data}:relative": "not an absolute path",
        f"{data}:/": "not an absolute path",
        f"{data}://data": "not an absolute path",
        f"{data}:/tmp/x": "sandbox's own paths",
        f"{data}:/packages": "sandbox's own paths",
        f"{data}:/workspace": "sandbox's own paths",
        f"{data}:/usr/share/x": "sandbox's own paths",
        f"{data}:/proc": "sandbox's own paths",
        f"{data}:/a,{data}:/a/b": "overlap",
        "nocolon": "is not SRC:DST",
    }
    for raw, why in refusals.items():
        with pytest.raises(ConfigError, match=why) as caught:
            mounts(raw)
        assert str(caught.value).startswith("KERNELBRIDGE_MOUNTS: "), raw
    assert mounts(f"{data}:/workspace/data")[0].target == "/workspace/data"  # type: ignore[index]


def test_pip_gets_every_platform_tag_the_sandbox_loads() -> None:
    tags = platforms()
    assert tags[0] == "manylinux_2_36_x86_64" and "manylinux_2_17_x86_64" in tags
    assert "manylinux2014_x86_64" in tags and "manylinux1_x86_64" in tags
    assert "--only-binary=:all:" in PIP_TARGET_FLAGS and "--abi=cp311" in PIP_TARGET_FLAGS


def test_pip_failures_become_one_line_each() -> None:
    down = classify(
        Outcome(
            1,
            "",
            "WARNING: Retrying (Retry(total=0)) after connection broken by 'NewConnectionError('<x>:"
            " Failed to establish a new connection: [Errno 111] Connection refused')': /simple/six/\n"
            "ERROR: Could not find a version that satisfies the requirement six (from versions: none)\n"
            "ERROR: No matching distribution found for six\n",
        )
    )
    assert down.kind is Failure.INDEX_DOWN and "could not be reached" in down.message
    missing = classify(Outcome(1, "", "ERROR: No matching distribution found for no-such-pkg\n"))
    assert missing.kind is Failure.NOT_FOUND and missing.name == "no-such-pkg"
    conflict = classify(
        Outcome(
            1,
            "\nThe conflict is caused by:\n    The user requested idna==3.4\n"
            "    requests 2.20.0 depends on idna<2.8 and >=2.5\n    The user requested (constraint)"
            " numpy==2.4.6\n\nTo fix this you could try to:\n",
            "ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/\n",
        )
    )
    assert conflict.kind is Failure.CONFLICT
    assert conflict.message == (
        "version conflict: you asked for idna==3.4; requests 2.20.0 depends on idna<2.8 and >=2.5;"
        " the sandbox has numpy 2.4.6"
    )
    other = classify(Outcome(2, "", "ERROR: something odd\n"))
    assert other.kind is Failure.FAILED and other.message.endswith("something odd")


def test_pip_gets_only_its_own_settings_of_the_bridges_environment() -> None:
    bridge = {
        "PATH": "/usr/bin", "HOME": "/home/u", "PIP_INDEX_URL": "https://mirror.example/simple",
        "HTTPS_PROXY": "http://proxy:3128", "SSL_CERT_FILE": "/etc/ca.pem", "LC_ALL": "C.UTF-8",
        "KERNELBRIDGE_HTTP_TOKENS": "alice:t0ken", "ANTHROPIC_API_KEY": "sk-x", "GITHUB_TOKEN": "ghp-x",
        "AWS_SECRET_ACCESS_KEY": "x", "PIP_CACHE_DIR": "/home/u/.cache/pip", "PYTHONPATH": "/x",
    }  # fmt: skip
    env = pip_env(bridge)
    assert set(env) == {
        "PATH", "HOME", "PIP_INDEX_URL", "HTTPS_PROXY", "SSL_CERT_FILE", "LC_ALL",
        "PIP_CONSTRAINT", "PIP_NO_INPUT", "PIP_DISABLE_PIP_VERSION_CHECK",
    }  # fmt: skip
    assert env["PIP_INDEX_URL"] == bridge["PIP_INDEX_URL"] and env["PIP_CONSTRAINT"] == ""


def test_pip_output_quoted_to_the_sandbox_is_scrubbed() -> None:
    failed = classify(
        Outcome(
            1,
            "",
            "ERROR: Could not install packages due to an OSError: [Errno 13] Permission denied:"
            " '/home/u/.local/state/kernelbridge/packages/downloads/dl-x/t' from"
            " https://user:s3cret@mirror.example/simple/six/\x1b[31m\n",
        )
    )
    assert failed.kind is Failure.FAILED
    assert "/home/u" not in failed.message and "s3cret" not in failed.message and "\x1b" not in failed.message
    assert "Permission denied: '<path>' from <url>" in failed.message
    long = classify(Outcome(1, "", "ERROR: " + "x" * 5000 + "\n"))
    assert len(long.message) < 400
    expanded = classify(Outcome(1, "", "ERROR: No matching distribution found for Kb_Nothing===s3cret\n"))
    assert expanded.kind is Failure.NOT_FOUND and expanded.name == "kb-nothing", "only the name, normalized"
    assert "s3cret" not in expanded.message


def wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def resolved(path: Path, **fields: str) -> Resolved:
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    values = {"name": "demo", "version": "1.0", "filename": path.name, "url": "", "sha256": sha}
    values.update(fields)
    return Resolved(requested=True, **values)


def test_the_cache_keeps_only_checked_wheels_by_their_hash(tmp_path: Path) -> None:
    cache = WheelCache(tmp_path / "cache", max_bytes=10**9)
    good = wheel(tmp_path / "demo-1.0-py3-none-any.whl", {"demo/__init__.py": b"x = 1\n" * 100})
    expected = resolved(good)
    added = cache.add(good, expected)
    assert added.sha256 == expected.sha256 and added.installed_size == 600
    assert cache.get(expected.sha256) == added and cache.find("demo", "1.0") == added
    assert cache.read(expected.sha256, 0, 5) == cache.path(expected.sha256).read_bytes()[:5]
    other = wheel(tmp_path / "demo-1.0-py3-none-any.whl", {"demo/__init__.py": b"evil"})
    with pytest.raises(CacheError, match="sha256"):
        cache.add(other, expected)
    renamed = wheel(tmp_path / "other-1.0-py3-none-any.whl", {"a": b"1"})
    with pytest.raises(CacheError, match="served other"):
        cache.add(renamed, expected)
    escape = wheel(tmp_path / "esc-1.0-py3-none-any.whl", {"../../etc/x": b"1"})
    with pytest.raises(CacheError, match="outside itself"):
        installed_size(escape)
    not_zip = tmp_path / "bad-1.0-py3-none-any.whl"
    not_zip.write_bytes(b"not a zip")
    with pytest.raises(CacheError, match="not a zip"):
        installed_size(not_zip)
    with pytest.raises(CacheError):
        cache.path("../../etc/passwd")


def test_the_cache_prunes_the_least_recently_used(tmp_path: Path) -> None:
    cache = WheelCache(tmp_path / "cache", max_bytes=1500)
    shas = []
    for index in range(3):
        path = wheel(tmp_path / f"w{index}-1.0-py3-none-any.whl", {"f": bytes([index]) * 1000})
        shas.append(cache.add(path, resolved(path, name=f"w{index}")).sha256)
    assert cache.prune() >= 1
    assert cache.size() <= 1500
    assert cache.get(shas[-1]) is not None, "the newest stays"


def test_resolutions_are_fresh_for_a_day_and_stale_ones_kept_for_an_index_that_is_down(
    tmp_path: Path,
) -> None:
    cache = WheelCache(tmp_path / "cache", max_bytes=10**9)
    six = Resolved("six", "1.17.0", "six-1.17.0-py2.py3-none-any.whl", "https://x/six.whl", "ab" * 32, True)
    cache.store_resolution("k", [six])
    assert cache.resolution("k", {}, set(), fresh=True) == [six]
    path = cache.resolutions / "k.json"
    stored = json.loads(path.read_text())
    stored["entries"][0]["created"] = time.time() - FRESH_FOR - 60
    path.write_text(json.dumps(stored))
    assert cache.resolution("k", {}, set(), fresh=True) is None
    assert cache.resolution("k", {}, set(), fresh=False) == [six]
    assert cache.resolution("missing", {}, set(), fresh=False) is None


def test_a_stored_resolution_fits_a_sandbox_unless_it_has_one_of_its_wheels_at_another_version(
    tmp_path: Path,
) -> None:
    cache = WheelCache(tmp_path / "cache", max_bytes=10**9)
    numpy = Resolved(
        "numpy", "2.4.6", "numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl", "", "cd" * 32, False
    )
    lib = Resolved("lib", "1.0", "lib-1.0-py3-none-any.whl", "", "ef" * 32, True)
    cache.store_resolution("k", [lib, numpy])
    assert cache.resolution("k", {"numpy": "2.4.6", "pandas": "3.0"}, {"lib"}, fresh=True) == [lib, numpy]
    assert cache.resolution("k", {"pandas": "3.0"}, {"lib"}, fresh=True) == [lib, numpy]
    assert cache.resolution("k", {"numpy": "2.3.0"}, {"lib"}, fresh=True) is None, "no second numpy"
    assert cache.resolution("k", {"numpy": "2.3.0"}, {"lib", "numpy"}, fresh=True) is not None, "asked"


def test_the_capabilities_list_the_image_the_policy_the_caps_and_the_mount_targets() -> None:
    from kernelbridge.server.manual import packages_section

    text = packages_section(["numpy==2.4.6", "scipy==1.17.1"], "any", [], 256 * 2**20, 32, ["/data"])
    assert "Python packages in the sandbox image: numpy==2.4.6, scipy==1.17.1." in text
    assert "`%pip install NAME` (any package;" in text and "at most 256 MiB installed and 32 installs" in text
    assert "read-only: `/data`." in text
    only = packages_section([], "names", ["tabulate"], 2**20, 1, [])
    assert "(only tabulate (with their dependencies);" in only and "read-only" not in only
    assert "turned off" in packages_section([], "none", [], 2**20, 1, [])

"""Mount sources that would expose the host (issue 23): its pseudo-filesystems and configuration,
the engines' storage and sockets, the user's credentials and MCP client configs, kernelbridge's own
files, and any directory holding a unix socket; each refused with one line saying what and why,
symlinks resolved first. Real paths of this machine and real sockets; no sandbox needed."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelbridge.config import load_settings
from kernelbridge.config.mounts import first_socket
from kernelbridge.errors import ConfigError


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A user's home with the credentials and MCP configs a sandbox must never see."""
    home = tmp_path / "home" / "u"
    for name in (".ssh", ".gnupg", ".aws", ".config/mcp/servers", ".local/share/containers", "projects/data"):
        (home / name).mkdir(parents=True)
    (home / ".claude.json").write_text('{"mcpServers": {"gh": {"env": {"GITHUB_TOKEN": "t"}}}}')
    return home


def env_of(tmp_path: Path, home: Path, **more: str) -> dict[str, str]:
    return {"HOME": str(home), "KERNELBRIDGE_STATE_DIR": str(tmp_path / "state"), **more}


def refusal(env: dict[str, str], source: str | Path) -> str:
    """The one line that refuses ``source`` as a mount (fails the test if it is accepted)."""
    with pytest.raises(ConfigError) as caught:
        load_settings({**env, "KERNELBRIDGE_MOUNTS": f"{source}:/data"})
    line = str(caught.value)
    assert "\n" not in line and line.startswith("KERNELBRIDGE_MOUNTS: "), line
    return line


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("/proc", "is /proc (the host's processes"),
        ("/proc/self", "is inside /proc"),
        ("/sys", "is /sys"),
        ("/dev", "is /dev"),
        ("/dev/shm", "is inside /dev"),
        ("/etc", "is /etc"),
        ("/root", "is /root"),
        ("/run", "is /run (the host's runtime sockets"),
        ("/var/run", "is /run"),  # a symlink to /run: resolved first
        ("/", "holds /proc"),
        ("/var", "holds /var/run"),
        ("/var/lib", "holds /var/lib/containers"),
        ("/tmp", "is /tmp (every user's temporary files and sockets)"),
    ],
)
def test_the_hosts_own_paths_are_refused_as_is_holding_or_inside(
    tmp_path: Path, home: Path, source: str, why: str
) -> None:
    if not Path(source).exists():
        pytest.skip(f"{source} does not exist on this machine")
    assert why in refusal(env_of(tmp_path, home), source)


def test_engine_storage_is_refused_where_it_exists(tmp_path: Path, home: Path) -> None:
    present = [p for p in ("/var/lib/containers", "/var/lib/docker") if Path(p).is_dir()]
    if not present:
        pytest.skip("no engine storage on this machine")
    for path in present:
        assert f"is {path} (" in refusal(env_of(tmp_path, home), path)
        inner = next((p for p in Path(path).iterdir() if p.is_dir()), None)
        if inner is not None:
            assert f"is inside {path}" in refusal(env_of(tmp_path, home), inner)


def test_the_users_credentials_and_mcp_configs_are_refused_and_so_is_the_home_holding_them(
    tmp_path: Path, home: Path
) -> None:
    env = env_of(tmp_path, home)
    assert f"is {home / '.ssh'} (ssh keys)" in refusal(env, home / ".ssh")
    assert f"is inside {home / '.config'}" in refusal(env, home / ".config" / "mcp")
    assert f"is {home / '.local/share/containers'} (rootless podman's storage)" in refusal(
        env, home / ".local" / "share" / "containers"
    )
    # Home holds them all (the first in the list is named), its parent too.
    assert f"holds {home / '.ssh'}" in refusal(env, home)
    assert f"holds {home / '.ssh'}" in refusal(env, home.parent)
    # A symlink to a credentials directory is the directory.
    (tmp_path / "innocent").symlink_to(home / ".aws")
    assert f"is {home / '.aws'} (cloud credentials)" in refusal(env, tmp_path / "innocent")
    # A directory of one's own in home holds none of them: it may be mounted.
    (mount,) = load_settings({**env, "KERNELBRIDGE_MOUNTS": f"{home / 'projects' / 'data'}:/data"}).mounts
    assert mount.source == home / "projects" / "data"


def test_runtime_sockets_and_the_files_the_settings_name_are_refused(tmp_path: Path, home: Path) -> None:
    runtime = tmp_path / "xdg-runtime"
    engine = tmp_path / "engine"
    exports = tmp_path / "exports"
    tokens = tmp_path / "secrets"
    for path in (runtime / "podman", engine, exports, tokens):
        path.mkdir(parents=True)
    (tokens / "tokens.txt").write_text("t\n")
    env = env_of(
        tmp_path,
        home,
        XDG_RUNTIME_DIR=str(runtime),
        DOCKER_HOST=f"unix://{engine}/docker.sock",
        KERNELBRIDGE_EXPORT_DIR=str(exports),
        KERNELBRIDGE_HTTP_TOKENS_FILE=str(tokens / "tokens.txt"),
    )
    assert "is inside" in refusal(env, runtime / "podman") and "runtime sockets" in refusal(env, runtime)
    assert "a container engine's socket" in refusal(env, engine)
    assert "every session's exported notebooks" in refusal(env, exports)
    assert "the HTTP bearer tokens" in refusal(env, tokens)


@pytest.fixture
def listening() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    yield opened
    for sock in opened:
        sock.close()


def test_a_directory_holding_a_unix_socket_is_refused(
    tmp_path: Path, home: Path, listening: list[socket.socket]
) -> None:
    # A read-only, nodev mount does not stop connect() on a socket (tried with podman: the
    # sandbox reached a host listener through it), nor does --network none.
    data = tmp_path / "data"
    (data / "a" / "b").mkdir(parents=True)
    (data / "a" / "rows.csv").write_text("x\n")
    assert first_socket(data) is None
    server = socket.socket(socket.AF_UNIX)
    listening.append(server)
    server.bind(str(data / "a" / "b" / "agent.sock"))
    server.listen(1)
    line = refusal(env_of(tmp_path, home), data)
    assert f"holds a unix socket ({data / 'a' / 'b' / 'agent.sock'})" in line
    # Past the search's bound nothing is looked at (a data set must not stall a start).
    assert first_socket(data, limit=2) is None


def test_a_directory_in_tmp_of_ones_own_is_still_mountable(tmp_path: Path, home: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (mount,) = load_settings({**env_of(tmp_path, home), "KERNELBRIDGE_MOUNTS": f"{data}:/data"}).mounts
    assert (mount.source, mount.target) == (data, "/data")

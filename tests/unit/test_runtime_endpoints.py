"""Engine URLs and TLS material read the way the docker client reads them; runtime settings (TLS
files that openssl made: tests/process/test_runtime_tls.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelbridge.config import EngineSettings, load_settings
from kernelbridge.errors import ConfigError
from kernelbridge.runtime.engine.endpoint import Endpoint, default_remote_socket, parse_endpoint, ssl_context


def test_unix_tcp_https_ssh() -> None:
    assert parse_endpoint("unix:///run/podman/podman.sock") == Endpoint(
        "unix", path="/run/podman/podman.sock"
    )
    plain = parse_endpoint("tcp://198.18.0.2:2375")
    assert (plain.host, plain.port, plain.tls, plain.url) == (
        "198.18.0.2",
        2375,
        None,
        "tcp://198.18.0.2:2375",
    )
    assert parse_endpoint("tcp://engine.example").port == 2375
    tls = parse_endpoint("tcp://engine.example", EngineSettings(tls_verify=True, cert_path=Path("/c")))
    assert tls.port == 2376 and tls.tls is not None and tls.tls.verify and tls.tls.cert_path == Path("/c")
    assert tls.url == "https://engine.example:2376"
    unverified = parse_endpoint("tcp://e:1", EngineSettings(tls=True, cert_path=Path("/c")))
    assert unverified.tls is not None and not unverified.tls.verify
    assert parse_endpoint("https://e:3").tls is not None
    ssh = parse_endpoint("ssh://me@box:2222/run/user/1000/podman/podman.sock")
    assert (ssh.scheme, ssh.user, ssh.host, ssh.port, ssh.path) == (
        "ssh",
        "me",
        "box",
        2222,
        "/run/user/1000/podman/podman.sock",
    )
    assert parse_endpoint("ssh://box").port == 22
    assert parse_endpoint("tcp://[::1]:2375").url == "tcp://[::1]:2375"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("unix://relative.sock", "absolute path"),
        ("tcp://:2375", "has no host"),
        ("tcp://h:notaport", "bad port"),
        ("ssh://", "has no host"),
        ("npipe:////./pipe/docker_engine", "expected unix://"),
    ],
)
def test_bad_urls_are_one_line(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_endpoint(url)
    assert "\n" not in str(info.value)


def test_remote_socket_defaults() -> None:
    assert default_remote_socket("docker", parse_endpoint("ssh://u@h")) == "/var/run/docker.sock"
    assert default_remote_socket(None, parse_endpoint("ssh://h/var/run/x.sock")) == "/var/run/x.sock"
    assert default_remote_socket("podman", parse_endpoint("ssh://root@h")) == "/run/podman/podman.sock"
    with pytest.raises(ConfigError, match="name the remote podman socket"):
        default_remote_socket("podman", parse_endpoint("ssh://alice@h"))


def test_tls_files_missing(tmp_path: Path) -> None:
    endpoint = parse_endpoint("tcp://h", EngineSettings(tls_verify=True, cert_path=tmp_path / "none"))
    assert endpoint.tls is not None
    with pytest.raises(ConfigError, match=r"cannot load the engine's TLS files from .*none"):
        ssl_context(endpoint.tls)


def test_runtime_settings() -> None:
    for value in ("podman", "docker", "podman-api", "docker-api", "podman-cli", "docker-cli"):
        assert load_settings({"HOME": "/h", "KERNELBRIDGE_RUNTIME": value}).runtime == value
    with pytest.raises(ConfigError, match=r"expected podman or docker \(or podman-api"):
        load_settings({"HOME": "/h", "KERNELBRIDGE_RUNTIME": "podman-k8s"})
    s = load_settings(
        {
            "HOME": "/h",
            "KERNELBRIDGE_ENGINES": "unix:///a.sock, tcp://198.18.0.2:2375  ssh://u@h",
            "DOCKER_HOST": "tcp://d:2376",
            "CONTAINER_HOST": "unix:///p.sock",
            "DOCKER_TLS_VERIFY": "1",
            "DOCKER_CERT_PATH": "~/certs",
        }
    )
    assert s.engine.urls == ("unix:///a.sock", "tcp://198.18.0.2:2375", "ssh://u@h")
    assert s.engine.docker_host == "tcp://d:2376" and s.engine.container_host == "unix:///p.sock"
    assert s.engine.tls_verify and s.engine.cert_path == Path("~/certs").expanduser()
    assert load_settings({"HOME": "/h"}).engine == EngineSettings()
    ssh = load_settings({"HOME": "/h", "KERNELBRIDGE_SSH_COMMAND": "ssh -i '/k ey' -o Port=2"})
    assert ssh.engine.ssh_command == ("ssh", "-i", "/k ey", "-o", "Port=2")
    with pytest.raises(ConfigError, match=r"KERNELBRIDGE_SSH_COMMAND=.* is not a command line"):
        load_settings({"HOME": "/h", "KERNELBRIDGE_SSH_COMMAND": "ssh -i 'unclosed"})

"""Engine URLs and TLS material read the way the docker client reads them; runtime settings."""

from __future__ import annotations

import ssl
import subprocess
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


def make_certs(directory: Path) -> None:
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, timeout=30, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca-key.pem", "-out", "ca.pem",
            "-days", "1", "-subj", "/CN=test CA")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "key.pem", "-out", "client.csr",
            "-subj", "/CN=client")  # fmt: skip
    openssl("x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem",
            "-CAcreateserial", "-out", "cert.pem", "-days", "1")  # fmt: skip


def test_tls_context_like_docker(tmp_path: Path) -> None:
    make_certs(tmp_path)
    endpoint = parse_endpoint("tcp://198.18.0.2", EngineSettings(tls_verify=True, cert_path=tmp_path))
    assert endpoint.tls is not None
    ctx = ssl_context(endpoint.tls)
    assert ctx.verify_mode is ssl.CERT_REQUIRED and ctx.check_hostname
    assert ctx.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert any(ca["subject"] == ((("commonName", "test CA"),),) for ca in ctx.get_ca_certs())
    # The client certificate is presented: the context holds a key (a wrong key would not load).
    (tmp_path / "key.pem").write_text((tmp_path / "ca-key.pem").read_text())
    with pytest.raises(ConfigError, match="cannot load the engine's TLS files"):
        ssl_context(endpoint.tls)


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

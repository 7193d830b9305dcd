"""The engine's TLS context made from files that openssl wrote, the way the docker client reads a
DOCKER_CERT_PATH: the CA verifies the engine, the client certificate is presented."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

import pytest

from kernelbridge.config import EngineSettings
from kernelbridge.errors import ConfigError
from kernelbridge.runtime.engine.endpoint import parse_endpoint, ssl_context


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

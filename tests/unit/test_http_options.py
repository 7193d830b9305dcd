"""The HTTP door without a network: tokens, hosts and the combinations `serve --http` refuses."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from kernelbridge.config import load_settings
from kernelbridge.errors import ConfigError
from kernelbridge.server.http import HostRules, HttpOptions, generated_token, load_tokens, parse_token

ALICE = "alice:0123456789abcdef-alice"


def settings(tmp_path: Path, **env: str):  # type: ignore[no-untyped-def]
    return load_settings({"KERNELBRIDGE_STATE_DIR": str(tmp_path), **env})


def options(
    tmp_path: Path, host: str, *, auth: bool = True, hosts: list[str] | None = None, **env: str
) -> HttpOptions:
    return HttpOptions.from_args(
        settings(tmp_path, KERNELBRIDGE_HTTP_TOKENS=ALICE, **env),
        host=host,
        port=8765,
        allowed_hosts=hosts or [],
        tls_cert=None,
        tls_key=None,
        auth=auth,
        announce=lambda message: None,
    )


def test_tokens_map_to_namespaces_and_nothing_else(tmp_path: Path) -> None:
    table = load_tokens(settings(tmp_path, KERNELBRIDGE_HTTP_TOKENS=f"{ALICE}, fedcba9876543210-bare"))
    assert table.namespace("0123456789abcdef-alice") == "alice"
    bare = table.namespace("fedcba9876543210-bare")
    assert bare is not None and bare.startswith("t") and "fedcba" not in bare
    for wrong in ("", "0123456789abcdef-alicE", "alice", ALICE, "0123456789abcdef-alice "):
        assert table.namespace(wrong) is None
    assert "0123456789abcdef" not in repr(table)


def test_a_tokens_file_is_read_and_an_empty_one_refused(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# team\n{ALICE}\nbob:fedcba9876543210-bob\n")
    table = load_tokens(settings(tmp_path, KERNELBRIDGE_HTTP_TOKENS_FILE=str(tokens)))
    assert table.namespaces == ["alice", "bob"]
    tokens.write_text("# nobody yet\n")
    with pytest.raises(ConfigError, match="holds no token"):
        load_tokens(settings(tmp_path, KERNELBRIDGE_HTTP_TOKENS_FILE=str(tokens)))


def test_short_tokens_are_refused() -> None:
    with pytest.raises(ConfigError, match="at least 16"):
        parse_token("alice:short", "KERNELBRIDGE_HTTP_TOKENS")


def test_the_generated_token_is_private_and_announced_once(tmp_path: Path) -> None:
    said: list[str] = []
    first = generated_token(tmp_path, said.append)
    again = generated_token(tmp_path, said.append)
    assert first == again and len(first) >= 40
    assert len(said) == 1 and first in said[0]
    assert stat.S_IMODE((tmp_path / "http-token").stat().st_mode) == 0o600


def test_host_rules() -> None:
    rules = HostRules(("127.0.0.1", "localhost:8765", "[::1]:*", "kb.example.com"))
    assert rules.host_ok("127.0.0.1:8765") and rules.host_ok("127.0.0.1")
    assert rules.host_ok("localhost:8765") and not rules.host_ok("localhost:9999")
    assert rules.host_ok("[::1]:1234") and rules.host_ok("KB.example.com:443")
    assert not rules.host_ok("evil.example:8765") and not rules.host_ok(None) and not rules.host_ok("")
    assert not rules.host_ok("127.0.0.1.evil.example")
    assert rules.origin_ok(None) and rules.origin_ok("https://kb.example.com")
    assert not rules.origin_ok("http://evil.example") and not rules.origin_ok("null")
    assert not rules.origin_ok("file://kb.example.com")


def test_refused_combinations(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="without authentication"):
        options(tmp_path, "0.0.0.0", auth=False)
    with pytest.raises(ConfigError, match="--allowed-host"):
        options(tmp_path, "192.0.2.10")
    with pytest.raises(ConfigError, match="go together"):
        HttpOptions.from_args(
            settings(tmp_path, KERNELBRIDGE_HTTP_TOKENS=ALICE),
            host="127.0.0.1",
            port=1,
            allowed_hosts=[],
            tls_cert="/nonexistent.pem",
            tls_key=None,
            auth=True,
        )


def test_accepted_combinations(tmp_path: Path) -> None:
    loopback = options(tmp_path, "127.0.0.1")
    assert loopback.hosts.host_ok("localhost:8765") and loopback.tokens is not None
    public = options(tmp_path, "0.0.0.0", hosts=["kb.example.com"])
    assert public.hosts.host_ok("kb.example.com") and not public.hosts.host_ok("127.0.0.1:8765")
    from_env = options(tmp_path, "0.0.0.0", KERNELBRIDGE_HTTP_ALLOWED_HOSTS="kb.example.com:443")
    assert from_env.hosts.host_ok("kb.example.com:443")
    local_only = options(tmp_path, "::1", auth=False)
    assert local_only.tokens is None

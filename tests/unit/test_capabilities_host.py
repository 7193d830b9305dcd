"""The capabilities text says one true thing about limits (issue 18: it said both "memory (512 MB
by default)" and "limits are NOT enforced here"), and names the calls that wait for approval."""

from __future__ import annotations

from kernelbridge.config import load_settings
from kernelbridge.host import SandboxPolicy
from kernelbridge.server.app import HostFacts
from kernelbridge.server.manual import render_manual


def manual(policy: SandboxPolicy, **env: str) -> str:
    settings = load_settings({"HOME": "/h", **env})
    return render_manual() + HostFacts(policy).markdown(settings)


def test_limits_are_stated_once_and_truly() -> None:
    enforced = manual(SandboxPolicy("img", None), KERNELBRIDGE_MEMORY="1g")
    assert enforced.count("Limits: memory 1g, 128 processes, 1 CPU") == 1
    assert "512" not in enforced and "256 MB" not in enforced
    unlimited = manual(SandboxPolicy("img", None, unlimited=True))
    assert "Limits are NOT enforced here" in unlimited
    assert "512" not in unlimited and "Limits: memory" not in unlimited
    refused = manual(SandboxPolicy("img", None, refusal="limits are not enforced"))
    assert "Sandboxes cannot start right now" in refused and "Limits: memory" not in refused


def test_approved_calls_are_named() -> None:
    text = manual(SandboxPolicy("img", None), KERNELBRIDGE_APPROVE_TOOLS="github.delete_*")
    assert "Host calls of `github.delete_*` wait for the user's approval" in text
    assert "approval" not in manual(SandboxPolicy("img", None))

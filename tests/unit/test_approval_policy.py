"""Approval's values: which calls need it, the question (arguments bounded), what an answer
means (anything that is not an answer is malformed), and the refusal each decision gives."""

from __future__ import annotations

import mcp_types as types
import pytest

from kernelbridge.calls.approval import ApprovalRequest, Decision, refusal
from kernelbridge.config import load_settings
from kernelbridge.errors import ConfigError
from kernelbridge.hub import Policy
from kernelbridge.server.approval import decision_of


def test_which_calls_need_approval() -> None:
    settings = load_settings(
        {"HOME": "/h", "KERNELBRIDGE_APPROVE_TOOLS": "github.delete_*, filesystem.write_file"}
    )
    policy = Policy.from_settings(settings)
    assert policy.needs_approval("github", "delete_repo")
    assert policy.needs_approval("filesystem", "write_file")
    assert not policy.needs_approval("github", "list_repos")
    assert not policy.needs_approval("filesystem", "write_files")
    everything = Policy.from_settings(load_settings({"HOME": "/h", "KERNELBRIDGE_APPROVE_TOOLS": "*"}))
    assert everything.needs_approval("time", "get_current_time")
    assert everything.approval_patterns("time") == ["*"]
    assert policy.approval_patterns("github") == ["github.delete_*"]
    with pytest.raises(
        ConfigError, match=r"KERNELBRIDGE_APPROVE_TOOLS: 'github' is not a server\.tool pattern"
    ):
        load_settings({"HOME": "/h", "KERNELBRIDGE_APPROVE_TOOLS": "github"})


def test_the_question_shows_the_arguments_bounded() -> None:
    small = ApprovalRequest("s", "github", "delete_repo", {"name": "kb"})
    assert (
        small.message()
        == 'Code in session \'s\' wants to call github.delete_repo with {"name": "kb"}: allow it?'
    )
    huge = ApprovalRequest("s", "fs", "write", {"data": "x" * 10_000_000})
    assert len(huge.message()) < 800 and "characters in all" in huge.message()


@pytest.mark.parametrize(
    ("answer", "decision"),
    [
        (types.ElicitResult(action="accept"), Decision.ACCEPTED),
        (types.ElicitResult(action="accept", content={}), Decision.ACCEPTED),
        (types.ElicitResult(action="accept", content={"approve": True}), Decision.ACCEPTED),
        (types.ElicitResult(action="accept", content={"approve": False}), Decision.DECLINED),
        (types.ElicitResult(action="decline"), Decision.DECLINED),
        (types.ElicitResult(action="cancel"), Decision.CANCELLED),
        (types.ElicitResult(action="accept", content={"approve": "yes"}), Decision.MALFORMED),
        (types.ElicitResult(action="accept", content={"approve": True, "also": 1}), Decision.MALFORMED),
        ({"action": "maybe"}, Decision.MALFORMED),
        ({"action": "accept", "content": [1]}, Decision.MALFORMED),
        ("yes", Decision.MALFORMED),
        (None, Decision.MALFORMED),
        (types.ListRootsResult(roots=[]), Decision.MALFORMED),
    ],
)
def test_what_an_answer_means(answer: object, decision: Decision) -> None:
    assert decision_of(answer) is decision


def test_every_refusal_is_one_denied_line() -> None:
    request = ApprovalRequest("s", "github", "delete_repo", {})
    for decision in Decision:
        if decision is Decision.ACCEPTED:
            continue
        error = refusal(decision, request)
        assert error.kind == "denied" and "\n" not in error.message
        assert error.message.startswith(
            "github.delete_repo needs a person's approval (KERNELBRIDGE_APPROVE_TOOLS)"
        )
        assert error.message.endswith("the call was not made")

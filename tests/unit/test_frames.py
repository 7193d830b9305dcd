"""The frame codec: pure bytes in, frames out, no event loop."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelbridge import frames


def kernel_msg(text: str = "hi") -> dict:
    return {
        "header": {"msg_id": "1", "msg_type": "stream"},
        "parent_header": {},
        "metadata": {},
        "content": {"name": "stdout", "text": text},
    }


def test_round_trip_with_buffers() -> None:
    frame = frames.kernel_frame("iopub", kernel_msg("a\nb"), [b"\x00\x01binary"])
    line = frames.encode(frame)
    assert line.endswith(b"\n") and line.count(b"\n") == 1  # newlines inside strings are escaped
    [decoded] = frames.FrameDecoder().feed(line)
    assert decoded == frame
    assert frames.frame_buffers(decoded) == [b"\x00\x01binary"]


def test_frames_split_across_arbitrary_chunks() -> None:
    data = b"".join(frames.encode(frames.kernel_frame("iopub", kernel_msg(str(i)))) for i in range(50))
    decoder = frames.FrameDecoder()
    out = []
    for i in range(0, len(data), 7):
        out += decoder.feed(data[i : i + 7])
    assert [f["msg"]["content"]["text"] for f in out] == [str(i) for i in range(50)]
    assert decoder.pending_bytes == 0


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"not json at all", "not JSON"),
        (b"[1, 2, 3]", "not a JSON object"),
        (b'"a string"', "not a JSON object"),
        (b'{"no": "type"}', "unknown frame type"),
        (b'{"type": "launch_missiles"}', "unknown frame type"),
        (b'{"type": "kernel", "channel": "shell"}', "kernel frame without"),
        (b'{"type": "kernel", "channel": "nope", "msg": {"header": {}}}', "kernel frame without"),
        (b"\xff\xfe\x00garbage", "not JSON"),
    ],
)
def test_bad_lines_become_errors_and_decoding_continues(line: bytes, reason: str) -> None:
    good = frames.encode({"type": "log", "level": "info", "message": "after"})
    result = frames.FrameDecoder().feed(line + b"\n" + good)
    assert isinstance(result[0], frames.FrameError)
    assert reason in result[0].reason
    assert result[1] == {"type": "log", "level": "info", "message": "after"}


def test_32_mib_frame_passes() -> None:
    text = "x" * (32 * 1024 * 1024)
    line = frames.encode(frames.kernel_frame("iopub", kernel_msg(text)))
    decoder = frames.FrameDecoder()
    out = []
    for i in range(0, len(line), 1 << 20):
        out += decoder.feed(line[i : i + (1 << 20)])
    assert len(out) == 1 and out[0]["msg"]["content"]["text"] == text


def test_oversized_frame_is_dropped_without_buffering_it() -> None:
    decoder = frames.FrameDecoder(max_frame_bytes=1000)
    big = json.dumps({"type": "log", "message": "y" * 5000}).encode()
    out = []
    for i in range(0, len(big), 100):
        out += decoder.feed(big[i : i + 100])
        assert decoder._buffered <= 1000  # never holds more than the cap
    out += decoder.feed(b"\n" + frames.encode({"type": "log", "message": "next"}))
    assert isinstance(out[0], frames.FrameError) and "exceeds" in out[0].reason
    assert out[1]["message"] == "next"


def test_encode_refuses_unknown_types() -> None:
    with pytest.raises(ValueError, match="unknown frame type"):
        frames.encode({"type": "bogus"})


def test_bad_base64_buffers_are_reported() -> None:
    with pytest.raises(ValueError, match="bad buffer"):
        frames.frame_buffers({"type": "kernel", "buffers": ["***"]})


def test_wire_round_trip_and_signature() -> None:
    msg = kernel_msg("hello")
    parts = [b"client-id", *frames.to_wire(msg, [b"\x00buf"], b"key")]
    wire = frames.from_wire(parts)
    assert wire.idents == [b"client-id"] and wire.msg == msg and wire.buffers == [b"\x00buf"]
    assert frames.verify(b"key", wire)
    assert not frames.verify(b"other-key", wire)
    assert frames.verify(b"", wire)  # Jupyter's "no key": nothing to check


@pytest.mark.parametrize(
    "parts",
    [
        [b"no delimiter at all"],
        [b"<IDS|MSG>", b"sig", b"{}"],
        [b"<IDS|MSG>", b"sig", b"{}", b"{}", b"{}", b"not json"],
        [b"<IDS|MSG>", b"sig", b"[]", b"{}", b"{}", b"{}"],
    ],
)
def test_malformed_wire_messages_raise_value_error(parts: list[bytes]) -> None:
    with pytest.raises(ValueError):
        frames.from_wire(parts)


def test_every_declared_frame_type_encodes() -> None:
    # Every upper-case string constant of the module is a frame type, and all are accepted.
    declared = {
        value
        for name, value in vars(frames).items()
        if name.isupper() and isinstance(value, str) and not name.startswith("EXIT_")
    }
    assert declared == set(frames.FRAME_TYPES)
    for frame_type in declared:
        assert frames.encode({"type": frame_type}).endswith(b"\n")


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='ab,[]{}"\\', max_size=4),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=3), children, max_size=4)
    ),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(JSON_VALUES, st.integers(1, 6), st.integers(1, 40))
def test_the_walk_of_a_frame_is_left_out_only_where_it_could_find_nothing(
    value: object, max_depth: int, max_nodes: int
) -> None:
    # Small bounds, so that the values hypothesis makes reach them (the real ones are 64 and 1M).
    openers, plain = frames._marks(json.dumps(value).encode())
    if not frames._may_be_misshapen(openers, plain, max_depth, max_nodes):
        assert frames.shape_problem(value, max_depth, max_nodes) is None


def test_a_frame_nested_past_the_bound_is_refused_and_one_at_it_passes() -> None:
    def nested(levels: int) -> bytes:
        content = "[" * levels + "1" + "]" * levels
        return f'{{"type": "log", "level": "info", "message": "x", "extra": {content}}}'.encode()

    assert isinstance(frames.parse_line(nested(frames.MAX_DEPTH - 2)), dict)
    refused = frames.parse_line(nested(frames.MAX_DEPTH))
    assert isinstance(refused, frames.FrameError) and "deeper than 64" in refused.reason

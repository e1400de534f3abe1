"""The base protocol's framing, pure: what pygls 2.1.1 choked on (a wrong Content-Length,
a lower-case header, LF-only header lines, garbage) is read, and the messages after it
are never lost. The process-level counterpart is tests/server/test_protocol_abuse.py."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from oom_lsp.server.framing import Frame, MessageFramer


def message(number: int) -> dict:
    return {"jsonrpc": "2.0", "id": number, "method": "textDocument/hover", "params": {"n": "é" * number}}


def framed(
    value: dict, length_change: int = 0, header: bytes = b"Content-Length", newline: bytes = b"\r\n"
) -> bytes:
    body = json.dumps(value, ensure_ascii=False).encode()
    return header + b": %d" % (len(body) + length_change) + newline + newline + body


def values(frames: list[Frame]) -> list:
    return [frame.value for frame in frames if frame.value is not None]


def problems(frames: list[Frame]) -> list[str]:
    return [frame.problem for frame in frames if frame.problem]


def test_well_formed_messages_in_any_chunks():
    stream = b"".join(framed(message(n)) for n in range(5))
    for size in (1, 7, 64, len(stream)):
        framer = MessageFramer()
        frames = [
            frame
            for start in range(0, len(stream), size)
            for frame in framer.feed(stream[start : start + size])
        ]
        assert values(frames) == [message(n) for n in range(5)] and problems(frames) == []


def test_header_names_are_case_insensitive_and_lf_only_lines_are_read():
    stream = (
        framed(message(1), header=b"content-length")
        + framed(message(2), newline=b"\n")
        + b"Content-Type: application/vscode-jsonrpc; charset=utf-8\r\n"
        + framed(message(3))
    )
    assert values(MessageFramer().feed(stream)) == [message(1), message(2), message(3)]


def test_a_length_too_short_takes_the_whole_message_and_the_next():
    frames = MessageFramer().feed(framed(message(1), -5) + framed(message(2)))
    assert values(frames) == [message(1), message(2)]
    assert "shorter than the message" in problems(frames)[0]


def test_a_length_too_short_waits_for_the_rest_of_its_message():
    framer = MessageFramer()
    data = framed(message(1), -5)
    assert framer.feed(data[:-5]) == [] and framer.awaiting_more
    assert values(framer.feed(data[-5:] + framed(message(2)))) == [message(1), message(2)]


def test_a_length_too_long_takes_the_message_and_reads_the_next():
    frames = MessageFramer().feed(framed(message(1), 30) + framed(message(2)) + framed(message(3)))
    assert values(frames) == [message(1), message(2), message(3)]
    assert "longer than the message" in problems(frames)[0]


def test_a_length_nothing_completes_is_settled_when_the_input_stalls():
    """The client sent one request with a length too long and waits for its answer."""
    framer = MessageFramer()
    assert framer.feed(framed(message(1), 40)) == [] and framer.awaiting_more
    frames = framer.stalled()
    assert values(frames) == [message(1)] and "but the message had" in problems(frames)[0]
    assert not framer.awaiting_more
    assert values(framer.feed(framed(message(2)))) == [message(2)]


def test_garbage_is_skipped_up_to_the_next_header():
    frames = MessageFramer().feed(b"hello\r\nnot a header at all\r\n}{]" + framed(message(1)))
    assert values(frames) == [message(1)] and problems(frames)


def test_after_garbage_the_next_header_is_found_whatever_its_case():
    garbage = b"hello\r\nnot a header at all\r\n}{]"
    frames = MessageFramer().feed(garbage + framed(message(1), header=b"content-LENGTH"))
    assert values(frames) == [message(1)] and problems(frames)
    # Inside a body that is not JSON, too: the next message starts at its header.
    frames = MessageFramer().feed(
        b"Content-Length: 30\r\n\r\n{broken" + framed(message(2), header=b"CONTENT-LENGTH")
    )
    assert values(frames) == [message(2)]


def test_a_body_that_is_not_json_is_unreadable_and_the_next_is_read():
    body = b"{not json}"
    framer = MessageFramer()
    frames = framer.feed(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    assert frames == []  # its message might still go on
    frames = framer.feed(framed(message(2)))
    assert [frame.unreadable is not None for frame in frames] == [True, False]
    assert values(frames) == [message(2)]


def test_headers_without_a_valid_length_skip_their_body():
    frames = MessageFramer().feed(
        b"Content-Length: -4\r\n\r\n{}" + b"Content-Length: x\r\n\r\n{}" + framed(message(1))
    )
    assert values(frames) == [message(1)]
    assert any("invalid Content-Length" in problem for problem in problems(frames))


def test_an_oversized_message_is_skipped_without_being_kept():
    framer = MessageFramer(max_message_bytes=1000)
    frames = framer.feed(b"Content-Length: 5000\r\n\r\n")
    assert "over the limit" in problems(frames)[0]
    for _ in range(5):
        assert framer.feed(b"x" * 1000) == []
        assert len(framer._buffer) < 10_000
    assert values(framer.feed(framed(message(1)))) == [message(1)]


def test_deep_nesting_is_unreadable_not_a_crash():
    body = b"[" * 100_000 + b"]" * 100_000
    (frame,) = MessageFramer(max_message_bytes=10**6).feed(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    assert frame.unreadable is not None


@st.composite
def damaged_streams(draw: st.DrawFn) -> tuple[bytes, list[dict], int]:
    """Some damaged messages, then three intact ones that must all come out."""
    damaged = b""
    for number in range(draw(st.integers(1, 4))):
        damage = draw(st.sampled_from(["length", "header", "garbage", "truncate", "lf", "none"]))
        if damage == "length":
            damaged += framed(message(number), draw(st.integers(-20, 20)))
        elif damage == "header":
            damaged += framed(
                message(number), header=draw(st.sampled_from([b"CONTENT-LENGTH", b"Content-Lenght", b""]))
            )
        elif damage == "garbage":
            damaged += draw(st.binary(max_size=40)) + framed(message(number))
        elif damage == "truncate":
            damaged += framed(message(number))[: draw(st.integers(0, 30))]
        elif damage == "lf":
            damaged += framed(message(number), newline=b"\n")
        else:
            damaged += framed(message(number))
    intact = [message(100 + number) for number in range(3)]
    chunk = draw(st.integers(1, 200))
    return damaged + b"\r\n" + b"".join(framed(value) for value in intact), intact, chunk


@settings(max_examples=400, deadline=None)
@given(damaged_streams())
def test_after_any_damage_the_following_messages_are_read(case: tuple[bytes, list[dict], int]):
    stream, intact, chunk = case
    framer = MessageFramer()
    frames: list[Frame] = []
    for start in range(0, len(stream), chunk):
        frames += framer.feed(stream[start : start + chunk])
    if framer.awaiting_more:
        frames += framer.stalled()
    got = values(frames)
    assert got[-3:] == intact, (got, problems(frames))

"""The streamed-exec frame decoder, fed byte by byte (no server)."""

from __future__ import annotations

import struct
from typing import Iterator, List

import pytest

from lizard import APIConnectionError, NotFoundError
from lizard._frames import Output, read_exec_frames as read_frames_op
from lizard._ops import run_local, from_iterable


def read_exec_frames(chunks, on_stdout, on_stderr):
    return run_local(read_frames_op(from_iterable(chunks), Output(on_stdout, on_stderr)))


def frame(kind: int, payload: bytes) -> bytes:
    return struct.pack(">BI", kind, len(payload)) + payload


def byte_by_byte(*frames: bytes) -> Iterator[bytes]:
    for f in frames:
        for b in f:
            yield bytes([b])


def test_frames_split_anywhere_and_utf8_split_across_frames() -> None:
    e = "é".encode()
    seen: List[str] = []
    r = read_exec_frames(
        byte_by_byte(frame(4, b"a"), frame(4, e[:1]), frame(5, b"warn"), frame(4, e[1:]), frame(6, b'{"exitCode":3,"timedOut":false}')),
        seen.append,
        None,
    )
    assert (r.stdout, r.stderr, r.exit_code, r.timed_out) == ("a\u00e9", "warn", 3, False)
    assert "".join(seen) == "a\u00e9"


def test_error_frame_is_typed_and_a_cut_stream_is_a_connection_error() -> None:
    with pytest.raises(NotFoundError) as e:
        read_exec_frames(byte_by_byte(frame(7, b'{"code":"NOT_FOUND","message":"no /x"}')), None, None)
    assert e.value.code == "NOT_FOUND"
    with pytest.raises(APIConnectionError):
        read_exec_frames(byte_by_byte(frame(4, b"partial")), None, None)


def test_a_reattach_skips_what_was_delivered_and_a_callback_error_is_kept() -> None:
    seen: List[str] = []
    output = Output(seen.append, None)
    replay = [frame(4, b"one "), frame(5, b"warn"), frame(4, b"two "), frame(4, b"three")]
    with pytest.raises(APIConnectionError):  # the stream broke off after two frames
        run_local(read_frames_op(from_iterable(byte_by_byte(*replay[:2])), output))
    assert (seen, output.delivered) == (["one "], 8)
    # The reattach replays from the start; the first 8 bytes went already.
    exit_frame = frame(6, b'{"exitCode":0}')
    r = run_local(read_frames_op(from_iterable([b"".join(replay) + exit_frame]), output, output.delivered))
    assert (r.stdout, r.stderr, seen) == ("one two three", "warn", ["one ", "two ", "three"])

    def fail(text: str) -> None:
        raise ValueError(text)

    failing = Output(fail, None)
    with pytest.raises(ValueError) as e:
        run_local(read_frames_op(from_iterable([replay[0]]), failing))
    assert failing.callback_error is e.value and failing.delivered == 4

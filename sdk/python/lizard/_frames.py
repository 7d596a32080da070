"""The streamed exec body (``POST /v1/sandboxes/{id}/exec?stream=true``): frames of
``[kind: u8][length: u32 big-endian][payload]``; stdout (4) and stderr (5) carry the
command's bytes, then exit (6, JSON ``{exitCode, signal?, timedOut}``) or error (7, JSON
``{code, message}``) ends it."""

from __future__ import annotations

import codecs
import json
import struct
from typing import Callable, Dict, List, Optional

from ._ops import Op, invoke
from .errors import APIConnectionError, error_for
from .models import ProcessResult

STDOUT, STDERR, EXIT, ERROR = 4, 5, 6, 7

#: The agent's error codes, as the API's statuses.
_AGENT_STATUS = {"NOT_FOUND": 404, "INVALID_ARGUMENT": 422, "IS_A_DIRECTORY": 422, "NOT_A_DIRECTORY": 422, "PERMISSION_DENIED": 403}

Callback = Optional[Callable[[str], object]]


class Output:
    """A command's output as delivered so far: the text of each stream, the callbacks it
    goes to, and how many bytes went (a process's reattach replays from the start and
    skips them). The first exception a callback raised is kept as ``callback_error``."""

    def __init__(self, on_stdout: Callback, on_stderr: Callback) -> None:
        self.callbacks: Dict[int, Callback] = {STDOUT: on_stdout, STDERR: on_stderr}
        self.decoders = {STDOUT: codecs.getincrementaldecoder("utf-8")("replace"), STDERR: codecs.getincrementaldecoder("utf-8")("replace")}
        self.text: Dict[int, List[str]] = {STDOUT: [], STDERR: []}
        self.delivered = 0
        self.callback_error: Optional[Exception] = None

    def add(self, kind: int, payload: bytes, final: bool = False) -> Op[None]:
        self.delivered += len(payload)
        text = self.decoders[kind].decode(payload, final=final)
        if text:
            self.text[kind].append(text)
            try:
                yield from invoke(self.callbacks[kind], text)
            except Exception as e:
                self.callback_error = e
                raise

    def result(self, status: Dict[str, object]) -> Op[ProcessResult]:
        """The exit frame's ``status`` with all the text (the decoders' last bytes first)."""
        for kind in (STDOUT, STDERR):
            yield from self.add(kind, b"", final=True)
        return ProcessResult.from_json(
            {
                "stdout": "".join(self.text[STDOUT]),
                "stderr": "".join(self.text[STDERR]),
                "exitCode": status.get("exitCode", -1),
                "timedOut": status.get("timedOut", False),
            }
        )


def read_exec_frames(next_chunk: Callable[[], Op[Optional[bytes]]], output: Output, skip: int = 0) -> Op[ProcessResult]:
    """Decode frames from the chunks ``next_chunk`` reads (``None`` at the end) into
    ``output``, leaving out the first ``skip`` bytes of output (delivered before)."""
    buf = bytearray()
    while True:
        chunk = yield from next_chunk()
        if chunk is None:
            break
        buf += chunk
        while len(buf) >= 5:
            kind, length = struct.unpack(">BI", bytes(buf[:5]))
            if len(buf) < 5 + length:
                break
            payload = bytes(buf[5 : 5 + length])
            del buf[: 5 + length]
            if kind in (STDOUT, STDERR):
                skipped = min(skip, len(payload))
                skip -= skipped
                if skipped < len(payload):
                    yield from output.add(kind, payload[skipped:])
            elif kind == EXIT:
                return (yield from output.result(json.loads(payload)))
            elif kind == ERROR:
                err = json.loads(payload)
                code = str(err.get("code", "INTERNAL"))
                raise error_for(_AGENT_STATUS.get(code, 500), code, str(err.get("message", "")))
    raise APIConnectionError("the exec stream ended before the command did")

"""The streamed exec body (``POST /v1/sandboxes/{id}/exec?stream=true``): frames of
``[kind: u8][length: u32 big-endian][payload]``; stdout (4) and stderr (5) carry the
command's bytes, then exit (6, JSON ``{exitCode, signal?, timedOut}``) or error (7, JSON
``{code, message}``) ends it."""

from __future__ import annotations

import codecs
import json
import struct
from typing import Callable, Optional

from ._ops import Op, invoke
from .errors import APIConnectionError, error_for
from .models import ProcessResult

STDOUT, STDERR, EXIT, ERROR = 4, 5, 6, 7

#: The agent's error codes, as the API's statuses.
_AGENT_STATUS = {"NOT_FOUND": 404, "INVALID_ARGUMENT": 422, "IS_A_DIRECTORY": 422, "NOT_A_DIRECTORY": 422, "PERMISSION_DENIED": 403}


def read_exec_frames(
    next_chunk: Callable[[], Op[Optional[bytes]]],
    on_stdout: Optional[Callable[[str], object]],
    on_stderr: Optional[Callable[[str], object]],
) -> Op[ProcessResult]:
    """Decode frames from the chunks ``next_chunk`` reads (``None`` at the end), calling the
    callbacks with text as it arrives."""
    decoders = {STDOUT: codecs.getincrementaldecoder("utf-8")("replace"), STDERR: codecs.getincrementaldecoder("utf-8")("replace")}
    callbacks = {STDOUT: on_stdout, STDERR: on_stderr}
    out = {STDOUT: [], STDERR: []}  # type: dict[int, list[str]]
    buf = bytearray()

    def emit(kind: int, text: str) -> Op[None]:
        if text:
            out[kind].append(text)
            yield from invoke(callbacks[kind], text)

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
                yield from emit(kind, decoders[kind].decode(payload))
            elif kind == EXIT:
                for k in (STDOUT, STDERR):
                    yield from emit(k, decoders[k].decode(b"", final=True))
                status = json.loads(payload)
                return ProcessResult.from_json(
                    {
                        "stdout": "".join(out[STDOUT]),
                        "stderr": "".join(out[STDERR]),
                        "exitCode": status.get("exitCode", -1),
                        "timedOut": status.get("timedOut", False),
                    }
                )
            elif kind == ERROR:
                err = json.loads(payload)
                code = str(err.get("code", "INTERNAL"))
                raise error_for(_AGENT_STATUS.get(code, 500), code, str(err.get("message", "")))
    raise APIConnectionError("the exec stream ended before the command did")

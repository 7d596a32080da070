"""``read_events`` without a server: NDJSON lines fold into one ``Execution``, the
callbacks see each event as it comes, and a stream without its ``end`` is an error."""

from __future__ import annotations

import json

import pytest

from lizard import APIConnectionError
from lizard._ops import from_iterable, run_local
from lizard.code import read_events as read_events_op


def read_events(lines, **callbacks):
    return run_local(read_events_op(from_iterable(lines), **callbacks))

EVENTS = [
    {"type": "stdout", "text": "a\n"},
    {"type": "stderr", "text": "w\n"},
    {"type": "result", "data": {"image/png": "iVBOR", "text/plain": "<Figure>"}, "isMainResult": False},
    {"type": "result", "data": {"text/plain": "42", "application/x-custom": 1}, "isMainResult": True},
    {"type": "error", "name": "ZeroDivisionError", "value": "division by zero", "traceback": "tb"},
    {"type": "end", "executionCount": 3},
]


def test_events_fold_into_an_execution_with_callbacks_in_order() -> None:
    seen = []
    execution = read_events(
        iter([json.dumps(e) for e in EVENTS] + [""]),
        on_stdout=lambda t: seen.append(("stdout", t)),
        on_stderr=lambda t: seen.append(("stderr", t)),
        on_result=lambda r: seen.append(("result", r.formats())),
        on_error=lambda e: seen.append(("error", e.name)),
    )
    assert execution.logs.stdout == ["a\n"] and execution.logs.stderr == ["w\n"]
    assert execution.text == "42" and execution.execution_count == 3
    figure, main = execution.results
    assert figure.png == "iVBOR" and not figure.is_main_result
    assert main.extra == {"application/x-custom": 1} and main.data["text/plain"] == "42"
    assert execution.error is not None and execution.error.value == "division by zero"
    assert seen == [
        ("stdout", "a\n"),
        ("stderr", "w\n"),
        ("result", ["text", "png"]),
        ("result", ["text", "application/x-custom"]),
        ("error", "ZeroDivisionError"),
    ]


def test_a_stream_without_its_end_is_a_connection_error() -> None:
    with pytest.raises(APIConnectionError):
        read_events(iter([json.dumps(EVENTS[0])]))

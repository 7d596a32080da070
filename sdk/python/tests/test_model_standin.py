"""The model-API stand-in of the agent tests, on its own (host loopback, no sandbox): each
wire format answers a request that offers a file-writing tool with one call of it, and the
same conversation after the tool's result with a final message; streaming answers are
server-sent events that end the way each provider's clients expect."""

from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, Iterator, List

import httpx
import pytest

from fixtures import model_standin as standin


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    standin.Handler.script = standin.Script("/work/hello.txt", "hi")
    standin.Handler.log_path = str(tmp_path_factory.mktemp("standin") / "log.jsonl")
    server = ThreadingHTTPServer(("127.0.0.1", 0), standin.Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def events(body: str) -> List[Dict[str, Any]]:
    return [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]


WRITE_SCHEMA = {"type": "object", "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}}}


def test_anthropic_messages_stream_a_tool_call_then_the_final_message(url: str) -> None:
    req: Dict[str, Any] = {"model": "m", "stream": True, "tools": [{"name": "Write", "input_schema": WRITE_SCHEMA}],
                           "messages": [{"role": "user", "content": "create hello.txt containing hi"}]}
    r = httpx.post(f"{url}/v1/messages", json=req, headers={"x-api-key": "k1"})
    assert r.headers["content-type"] == "text/event-stream"
    evs = events(r.text)
    assert [e["type"] for e in evs][0] == "message_start" and evs[-1]["type"] == "message_stop"
    start = next(e for e in evs if e["type"] == "content_block_start")["content_block"]
    assert start["type"] == "tool_use" and start["name"] == "Write"
    args = json.loads(next(e for e in evs if e["type"] == "content_block_delta")["delta"]["partial_json"])
    assert args == {"file_path": "/work/hello.txt", "content": "hi"}
    req["messages"] += [{"role": "assistant", "content": [{**start, "input": args}]},
                        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": start["id"], "content": "ok"}]}]
    final = httpx.post(f"{url}/v1/messages", json={**req, "stream": False}).json()
    assert final["stop_reason"] == "end_turn" and final["content"][0]["text"] == standin.FINAL_TEXT


def test_chat_completions_fall_back_to_a_shell_tool(url: str) -> None:
    shell = {"type": "object", "properties": {"command": {"type": "string"}, "description": {"type": "string"}}}
    req = {"model": "m", "stream": True, "stream_options": {"include_usage": True},
           "tools": [{"type": "function", "function": {"name": "bash", "parameters": shell}}],
           "messages": [{"role": "user", "content": "create hello.txt containing hi"}]}
    r = httpx.post(f"{url}/v1/chat/completions", json=req, headers={"Authorization": "Bearer k2"})
    assert r.text.endswith("data: [DONE]\n\n")
    evs = events(r.text)
    call = evs[0]["choices"][0]["delta"]["tool_calls"][0]["function"]
    assert call["name"] == "bash"
    assert json.loads(call["arguments"])["command"] == "printf %s hi > /work/hello.txt"
    assert evs[1]["choices"][0]["finish_reason"] == "tool_calls" and "usage" in evs[2]
    after = {**req, "stream": False, "messages": req["messages"] + [{"role": "tool", "content": "", "tool_call_id": "c"}]}
    assert httpx.post(f"{url}/v1/chat/completions", json=after).json()["choices"][0]["message"]["content"] == standin.FINAL_TEXT


def test_responses_and_the_log(url: str) -> None:
    array_cmd = {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}}}
    req = {"model": "m", "stream": True, "tools": [{"type": "function", "name": "shell", "parameters": array_cmd}],
           "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]}]}
    evs = events(httpx.post(f"{url}/v1/responses", json=req, headers={"Authorization": "Bearer k3"}).text)
    assert evs[0]["type"] == "response.created" and evs[-1]["type"] == "response.completed"
    item = next(e for e in evs if e["type"] == "response.output_item.done")["item"]
    assert item["type"] == "function_call"
    assert json.loads(item["arguments"]) == {"command": ["bash", "-lc", "printf %s hi > /work/hello.txt"]}
    req["input"] += [item, {"type": "function_call_output", "call_id": item["call_id"], "output": "ok"}]
    evs = events(httpx.post(f"{url}/v1/responses", json=req).text)
    done = next(e for e in evs if e["type"] == "response.output_item.done")["item"]
    assert done["type"] == "message" and done["content"][0]["text"] == standin.FINAL_TEXT
    # No tools offered (a title request): a short text answer.
    plain = httpx.post(f"{url}/v1/responses", json={"model": "m", "input": "title?"}).json()
    assert plain["output"][0]["content"][0]["text"] == standin.SIDE_TEXT
    assert httpx.get(f"{url}/v1/nope").status_code == 404
    log = [json.loads(line) for line in Path(standin.Handler.log_path or "").read_text().splitlines()]
    assert {e.get("key") for e in log if e["method"] == "POST"} >= {"k3"}

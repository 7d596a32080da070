"""The coding-agent templates against a real server: each agent's binary prints its pinned
version in a sandbox, and each agent that takes a custom model endpoint completes a real
non-interactive run — "create hello.txt containing hi" — against a model-API stand-in
(``fixtures/model_standin.py``), after which the file holds ``hi``.

The stand-in is uploaded into the sandbox and started there on guest loopback; the sandbox
is created without internet access, so no packet leaves the test and nothing the agent would
fetch at run time can hide a missing piece of its template. The key the agent presents is
the one given in ``envs`` at create: that is how users give theirs (docs/agents.md).

One sandbox per agent serves both of its tests (under TCG every process start is slow)."""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

from conftest import Server
from lizard import Lizard, Sandbox, SandboxInfo

STANDIN = Path(__file__).parent / "fixtures" / "model_standin.py"
STANDIN_PORT = 18080
STANDIN_URL = f"http://127.0.0.1:{STANDIN_PORT}"
WORKDIR = "/root/work"
TARGET = f"{WORKDIR}/hello.txt"
PROMPT = "create hello.txt containing hi"
#: A made-up key: the stand-in records the one each request carries.
KEY = "sk-lizard-test-0123456789"
#: Agents that run their model loop (opencode is a large native binary) need more than
#: the default 512 MiB: each agent template's `[sandbox]` makes 1 GiB its default.
MEMORY_MIB = 1024
#: Under TCG on a busy 2-core machine a run took 1–3 minutes (opencode the longest).
RUN_TIMEOUT_MS = 900_000
VERSION_TIMEOUT_MS = 300_000


@dataclass
class Agent:
    """One coding-agent template: its binary's version line, and (when it takes a custom
    model endpoint) the files that point it at the stand-in and the command of one run."""

    template: str
    version_cmd: str
    version: str
    envs: Dict[str, str] = field(default_factory=dict)
    config: Dict[str, str] = field(default_factory=dict)
    run: Optional[str] = None


CODEX_CONFIG = f"""model = "standin"
model_provider = "standin"

[model_providers.standin]
name = "Stand-in"
base_url = "{STANDIN_URL}/v1"
env_key = "OPENAI_API_KEY"
wire_api = "responses"
"""

OPENCODE_CONFIG = json.dumps({
    "$schema": "https://opencode.ai/config.json",
    "provider": {"standin": {
        "npm": "@ai-sdk/openai-compatible",
        "name": "Stand-in",
        "options": {"baseURL": f"{STANDIN_URL}/v1", "apiKey": "{env:OPENAI_API_KEY}"},
        "models": {"standin": {"name": "Stand-in"}},
    }},
    "model": "standin/standin",
})

PI_MODELS = json.dumps({"providers": {"standin": {
    "baseUrl": f"{STANDIN_URL}/v1",
    "api": "openai-completions",
    "apiKey": "OPENAI_API_KEY",
    "models": [{"id": "standin", "reasoning": False}],
}}})

AGENTS = {
    "claude": Agent(
        "claude", "claude --version", "2.1.332 (Claude Code)",
        envs={"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": STANDIN_URL,
              "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"},
        run=f"claude -p {shlex.quote(PROMPT)} --model standin --allowedTools Write",
    ),
    "codex": Agent(
        "codex", "codex --version", "codex-cli 0.171.0",
        envs={"OPENAI_API_KEY": KEY},
        config={"/root/.codex/config.toml": CODEX_CONFIG},
        run=f"codex exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox {shlex.quote(PROMPT)}",
    ),
    "opencode": Agent(
        "opencode", "opencode --version", "1.18.33",
        envs={"OPENAI_API_KEY": KEY, "OPENCODE_DISABLE_MODELS_FETCH": "1"},
        config={"/root/.config/opencode/opencode.json": OPENCODE_CONFIG},
        run=f"opencode run {shlex.quote(PROMPT)}",
    ),
    "pi": Agent(
        # pi prints its version on stderr.
        "pi", "pi --version 2>&1", "0.73.1",
        envs={"OPENAI_API_KEY": KEY, "PI_OFFLINE": "1"},
        config={"/root/.pi/agent/models.json": PI_MODELS},
        run=f"pi -p --provider standin --model standin {shlex.quote(PROMPT)}",
    ),
    # Prime Intellect's command line drives its platform; it has no model loop to point
    # at the stand-in, so its test is the version.
    "prime": Agent("prime", "prime --version 2>&1", "0.18.0"),
}


@pytest.fixture(scope="module")
def lz(server: Server, my_project) -> Lizard:
    return Lizard(project="my-project")


#: The agents whose model endpoint can be pointed at the stand-in.
RUNNABLE = sorted(name for name, agent in AGENTS.items() if agent.run is not None)


@pytest.fixture(scope="module")
def agent_sandbox(request: pytest.FixtureRequest, lz: Lizard) -> Iterator[tuple]:
    """A sandbox of the agent's template (the test's parameter) with the agent's envs and
    no internet access (a field the SDKs' ``create`` does not take, so it goes through the
    raw client). Tests of one agent share it: pytest groups them by parameter."""
    agent = AGENTS[request.param]
    started = time.monotonic()
    data = lz.platform.post(
        "/v1/sandboxes",
        json={"template": agent.template, "project": "my-project", "env": agent.envs,
              "allowInternetAccess": False, "timeoutMs": 3_600_000},
        timeout=600,
    )
    sandbox = Sandbox(SandboxInfo.from_json(data), lz.platform)
    try:
        assert sandbox.info.memory_mib == MEMORY_MIB, "the template's default size"
        yield agent, sandbox, started
    finally:
        sandbox.kill()


@pytest.mark.parametrize("agent_sandbox", sorted(AGENTS), indirect=True)
def test_agent_prints_its_version(agent_sandbox: tuple) -> None:
    agent, sandbox, started = agent_sandbox
    result = sandbox.process.exec_(agent.version_cmd, timeout_ms=VERSION_TIMEOUT_MS)
    print(f"{agent.template}: create → `{agent.version_cmd}` {time.monotonic() - started:.1f} s")
    assert result.exit_code == 0, result
    assert agent.version in result.stdout, result


@pytest.mark.parametrize("agent_sandbox", RUNNABLE, indirect=True)
def test_agent_run_writes_the_file(agent_sandbox: tuple) -> None:
    agent, sandbox, _ = agent_sandbox
    assert agent.run is not None
    start_standin(sandbox)
    for path, text in agent.config.items():
        sandbox.fs.write(path, text)
    sandbox.fs.make_dir(WORKDIR)
    began = time.monotonic()
    result = sandbox.process.exec_(f"{agent.run} < /dev/null", cwd=WORKDIR, timeout_ms=RUN_TIMEOUT_MS)
    print(f"{agent.template}: run {time.monotonic() - began:.1f} s")
    requests = standin_log(sandbox)
    assert result.exit_code == 0, (result, requests)
    assert sandbox.fs.read(TARGET) == "hi", (result, requests)
    # The scripted conversation happened: one tool call that wrote the file, then a final
    # message after its result, both with the key given at create.
    answered = [r.get("answered", "") for r in requests if r["method"] == "POST"]
    assert any(a.startswith("tool:") for a in answered), requests
    assert answered[-1] == "text", requests
    assert {r.get("key") for r in requests if r["method"] == "POST" and r.get("answered") != "count"} == {KEY}, requests
    assert "Done" in result.stdout, result


def start_standin(sandbox: Sandbox) -> None:
    """Upload the stand-in and start it on guest loopback; bounded wait until it listens."""
    sandbox.fs.write("/opt/standin/model_standin.py", STANDIN.read_text())
    started = sandbox.process.exec_(
        f"nohup python3 /opt/standin/model_standin.py --port {STANDIN_PORT} --file {TARGET} --content hi"
        " --log /tmp/standin.jsonl > /tmp/standin.out 2>&1 &"
    )
    assert started.exit_code == 0, started
    waited = sandbox.process.exec_(
        f"for i in $(seq 1 100); do curl -fsS {STANDIN_URL}/v1/models > /dev/null 2>&1 && exit 0; sleep 0.2; done;"
        " cat /tmp/standin.out; exit 1",
        timeout_ms=60_000,
    )
    assert waited.exit_code == 0, waited


def standin_log(sandbox: Sandbox) -> List[dict]:
    text = sandbox.process.exec_("cat /tmp/standin.jsonl 2>/dev/null").stdout
    return [json.loads(line) for line in text.splitlines() if line.strip()]

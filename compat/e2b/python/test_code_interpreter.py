"""E2B's code interpreter add-on (the published `e2b-code-interpreter` package,
unchanged) on Lizard: its default template, `code-interpreter-v1`, is Lizard's
`interpreter` (the server's E2B template mapping), whose one code service answers the
add-on's protocol through the E2B face. Run by scripts/test-sdk.sh with the add-on's
own virtualenv (E2B_CODE_INTERPRETER_VERSIONS)."""

from __future__ import annotations

import base64

import httpx
import pytest
from e2b.exceptions import SandboxException
from e2b_code_interpreter import Sandbox

from conftest import SANDBOX_URL


@pytest.fixture
def sbx(e2b_env):
    s = Sandbox.create()
    yield s
    s.kill()


def test_run_code_streams_keeps_state_and_returns_results(sbx):
    seen = []
    ex = sbx.run_code("print('hello'); x = 41\nx + 1", on_stdout=lambda m: seen.append(m.line))
    assert (ex.logs.stdout, ex.text, ex.error) == (["hello\n"], "42", None)
    assert seen == ["hello\n"] and ex.execution_count >= 1
    assert sbx.run_code("x").text == "41"
    chart = sbx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
    pngs = [r.png for r in chart.results if r.png]
    assert pngs and base64.b64decode(pngs[0]).startswith(b"\x89PNG"), chart.results
    failed = sbx.run_code("1 / 0")
    assert failed.error is not None and failed.error.name == "ZeroDivisionError"
    assert "ZeroDivisionError" in failed.error.traceback
    # Its port runs code: private by default, nothing runs without the traffic token.
    assert sbx.traffic_access_token
    route = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49999"}
    bare = httpx.post(SANDBOX_URL + "/execute", headers=route, json={"code": "open('/tmp/pwned', 'w')"})
    assert bare.status_code == 401
    assert sbx.run_code("import os; os.path.exists('/tmp/pwned')").text == "False"


def test_contexts_languages_and_what_is_not_served(sbx):
    ctx = sbx.create_code_context(language="python")
    assert ctx.language == "python" and ctx.id
    sbx.run_code("y = 5", context=ctx)
    assert sbx.run_code("y", context=ctx).text == "5"
    assert sbx.run_code("'y' in dir()").text == "False"
    assert ctx.id in [c.id for c in sbx.list_code_contexts()]
    sbx.restart_code_context(ctx)
    assert sbx.run_code("'y' in dir()", context=ctx).text == "False"
    sbx.remove_code_context(ctx)
    assert ctx.id not in [c.id for c in sbx.list_code_contexts()]
    assert sbx.run_code("echo from bash", language="bash").logs.stdout == ["from bash\n"]
    js = sbx.run_code("console.log('from js')", language="javascript")
    assert js.logs.stdout == ["from js\n"] and js.error is None
    with pytest.raises(SandboxException) as refused:
        sbx.run_code("1", language="r")
    assert "not served" in str(refused.value)


def test_public_when_asked_as_on_e2b(e2b_env):
    sbx = Sandbox.create(network={"allow_public_traffic": True})
    try:
        assert not sbx.traffic_access_token
        ctx = sbx.create_code_context()
        assert sbx.run_code("2 * 21", context=ctx).text == "42"
    finally:
        sbx.kill()

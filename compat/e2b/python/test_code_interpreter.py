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
    ts = sbx.run_code("const n: number = 41\nn + 1", language="typescript")
    assert (ts.text, ts.error) == ("42", None)
    r_ctx = sbx.create_code_context(language="r")
    assert r_ctx.language == "r"
    r = sbx.run_code("v <- 1:4\nsum(v)", context=r_ctx)
    assert (r.text, r.error) == ("[1] 10", None)
    assert sbx.run_code("mean(v)", context=r_ctx).text == "[1] 2.5"
    with pytest.raises(SandboxException) as refused:
        sbx.run_code("1", language="cobol")
    assert "not served" in str(refused.value)


def only_chart(execution):
    """The one chart among an execution's results (beside its PNG)."""
    charts = [r for r in execution.results if r.chart]
    assert len(charts) == 1 and charts[0].png, execution.results
    return charts[0].chart


def test_a_figure_comes_with_its_data_as_a_chart(sbx):
    sbx.run_code("import matplotlib.pyplot as plt")
    line = only_chart(sbx.run_code(
        "fig, ax = plt.subplots()\n"
        "ax.plot([1, 2, 3], [2, 4, 8], label='doubling')\n"
        "ax.set_title('Growth'); ax.set_xlabel('Day'); ax.set_ylabel('Size (cm)')\n"
        "plt.show()"
    ))
    assert (line.type, line.title, line.x_label, line.y_label, line.y_unit) == ("line", "Growth", "Day", "Size (cm)", "cm")
    assert [(e.label, e.points) for e in line.elements] == [("doubling", [(1.0, 2.0), (2.0, 4.0), (3.0, 8.0)])]
    assert line.x_scale == "linear" and line.x_ticks and len(line.x_tick_labels) == len(line.x_ticks)

    bar = only_chart(sbx.run_code(
        "fig, ax = plt.subplots(); ax.bar(['apples', 'pears'], [3, 5], label='2024'); ax.set_title('Fruit'); plt.show()"
    ))
    assert (bar.type, bar.title) == ("bar", "Fruit")
    assert [(e.label, e.group, e.value) for e in bar.elements] == [("apples", "2024", 3.0), ("pears", "2024", 5.0)]

    pie = only_chart(sbx.run_code("fig, ax = plt.subplots(); ax.pie([1, 3], labels=['a', 'b']); plt.show()"))
    assert pie.type == "pie"
    assert [(e.label, round(e.angle), e.radius) for e in pie.elements] == [("a", 90, 1.0), ("b", 270, 1.0)]

    both = only_chart(sbx.run_code(
        "fig, (a, b) = plt.subplots(1, 2); a.plot([0, 1], [1, 0]); b.scatter([1, 2], [3, 4], label='dots')\n"
        "fig.suptitle('Both'); plt.show()"
    ))
    assert (both.type, both.title) == ("superchart", "Both")
    assert [c.type for c in both.elements] == ["line", "scatter"]
    assert [(e.label, e.points) for e in both.elements[1].elements] == [("dots", [(1.0, 3.0), (2.0, 4.0)])]
    # A value that is no figure has no chart.
    assert not any(r.chart for r in sbx.run_code("42").results)


def test_public_when_asked_as_on_e2b(e2b_env):
    sbx = Sandbox.create(network={"allow_public_traffic": True})
    try:
        assert not sbx.traffic_access_token
        ctx = sbx.create_code_context()
        assert sbx.run_code("2 * 21", context=ctx).text == "42"
    finally:
        sbx.kill()

"""E2B's code interpreter add-on (the published `e2b-code-interpreter` package,
unchanged) on Lizard: its default template, `code-interpreter-v1`, is Lizard's
`interpreter` (the server's E2B template mapping), whose one code service answers the
add-on's protocol through the E2B face. Run by scripts/test-sdk.sh with the add-on's
own virtualenv (E2B_CODE_INTERPRETER_VERSIONS)."""

from __future__ import annotations

import asyncio
import base64

import httpx
import pytest
from e2b.exceptions import NotFoundException, SandboxException, TimeoutException
from e2b_code_interpreter import AsyncSandbox, Sandbox

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


def test_each_mime_type_comes_in_its_field(sbx):
    ex = sbx.run_code(
        "from IPython.display import display, HTML, Markdown, SVG, Latex, JSON, Javascript, Image\n"
        "import io, PIL.Image\n"
        "jpeg = io.BytesIO(); PIL.Image.new('RGB', (4, 4), 'red').save(jpeg, 'JPEG')\n"
        "display(HTML('<b>bold</b>')); display(Markdown('# Title'))\n"
        "display(SVG('<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"1\" height=\"1\"/>'))\n"
        "display(Latex(r'$x^2$')); display(JSON({'a': 1})); display(Javascript('console.log(1)'))\n"
        "display(Image(data=jpeg.getvalue(), format='jpeg'))\n"
        "display({'application/pdf': 'JVBERi0xLjQK', 'text/plain': 'a pdf'}, raw=True)\n"
        "'main'"
    )
    assert ex.error is None, ex.error
    r = ex.results
    assert len(r) == 9, r
    assert (r[0].html, r[1].markdown, r[3].latex, r[4].json, r[5].javascript) == (
        "<b>bold</b>", "# Title", "$x^2$", {"a": 1}, "console.log(1)"
    )
    assert r[2].svg.startswith("<svg")
    assert base64.b64decode(r[6].jpeg).startswith(b"\xff\xd8")
    assert r[7].pdf == "JVBERi0xLjQK"
    assert not any(x.is_main_result for x in r[:8]) and r[8].is_main_result and ex.text == "'main'"


def test_a_client_timeout_stops_the_cell_and_keeps_the_context(sbx):
    # The add-on's `timeout` is its client's: when it gives up and closes the connection,
    # the cell is interrupted (as E2B's server cancels it), its variables kept.
    sbx.run_code("x = 1")
    with pytest.raises(TimeoutException):
        sbx.run_code("import time; time.sleep(60); x = 2", timeout=3)
    assert sbx.run_code("x").text == "1"
    js = sbx.create_code_context(language="javascript")
    sbx.run_code("var y = 1", context=js)
    with pytest.raises(TimeoutException):
        sbx.run_code("await new Promise(r => setTimeout(r, 60000)); y = 2", context=js, timeout=3)
    assert sbx.run_code("y", context=js).text == "1"
    # A context that is gone is the add-on's NotFound.
    sbx.remove_code_context(js)
    with pytest.raises(NotFoundException):
        sbx.run_code("y", context=js)


def test_the_async_sandbox(e2b_env):
    async def main():
        sbx = await AsyncSandbox.create()
        try:
            seen = []
            ex = await sbx.run_code("print('a'); 6 * 7", on_stdout=lambda m: seen.append(m.line))
            assert (ex.text, seen) == ("42", ["a\n"])
            ctx = await sbx.create_code_context(language="r")
            assert (await sbx.run_code("sum(1:3)", context=ctx)).text == "[1] 6"
            assert ctx.id in [c.id for c in await sbx.list_code_contexts()]
        finally:
            await sbx.kill()

    asyncio.run(main())


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

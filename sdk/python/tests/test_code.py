"""``run_code`` and code contexts against a real server and a sandbox of the built-in
``interpreter`` template. One sandbox serves the module (creates and kernel starts are
slow under TCG); tests that change a context's life (kill, restart) use contexts of their
own, so the order of the tests does not matter."""

from __future__ import annotations

import asyncio
import base64
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator, List, Tuple

import httpx
import pytest

from conftest import Server
from lizard import (
    APITimeoutError,
    AsyncSandbox,
    BadGatewayError,
    InvalidArgumentError,
    Lizard,
    NotFoundError,
    Result,
    Sandbox,
)

TEMPLATE = "interpreter"


@pytest.fixture(scope="module")
def sandbox(server: Server, my_project) -> Iterator[Sandbox]:
    sb = Lizard(project="my-project").create(TEMPLATE, timeout_ms=1_800_000)
    yield sb
    try:
        sb.kill()
    except NotFoundError:
        pass


def png_size(b64: str) -> Tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    raw = base64.b64decode(b64)
    assert raw[:8] == b"\x89PNG\r\n\x1a\n", "a PNG"
    return struct.unpack(">II", raw[16:24])


def test_python_analysis_csv_pandas_matplotlib_png(sandbox: Sandbox) -> None:
    # The announcement's "Python analysis": a CSV in the sandbox, pandas reads it,
    # matplotlib plots it; the figure comes back as a PNG of the figure's size.
    sandbox.fs.write("/tmp/sales.csv", "month,sales\n1,10\n2,14\n3,9\n4,20\n")
    code = (
        "import pandas as pd\n"
        "import matplotlib.pyplot as plt\n"
        "df = pd.read_csv('/tmp/sales.csv')\n"
        "fig, ax = plt.subplots(figsize=(6, 4), dpi=100)\n"
        "ax.plot(df['month'], df['sales'])\n"
        "print(df['sales'].sum())\n"
        "plt.show()\n"
        "float(df['sales'].mean())\n"
    )
    execution = sandbox.run_code(code, timeout=240)
    assert execution.error is None, execution.error
    assert execution.logs.stdout == ["53\n"]
    pngs = [r for r in execution.results if r.png]
    assert len(pngs) == 1 and not pngs[0].is_main_result, execution.results
    assert png_size(pngs[0].png or "") == (600, 400)
    assert execution.text == "13.25"


def test_variables_persist_between_runs(sandbox: Sandbox) -> None:
    assert sandbox.run_code("x = 41").results == []
    execution = sandbox.run_code("x + 1")
    assert execution.text == "42"
    assert [r.is_main_result for r in execution.results] == [True]
    assert execution.execution_count is not None and execution.execution_count >= 2


def test_stdout_streams_in_order_as_it_happens(sandbox: Sandbox) -> None:
    seen: List[Tuple[str, float]] = []
    code = "import time, sys\nfor i in range(3):\n    print(f'line {i}', flush=True)\n    time.sleep(0.7)\nprint('oops', file=sys.stderr)\n"
    execution = sandbox.run_code(code, on_stdout=lambda t: seen.append((t, time.monotonic())))
    end = time.monotonic()
    assert "".join(execution.logs.stdout) == "line 0\nline 1\nline 2\n"
    assert [t for t, _ in seen] == execution.logs.stdout
    # The first line arrived while the code still slept, not all at the end.
    assert end - seen[0][1] > 1.0, (seen, end)
    assert "".join(execution.logs.stderr) == "oops\n"


def test_an_exception_is_an_error_with_name_and_traceback(sandbox: Sandbox) -> None:
    errors = []
    execution = sandbox.run_code("def f():\n    return 1 / 0\nf()", on_error=errors.append)
    assert execution.error is not None
    assert execution.error.name == "ZeroDivisionError"
    assert execution.error.value == "division by zero"
    assert "f()" in execution.error.traceback and "ZeroDivisionError" in execution.error.traceback
    assert errors == [execution.error]
    # The context is fine afterwards.
    assert sandbox.run_code("2 * 21").text == "42"


def test_results_carry_mime_bundles(sandbox: Sandbox) -> None:
    results: List[Result] = []
    code = "from IPython.display import display, HTML\ndisplay(HTML('<b>hi</b>'))\n{'a': 1}"
    execution = sandbox.run_code(code, on_result=results.append)
    assert results == execution.results
    html, main = execution.results
    assert html.html == "<b>hi</b>" and not html.is_main_result
    assert main.is_main_result and main.text == "{'a': 1}"
    assert "html" in html.formats() and "text" in main.formats()


def test_envs_hold_for_one_run(sandbox: Sandbox) -> None:
    code = "import os; os.environ.get('LZ_TEST_VAR')"
    assert sandbox.run_code(code, envs={"LZ_TEST_VAR": "only now"}).text == "'only now'"
    assert sandbox.run_code(code).text is None


def test_a_timeout_interrupts_the_kernel_and_keeps_its_state(sandbox: Sandbox) -> None:
    ctx = sandbox.create_code_context()
    sandbox.run_code("kept = 'yes'", context=ctx)
    started = time.monotonic()
    execution = sandbox.run_code("import time\nwhile True:\n    time.sleep(0.1)", context=ctx, timeout=2)
    assert time.monotonic() - started < 30
    assert execution.error is not None and execution.error.name == "TimeoutError", execution.error
    assert "interrupted" in execution.error.value
    assert sandbox.run_code("kept", context=ctx).text == "'yes'"
    sandbox.remove_code_context(ctx)


def test_a_caller_that_goes_away_stops_its_cell(sandbox: Sandbox) -> None:
    # The HTTP call given up (request_timeout) closes the connection: the code service
    # interrupts the cell, as on a timeout, and the context keeps its state.
    ctx = sandbox.create_code_context()
    sandbox.run_code("kept = 1", context=ctx)
    with pytest.raises(APITimeoutError):
        sandbox.run_code("import time\ntime.sleep(60)\nkept = 2", context=ctx, request_timeout=3)
    assert sandbox.run_code("kept", context=ctx).text == "1"
    # A caller that goes away while its cell waits for the context (another cell has it):
    # its cell never runs.
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(sandbox.run_code, "import time\ntime.sleep(8)\nkept = 3", context=ctx)
        time.sleep(2)
        with pytest.raises(APITimeoutError):
            sandbox.run_code("kept = 2", context=ctx, request_timeout=2)
        assert first.result().error is None
    assert sandbox.run_code("kept", context=ctx).text == "3"
    sandbox.remove_code_context(ctx)


def test_a_killed_kernel_is_reported_and_restarted(sandbox: Sandbox) -> None:
    ctx = sandbox.create_code_context()
    sandbox.run_code("y = 1", context=ctx)
    execution = sandbox.run_code("import os\nos.kill(os.getpid(), 9)", context=ctx)
    assert execution.error is not None and execution.error.name == "DeadKernelError", execution.error
    assert "variables are lost" in execution.error.value
    # The next run gets a new kernel: it works, and the old state is gone.
    after = sandbox.run_code("y", context=ctx)
    assert after.error is not None and after.error.name == "NameError", after.error
    assert sandbox.run_code("1 + 1", context=ctx).text == "2"
    sandbox.remove_code_context(ctx)


def test_contexts_are_isolated_and_managed(sandbox: Sandbox) -> None:
    a = sandbox.create_code_context(cwd="/tmp")
    b = sandbox.create_code_context()
    assert (a.language, a.cwd) == ("python", "/tmp")
    sandbox.run_code("v = 'a'", context=a)
    sandbox.run_code("v = 'b'", context=b)
    assert sandbox.run_code("v", context=a).text == "'a'"
    assert sandbox.run_code("v", context=b).text == "'b'"
    assert sandbox.run_code("import os; os.getcwd()", context=a).text == "'/tmp'"
    ids = {c.id for c in sandbox.list_code_contexts()}
    assert {a.id, b.id} <= ids
    restarted = sandbox.restart_code_context(a)
    assert restarted.id == a.id
    assert sandbox.run_code("v", context=a).error is not None
    sandbox.remove_code_context(b)
    assert b.id not in {c.id for c in sandbox.list_code_contexts()}
    with pytest.raises(NotFoundError):
        sandbox.run_code("1", context=b)
    with pytest.raises(InvalidArgumentError):
        sandbox.run_code("1", language="ruby")
    with pytest.raises(InvalidArgumentError):
        sandbox.run_code("1", language="python", context=a)
    sandbox.remove_code_context(a)


def test_async_run_code_and_contexts(sandbox: Sandbox) -> None:
    async def main() -> None:
        sb = await AsyncSandbox.connect(sandbox.sandbox_id)
        seen: List[str] = []

        async def on_stdout(text: str) -> None:
            seen.append(text)

        execution = await sb.run_code("print('async'); 6 * 7", on_stdout=on_stdout, on_result=lambda r: seen.append(r.text or ""))
        assert execution.text == "42" and execution.logs.stdout == ["async\n"], execution
        assert seen == ["async\n", "42"]
        ctx = await sb.create_code_context(cwd="/tmp")
        await sb.run_code("w = 'kept'", context=ctx)
        assert (await sb.run_code("w", context=ctx)).text == "'kept'"
        assert ctx.id in {c.id for c in await sb.list_code_contexts()}
        assert (await sb.restart_code_context(ctx)).id == ctx.id
        assert (await sb.run_code("w", context=ctx)).error is not None
        await sb.remove_code_context(ctx)
        with pytest.raises(NotFoundError):
            await sb.run_code("1", context=ctx)

    asyncio.run(main())


def test_javascript_context(sandbox: Sandbox) -> None:
    first = sandbox.run_code("let n = 40; console.log('from node'); n + 2", language="javascript")
    assert first.error is None, first.error
    assert first.logs.stdout == ["from node\n"] and first.text == "42"
    assert sandbox.run_code("n * 2", language="javascript").text == "80"
    failed = sandbox.run_code("null.x", language="javascript")
    assert failed.error is not None and failed.error.name == "TypeError", failed.error
    waited = sandbox.run_code("await new Promise(r => setTimeout(r, 50)); console.log('later')", language="javascript")
    assert waited.logs.stdout == ["later\n"], waited


def test_typescript_context(sandbox: Sandbox) -> None:
    first = sandbox.run_code(
        "interface P { n: number }\nconst p: P = { n: 40 }\nfunction twice<T>(x: T): T[] { return [x, x] }\n"
        "console.log(twice<string>('ts').join(' '))\np.n + 2",
        language="typescript",
    )
    assert first.error is None, first.error
    assert first.logs.stdout == ["ts ts\n"] and first.text == "42"
    assert sandbox.run_code("(p.n as number) * 2", language="typescript").text == "80"
    # What type stripping cannot erase is refused by name, and the context lives on.
    refused = sandbox.run_code("enum Colour { Red }", language="typescript")
    assert refused.error is not None and refused.error.name == "SyntaxError", refused.error
    assert "enum" in refused.error.value
    waited = sandbox.run_code("const w: number = await Promise.resolve(7); console.log(w)", language="typescript")
    assert waited.logs.stdout == ["7\n"], waited
    assert sandbox.run_code("p.n", language="typescript").text == "40"
    # JavaScript's default context is another process: TypeScript's names are not in it.
    assert sandbox.run_code("typeof p", language="javascript").text == "'undefined'"


def test_r_context(sandbox: Sandbox) -> None:
    ctx = sandbox.create_code_context(language="r", cwd="/tmp")
    assert ctx.language == "r"
    first = sandbox.run_code("x <- c(1, 2, 3)\ncat('mean', mean(x), '\\n')\nsum(x)", context=ctx)
    assert first.error is None, first.error
    assert "".join(first.logs.stdout) == "mean 2 \n" and first.text == "[1] 6", first
    assert sandbox.run_code("getwd()", context=ctx).text == '[1] "/tmp"'
    # envs hold for one run only.
    assert sandbox.run_code("Sys.getenv('LZ_R')", context=ctx, envs={"LZ_R": 'a "b"'}).text == '[1] "a \\"b\\""'
    assert sandbox.run_code("Sys.getenv('LZ_R', unset = 'none')", context=ctx).text == '[1] "none"'
    plot = sandbox.run_code("plot(x, x^2)", context=ctx)
    pngs = [r.png for r in plot.results if r.png]
    assert pngs and base64.b64decode(pngs[0]).startswith(b"\x89PNG"), plot.results
    failed = sandbox.run_code("stop('no such thing')", context=ctx)
    assert failed.error is not None and "no such thing" in failed.error.value, failed.error
    assert sandbox.run_code("length(x)", context=ctx).text == "[1] 3"
    sandbox.remove_code_context(ctx)


def test_bash_context(sandbox: Sandbox) -> None:
    ctx = sandbox.create_code_context(language="bash")
    assert ctx.language == "bash"
    out = sandbox.run_code("GREETING=hello; cd /tmp; echo $GREETING", context=ctx)
    assert out.logs.stdout == ["hello\n"] and out.error is None
    again = sandbox.run_code('echo "$GREETING from $(pwd)"; echo to-stderr >&2', context=ctx)
    assert "".join(again.logs.stdout) == "hello from /tmp\n"
    assert "".join(again.logs.stderr) == "to-stderr\n"
    failed = sandbox.run_code("exit_code_test() { return 3; }; exit_code_test", context=ctx)
    assert failed.error is not None and failed.error.value == "exit status 3"
    # A timeout interrupts the running command, not the context: its variables stay.
    slow = sandbox.run_code("sleep 60", context=ctx, timeout=2)
    assert slow.error is not None and slow.error.name == "TimeoutError", slow.error
    assert sandbox.run_code("echo $GREETING", context=ctx).logs.stdout == ["hello\n"]
    sandbox.remove_code_context(ctx)


def test_pause_and_resume_keep_variables(server: Server, my_project) -> None:
    sb = Lizard(project="my-project").create(TEMPLATE)
    try:
        sb.run_code("kept_across_pause = 'still here'")
        sb.pause()
        back = Sandbox.connect(sb.sandbox_id)
        assert back.run_code("kept_across_pause").text == "'still here'"
    finally:
        sb.kill()


def test_the_code_port_is_not_reachable_through_a_sandbox_url(server: Server, sandbox: Sandbox) -> None:
    for port in (49999, 49171):
        r = httpx.get(f"http://{server.proxy}/contexts", headers={"Host": sandbox.get_host(port)}, timeout=30)
        assert r.status_code == 403, (port, r.status_code, r.text)
        assert r.json()["code"] == "FORBIDDEN" and "reserved" in r.json()["message"]


def test_a_sandbox_without_the_code_service_says_so(server: Server, my_project) -> None:
    sb = Lizard(project="my-project").create("base")
    try:
        with pytest.raises(BadGatewayError) as e:
            sb.run_code("1")
        assert e.value.code == "CODE_SERVICE_UNAVAILABLE"
        assert "interpreter" in e.value.message
    finally:
        sb.kill()

// E2B's code interpreter add-on from npm (`@e2b/code-interpreter`, unchanged) against a
// real `lizard server`: its default template, code-interpreter-v1, is Lizard's
// interpreter; the add-on's protocol on port 49999 is answered by the E2B face from the
// guest's one code service. scripts/test-sdk.sh installs the version asked for
// (E2B_JS_CODE_INTERPRETER_VERSIONS) and sets the same variables as for the core tests.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { forgetE2bEnv, scopedE2bEnv } from './setup.mjs'

let workspace
let ci

before(async () => {
  workspace = await scopedE2bEnv('e2b-ci-js')
  ci = await import('@e2b/code-interpreter')
})

after(() => forgetE2bEnv(workspace))

test('runCode streams, keeps state, returns a chart and errors; contexts; languages', async () => {
  const sbx = await ci.Sandbox.create()
  try {
    const seen = []
    const ex = await sbx.runCode("print('hello'); x = 41\nx + 1", { onStdout: (m) => seen.push(m.line) })
    assert.deepEqual([ex.logs.stdout, ex.text, ex.error], [['hello\n'], '42', undefined])
    assert.deepEqual(seen, ['hello\n'])
    assert.equal((await sbx.runCode('x')).text, '41')
    const chart = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()')
    const png = chart.results.find((r) => r.png)?.png
    assert.ok(png && Buffer.from(png, 'base64').subarray(0, 4).toString('latin1') === '\x89PNG', JSON.stringify(chart))
    // The figure's data beside its picture.
    const data = chart.results.find((r) => r.chart)?.chart
    assert.equal(data?.type, 'line', JSON.stringify(chart))
    assert.deepEqual(data.elements[0].points, [[0, 1], [1, 2], [2, 3]])
    const failed = await sbx.runCode('1 / 0')
    assert.equal(failed.error?.name, 'ZeroDivisionError')
    const ctx = await sbx.createCodeContext({ language: 'python' })
    await sbx.runCode('y = 5', { context: ctx })
    assert.equal((await sbx.runCode('y', { context: ctx })).text, '5')
    assert.ok((await sbx.listCodeContexts()).some((c) => c.id === ctx.id))
    await sbx.removeCodeContext(ctx)
    assert.deepEqual((await sbx.runCode('echo from bash', { language: 'bash' })).logs.stdout, ['from bash\n'])
    assert.deepEqual((await sbx.runCode("console.log('from js')", { language: 'js' })).logs.stdout, ['from js\n'])
    const ts = await sbx.runCode('const n: number = 41\nn + 1', { language: 'ts' })
    assert.equal(ts.text, '42')
    assert.equal((await sbx.runCode('sum(1:4)', { language: 'r' })).text, '[1] 10')
    await assert.rejects(sbx.runCode('1', { language: 'cobol' }), /not served/)
  } finally {
    await sbx.kill()
  }
})

// runCode and code contexts against a real server and a sandbox of the built-in
// `interpreter` template (one sandbox for the file: creates and kernel starts are slow
// under TCG).

import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Lizard, InvalidArgumentError, NotFoundError } from '../src/index.js'
import { server, myProject } from './helpers.js'

let sandbox

before(async () => {
  await server()
  await myProject()
  sandbox = await new Lizard({ project: 'my-project' }).create('interpreter', { timeoutMs: 1_800_000 })
})

after(async () => {
  await sandbox?.kill().catch(() => {})
})

test('variables persist: x = 41, then x + 1 is 42', async () => {
  const first = await sandbox.runCode('x = 41')
  assert.deepEqual(first.results, [])
  const second = await sandbox.runCode('x + 1')
  assert.equal(second.text, '42')
  assert.equal(second.results[0].isMainResult, true)
  assert.ok(second.executionCount >= 2)
})

test('stdout streams to onStdout in order, as it happens', async () => {
  const seen = []
  const code = "import time\nfor i in range(3):\n    print(f'line {i}', flush=True)\n    time.sleep(0.7)\n"
  const execution = await sandbox.runCode(code, { onStdout: (t) => seen.push([t, Date.now()]) })
  const end = Date.now()
  assert.equal(execution.logs.stdout.join(''), 'line 0\nline 1\nline 2\n')
  assert.deepEqual(seen.map(([t]) => t), execution.logs.stdout)
  assert.ok(end - seen[0][1] > 1000, 'the first line came while the code still ran')
})

test('an exception is execution.error with its name and traceback', async () => {
  const errors = []
  const execution = await sandbox.runCode('1 / 0', { onError: (e) => errors.push(e) })
  assert.equal(execution.error.name, 'ZeroDivisionError')
  assert.equal(execution.error.value, 'division by zero')
  assert.match(execution.error.traceback, /ZeroDivisionError/)
  assert.deepEqual(errors, [execution.error])
})

test('a PNG figure comes back as a result of the figure size', async () => {
  const code = 'import matplotlib.pyplot as plt\nplt.figure(figsize=(3, 2), dpi=100)\nplt.plot([1, 2])\nplt.show()'
  const execution = await sandbox.runCode(code, { timeoutMs: 240_000 })
  const [png] = execution.results.filter((r) => r.png)
  const raw = Buffer.from(png.png, 'base64')
  assert.deepEqual([raw.readUInt32BE(16), raw.readUInt32BE(20)], [300, 200])
  assert.ok(png.formats().includes('png'))
})

test('javascript and bash contexts keep their state', async () => {
  const js = await sandbox.runCode("const k = 20; console.log('node'); k * 2", { language: 'javascript' })
  assert.deepEqual([js.logs.stdout, js.text], [['node\n'], '40'])
  assert.equal((await sandbox.runCode('k + 2', { language: 'javascript' })).text, '22')
  const ctx = await sandbox.createCodeContext({ language: 'bash', cwd: '/tmp' })
  await sandbox.runCode('WORD=kept', { context: ctx })
  const bash = await sandbox.runCode('echo "$WORD in $(pwd)"', { context: ctx })
  assert.deepEqual(bash.logs.stdout, ['kept in /tmp\n'])
  await sandbox.removeCodeContext(ctx)
})

test('typescript and r contexts', async () => {
  const ts = await sandbox.runCode('type N = number\nconst m: N = 21\nm * 2', { language: 'typescript' })
  assert.deepEqual([ts.error, ts.text], [undefined, '42'])
  const ctx = await sandbox.createCodeContext({ language: 'r' })
  assert.equal(ctx.language, 'r')
  await sandbox.runCode('w <- c(2, 4)', { context: ctx })
  assert.equal((await sandbox.runCode('sum(w)', { context: ctx })).text, '[1] 6')
  await sandbox.removeCodeContext(ctx)
})

test('contexts are isolated; bad requests are typed errors', async () => {
  const a = await sandbox.createCodeContext()
  const b = await sandbox.createCodeContext()
  await sandbox.runCode("v = 'a'", { context: a })
  await sandbox.runCode("v = 'b'", { context: b.id })
  assert.equal((await sandbox.runCode('v', { context: a })).text, "'a'")
  assert.equal((await sandbox.runCode('v', { context: b })).text, "'b'")
  const ids = (await sandbox.listCodeContexts()).map((c) => c.id)
  assert.ok(ids.includes(a.id) && ids.includes(b.id))
  await sandbox.removeCodeContext(a)
  await sandbox.removeCodeContext(b)
  await assert.rejects(sandbox.runCode('1', { context: a }), NotFoundError)
  await assert.rejects(sandbox.runCode('1', { language: 'ruby' }), InvalidArgumentError)
})

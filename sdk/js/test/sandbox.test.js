// The SDK's sandbox and account surface against a real server. One sandbox is shared by the
// file where the tests allow it (creates are slow under TCG).

import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import {
  Lizard,
  Sandbox,
  NotFoundError,
  ConflictError,
  InvalidArgumentError,
  AuthenticationError,
} from '../src/index.js'
import { server, myProject } from './helpers.js'

let sandbox
let project

before(async () => {
  await server()
  project = await myProject()
  // The reference's static form, with the project by name.
  sandbox = await Sandbox.create('base', { project: 'my-project' })
})

after(async () => {
  await sandbox?.kill().catch(() => {})
})

test('create returns a running sandbox in the project', () => {
  assert.equal(sandbox.state, 'running')
  assert.equal(sandbox.template, 'base')
  assert.equal(sandbox.info.projectId, project.id)
  assert.equal(sandbox.id, sandbox.sandboxId)
  assert.ok(sandbox.info.endAt)
})

test('process.exec returns { stdout, stderr, exitCode }', async () => {
  const r = await sandbox.process.exec('echo out; echo err >&2; exit 3')
  assert.equal(r.stdout, 'out\n')
  assert.equal(r.stderr, 'err\n')
  assert.equal(r.exitCode, 3)
  assert.equal((await sandbox.process.exec(['printf', '%s|', 'a b', 'c'])).stdout, 'a b|c|')
  assert.equal((await sandbox.process.exec('echo $GREETING; pwd', { envs: { GREETING: 'hi' }, cwd: '/tmp' })).stdout, 'hi\n/tmp\n')
  assert.equal((await sandbox.process.exec('cat', { stdin: 'fed' })).stdout, 'fed')
  const slow = await sandbox.process.exec('sleep 30', { timeoutMs: 500 })
  assert.equal(slow.exitCode, 124)
  assert.equal(slow.timedOut, true)
  assert.equal((await sandbox.process.exec('node -e "console.log(6*7)"')).stdout, '42\n')
  // Streamed: the callbacks see the output as it comes, the result has all of it.
  const chunks = []
  const streamed = await sandbox.process.exec('for i in 1 2 3; do echo $i; sleep 0.3; done; echo e >&2; exit 2', {
    onStdout: (t) => chunks.push(t),
    onStderr: (t) => chunks.push(t),
  })
  assert.deepEqual([streamed.stdout, streamed.stderr, streamed.exitCode], ['1\n2\n3\n', 'e\n', 2])
  assert.ok(chunks.length >= 3 && chunks.join('') === '1\n2\n3\ne\n', JSON.stringify(chunks))
})

test('fs round trip', async () => {
  const d = `/tmp/sdk-${randomUUID().slice(0, 6)}`
  await sandbox.fs.makeDir(`${d}/sub/deeper`)
  await sandbox.fs.write(`${d}/a.txt`, 'héllo\n')
  const bytes = Uint8Array.from({ length: 256 }, (_, i) => i)
  await sandbox.fs.write(`${d}/b.bin`, bytes)
  assert.equal(await sandbox.fs.read(`${d}/a.txt`), 'héllo\n')
  assert.deepEqual(await sandbox.fs.readBytes(`${d}/b.bin`), bytes)
  const entries = await sandbox.fs.list(d)
  assert.deepEqual(entries.map((e) => [e.name, e.type]), [['a.txt', 'file'], ['b.bin', 'file'], ['sub', 'dir']])
  assert.equal(entries[1].size, 256)
  assert.equal((await sandbox.process.exec(`cat ${d}/a.txt`)).stdout, 'héllo\n')
  await sandbox.fs.remove(`${d}/a.txt`)
  await sandbox.fs.remove(`${d}/sub`)
  assert.deepEqual((await sandbox.fs.list(d)).map((e) => e.name), ['b.bin'])
  await assert.rejects(sandbox.fs.read(`${d}/a.txt`), (e) => e instanceof NotFoundError && e.code === 'NOT_FOUND')
})

test('connect, list and setTimeout', async () => {
  const again = await Sandbox.connect(sandbox.sandboxId)
  assert.equal(again.sandboxId, sandbox.sandboxId)
  assert.equal((await again.process.exec('echo connected')).stdout, 'connected\n')
  assert.ok((await Sandbox.list()).some((s) => s.sandboxId === sandbox.sandboxId))
  assert.ok((await new Lizard({ project: 'my-project' }).list()).some((s) => s.sandboxId === sandbox.sandboxId))
  const before = sandbox.info.endAt
  await sandbox.setTimeout(3_600_000)
  assert.ok(sandbox.info.endAt > before)
  await assert.rejects(sandbox.setTimeout(0), (e) => e instanceof InvalidArgumentError && e.code === 'INVALID_ARGUMENT' && e.status === 422)
})

test('an expired sandbox is NotFoundError', async () => {
  const lizard = new Lizard({ project: 'my-project' })
  const sb = await lizard.create('base', { timeoutMs: 60_000 })
  await sb.setTimeout(1_000)
  const deadline = Date.now() + 30_000
  for (;;) {
    try {
      await Sandbox.connect(sb.sandboxId)
    } catch (e) {
      assert.ok(e instanceof NotFoundError, String(e))
      break
    }
    assert.ok(Date.now() < deadline, 'the sandbox outlived its timeout')
    await new Promise((r) => setTimeout(r, 500))
  }
  await assert.rejects(sb.process.exec('true'), NotFoundError)
  await assert.rejects(sb.kill(), NotFoundError)
})

test('create errors are typed', async () => {
  await assert.rejects(Sandbox.create('base'), (e) => e instanceof InvalidArgumentError && e.code === 'INVALID_ARGUMENT')
  await assert.rejects(Sandbox.create('base', { project: 'no-such-project' }), NotFoundError)
  await assert.rejects(Sandbox.create('base', { project: 'my-project', timeoutMs: 0 }), InvalidArgumentError)
  await assert.rejects(Sandbox.create('base', { project: 'my-project', lizardToken: 'lz_not_a_key' }), InvalidArgumentError)
  await assert.rejects(new Lizard({ apiKey: 'lz_not_a_key' }).whoami(), (e) => e instanceof AuthenticationError && e.code === 'UNAUTHENTICATED')
  await assert.rejects(new Lizard().create('base'), /no project/)
})

test('pause, and connect resumes', async () => {
  const sb = await new Lizard({ project: 'my-project' }).create('base')
  await sb.process.exec('echo kept > /tmp/kept; sleep 600 >/dev/null 2>&1 &')
  await sb.pause()
  assert.equal(sb.state, 'paused')
  const back = await Sandbox.connect(sb.sandboxId)
  assert.equal(back.state, 'running')
  assert.equal((await back.process.exec('cat /tmp/kept')).stdout, 'kept\n')
  assert.equal((await back.process.exec('pgrep -x sleep')).exitCode, 0)
  await back.pause()
  await back.resume()
  assert.equal(back.state, 'running')
  // A fork has what the sandbox had; from then on each has its own writes.
  const [copy] = await back.fork()
  assert.notEqual(copy.sandboxId, back.sandboxId)
  assert.equal((await copy.process.exec('cat /tmp/kept')).stdout, 'kept\n')
  await copy.fs.write('/tmp/kept', 'changed\n')
  assert.equal(await back.fs.read('/tmp/kept'), 'kept\n')
  await copy.kill()
  await back.kill()
})

test('the Lizard client examples of the reference', async () => {
  // --- reference: "Create a client pinned to a project" ---------------------------------
  const lizard = new Lizard({ project: 'my-project' })
  const sandbox = await lizard.create('base')
  assert.equal(sandbox.info.projectId, project.id)
  await sandbox.kill()
  {
    const sandbox = await lizard.create('code-interpreter-v1', { timeoutMs: 10 * 60 * 1000 })
    const left = Date.parse(sandbox.info.endAt) - Date.now()
    // More than the 5-minute default gives (the server counts from the request, boot included).
    assert.ok(left > 5 * 60_000 && left <= 10 * 60_000, String(left))
    assert.equal((await sandbox.process.exec('python3 -c "print(6*7)"')).stdout, '42\n')
    await sandbox.kill()
  }
  // --- reference: Sandbox.create ---------------------------------------------------------
  {
    const sandbox = await Sandbox.create('base', { project: 'my-project' })
    assert.equal(sandbox.info.projectId, project.id)
    await sandbox.kill()
  }
  {
    const sandbox = await Sandbox.create('code-interpreter-v1', { project: 'my-project', timeoutMs: 10 * 60 * 1000 })
    assert.equal(sandbox.template, 'code-interpreter-v1')
    await sandbox.kill()
  }
})

test('tenancy namespaces', async () => {
  const lz = new Lizard()
  const me = await lz.whoami()
  assert.equal(me.scoped, false)
  assert.ok(me.email)
  const regions = await lz.regions.list()
  assert.deepEqual(regions.map((r) => r.id), ['local'])
  const name = `ns-${randomUUID().slice(0, 6)}`
  const ws = await lz.workspaces.create({ name })
  assert.equal((await lz.workspaces.find(name)).id, ws.id)
  const prj = await lz.projects.create({ workspaceId: ws.id, name: 'alpha' })
  assert.equal((await lz.projects.update(prj.id, { name: 'beta' })).name, 'beta')
  assert.equal((await lz.projects.get(prj.id)).slug, 'alpha')
  assert.deepEqual((await lz.projects.list({ workspaceId: ws.id })).map((p) => p.id), [prj.id])
  await assert.rejects(lz.workspaces.delete(ws.id), (e) => e instanceof ConflictError && e.status === 409)
  const key = await lz.apiKeys.create({ name, projects: [prj.id] })
  assert.ok(key.key.startsWith(key.prefix))
  assert.equal((await lz.apiKeys.list()).find((k) => k.id === key.id).key, undefined)
  assert.deepEqual((await new Lizard({ apiKey: key.key }).whoami()).projects, [prj.id])
  await lz.apiKeys.delete(key.id)
  await assert.rejects(new Lizard({ apiKey: key.key }).whoami(), AuthenticationError)
  await lz.projects.delete(prj.id)
  await lz.workspaces.delete(ws.id)
  await assert.rejects(lz.workspaces.find(ws.id), NotFoundError)
})

test('billing and metrics', async () => {
  const lz = new Lizard({ project: 'my-project' })
  const balance = await lz.billing.balance()
  assert.equal(typeof balance.balanceNanos, 'number')
  assert.equal(balance.currency, 'USD')
  const page = await lz.billing.transactions({ limit: 5, includeUsage: true })
  assert.ok(page.items.length >= 1 && page.items.length <= 5)
  assert.equal((await lz.billing.summary({ granularity: 'day', periods: 1 })).granularity, 'day')
  assert.ok(Array.isArray((await lz.billing.live()).sandboxes))
  assert.ok(await lz.metrics.get({ projectId: await lz.projectId() }))
})

// Every TypeScript/JavaScript example of the SDK reference, as written, against a real server.
//
// Lines of the reference are kept verbatim; checks are inserted between them. The examples
// that name 'codex' run on the real 'codex' template.

import { test, before } from 'node:test'
import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { Lizard, Sandbox, NotFoundError, ConflictError, PermissionDeniedError } from '../src/index.js'
import { server, myProject, waitForHttp } from './helpers.js'

let srv
let project

before(async () => {
  srv = await server()
  project = await myProject()
})

test('quickstart: a node web server reached through its sandbox URL', async () => {
  // --- reference: quickstart -------------------------------------------------------------
  // A client is pinned to one project — sandboxes are billed per project, so a
  // project is required. It can be the project's ID, slug, or name.
  // apiKey defaults to the LIZARD_API_KEY env var.
  const lizard = new Lizard({ project: 'my-project' })
  // Boot a microVM from the 'base' template (Debian + Node.js 26)
  const sandbox = await lizard.create('base')
  // Write a file directly into the microVM filesystem
  await sandbox.fs.write('/app/server.js', `
const http = require('http')
http.createServer((_, res) => res.end('hello from Lizard')).listen(3000)
`)
  // Execute a process inside the microVM
  await sandbox.process.exec('node /app/server.js &')
  // Get a public HTTPS URL for port 3000 inside the sandbox
  const url = sandbox.getHost(3000)
  console.log(`Live at https://${url}`)
  // --- checks: a real HTTP request through the sandbox URL --------------------------------
  assert.equal(sandbox.info.projectId, project.id)
  assert.equal(url, `${sandbox.sandboxId}-3000.sandbox.local.lizard.localhost`)
  const res = await waitForHttp(srv.proxy, url, 'hello from Lizard')
  assert.equal(res.body, 'hello from Lizard')
  const id = sandbox.sandboxId
  // --- reference ----------------------------------------------------------------------------
  // Tear down the microVM when done
  await sandbox.kill()
  // --- checks: gone for good --------------------------------------------------------------
  await assert.rejects(Sandbox.connect(id), (e) => e instanceof NotFoundError && e.code === 'NOT_FOUND' && e.status === 404)
  assert.ok(!(await lizard.list()).some((s) => s.sandboxId === id))
})

test('getHost: npx serve on port 3000', async () => {
  const lizard = new Lizard({ project: 'my-project' })
  const sandbox = await lizard.create('base')
  try {
    // `npx -y serve` downloads `serve` through npm and its configured registry (the guest
    // network): asked first through npm itself, so that a failure names its cause.
    const online = await sandbox.process.exec('npm view serve version', { timeoutMs: 120_000 })
    assert.equal(online.exitCode, 0, `npm in the sandbox cannot reach its registry: ${online.stderr.trim()}`)
    // --- reference: getHost ----------------------------------------------------------------
    await sandbox.process.exec('npx -y serve -p 3000 &')
    const url = sandbox.getHost(3000)
    // https://{sandboxId}-3000.sandbox.{region}.onlizard.com
    // --- checks ------------------------------------------------------------------------------
    assert.match(url, new RegExp(`^${sandbox.sandboxId}-3000\\.sandbox\\.local\\.`))
    const res = await waitForHttp(srv.proxy, url, '<', 300_000)
    assert.equal(res.status, 200)
  } finally {
    await sandbox.kill()
  }
})

test('volumes: the note survives the first sandbox', async () => {
  const lizard = new Lizard({ project: 'my-project' })
  // A volume left by an earlier run would make the check below vacuous.
  await lizard.volumes.delete('agent-scratch').catch((e) => assert.ok(e instanceof NotFoundError, String(e)))
  // --- reference: volumes ------------------------------------------------------------------
  const vol = await lizard.volumes.getOrCreate('agent-scratch', { sizeGb: 10 })
  const first = await lizard.create('codex', { volumeName: 'agent-scratch' })
  // --- reference ------------------------------------------------------------------------------
  await first.process.exec('pip install numpy pandas && echo "notes" > /workspace/notes.txt')
  // --- check: pip reached its index through the guest network and installed both ------------
  const imported = await first.process.exec('python3 -c "import numpy, pandas"')
  assert.equal(imported.exitCode, 0, `pip install in the sandbox did not install numpy and pandas: ${imported.stderr.trim()}`)
  await first.kill() // sandbox gone, /workspace survives
  const second = await lizard.create('codex', { volumeName: 'agent-scratch' })
  console.log(await second.fs.read('/workspace/notes.txt')) // "notes"
  // --- checks --------------------------------------------------------------------------------
  assert.equal(vol.name, 'agent-scratch')
  assert.equal(vol.projectId, project.id)
  assert.equal(await second.fs.read('/workspace/notes.txt'), 'notes\n')
  assert.equal((await lizard.volumes.getOrCreate('agent-scratch')).id, vol.id)
  await assert.rejects(lizard.volumes.create('agent-scratch'), (e) => e instanceof ConflictError && e.code === 'CONFLICT')
  await second.kill()
  await lizard.volumes.delete('agent-scratch')
  await assert.rejects(lizard.volumes.get('agent-scratch'), NotFoundError)
})

test('a workspace and a scoped key per user; the CLI in the sandbox runs as that user', async () => {
  const userId = randomUUID().slice(0, 8)
  const db = { users: { saved: {}, async update(id, fields) { this.saved[id] = fields } } }
  // --- reference: workspaces and scoped keys -----------------------------------------------
  const lizard = new Lizard({ apiKey: process.env.LIZARD_API_KEY })
  const ws = await lizard.workspaces.create({ name: `user-${userId}` })
  const prj = await lizard.projects.create({ workspaceId: ws.id, name: 'default' })
  const key = await lizard.apiKeys.create({ name: `user-${userId}`, workspaces: [ws.id] })
  // key.key is returned exactly once. Store it now.
  await db.users.update(userId, { lizardKey: key.key })
  const sandbox = await Sandbox.create('codex', {
    projectId: prj.id,
    lizardToken: key.key, // scoped — bounded if it leaks
  })
  const listed = await sandbox.process.exec('lizard volume list') // sees only this workspace
  // --- checks --------------------------------------------------------------------------------
  assert.equal(db.users.saved[userId].lizardKey, key.key)
  assert.equal(listed.exitCode, 0, JSON.stringify(listed))
  const who = await sandbox.process.exec('lizard whoami --json')
  assert.equal(who.exitCode, 0, JSON.stringify(who))
  const me = JSON.parse(who.stdout)
  assert.equal(me.keyId, key.id)
  assert.equal(me.scoped, true)
  assert.deepEqual(me.workspaces, [ws.id])
  const scoped = new Lizard({ apiKey: key.key })
  assert.deepEqual((await scoped.workspaces.list()).map((w) => w.id), [ws.id])
  await assert.rejects(scoped.apiKeys.create({ name: 'wider' }), (e) => e instanceof PermissionDeniedError && e.code === 'FORBIDDEN')
  await assert.rejects(scoped.platform.get('/v1/account'), (e) => e instanceof PermissionDeniedError && e.code === 'ACCOUNT_SCOPE_REQUIRED')
  await assert.rejects(scoped.billing.balance(), (e) => e instanceof PermissionDeniedError && e.code === 'ACCOUNT_SCOPE_REQUIRED')
  const whoami = await scoped.whoami()
  assert.equal(whoami.email, undefined)
  await sandbox.kill()
  await lizard.workspaces.delete(ws.id, { force: true })
  await assert.rejects(lizard.workspaces.find(ws.id), NotFoundError)
})

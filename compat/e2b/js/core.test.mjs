// E2B's own npm package (`e2b`, unchanged) against a real `lizard server`:
// scripts/test-sdk.sh installs the version asked for and sets the same variables as for
// the Python suite. Each run makes its own workspace, project and project-scoped key.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import { forgetE2bEnv, scopedE2bEnv } from './setup.mjs'

let workspace
let e2b

before(async () => {
  workspace = await scopedE2bEnv('e2b-js')
  e2b = await import('e2b')
})

after(() => forgetE2bEnv(workspace))

test('create, run with live output, files, kill', async () => {
  const sbx = await e2b.Sandbox.create({ metadata: { lang: 'js' } })
  try {
    const lines = []
    const started = Date.now()
    const r = await sbx.commands.run('echo one; sleep 2; echo two', {
      onStdout: (line) => lines.push([Date.now() - started, line]),
    })
    assert.equal(r.stdout, 'one\ntwo\n')
    assert.deepEqual(lines.map(([, l]) => l.trim()), ['one', 'two'])
    assert.ok(lines[1][0] - lines[0][0] > 1500, JSON.stringify(lines))
    await assert.rejects(sbx.commands.run('exit 7'), (e) => e.exitCode === 7)
    await sbx.files.write('/tmp/js/a.txt', 'from node')
    assert.equal(await sbx.files.read('/tmp/js/a.txt'), 'from node')
    const blob = randomBytes(4 << 20)
    await sbx.files.write('/tmp/js/blob', blob.buffer.slice(blob.byteOffset, blob.byteOffset + blob.length))
    const sum = (await sbx.commands.run('sha256sum < /tmp/js/blob')).stdout.split(' ')[0]
    assert.equal(sum, createHash('sha256').update(blob).digest('hex'))
    const names = (await sbx.files.list('/tmp/js')).map((e) => e.name).sort()
    assert.deepEqual(names, ['a.txt', 'blob'])
    const info = await sbx.getInfo()
    assert.equal(info.metadata.lang, 'js')
    const bg = await sbx.commands.run('sleep 300', { background: true })
    assert.ok((await sbx.commands.list()).some((p) => p.pid === bg.pid))
    // `true` from newer SDKs (older ones answer nothing): either way the process is gone.
    assert.notEqual(await sbx.commands.kill(bg.pid), false)
    await new Promise((r) => setTimeout(r, 500))
    assert.ok(!(await sbx.commands.list()).some((p) => p.pid === bg.pid))
  } finally {
    assert.notEqual(await sbx.kill(), false)
  }
  // Killed: the body's code (404) is what the JS SDK reads.
  assert.equal(await e2b.Sandbox.kill(sbx.sandboxId), false)
})

test('pause, then connect resumes', async () => {
  const sbx = await e2b.Sandbox.create()
  try {
    await sbx.files.write('kept.txt', 'kept')
    const pause = sbx.pause ? () => sbx.pause() : () => sbx.betaPause()
    await pause()
    assert.equal((await sbx.getInfo()).state, 'paused')
    const again = await e2b.Sandbox.connect(sbx.sandboxId)
    assert.equal((await again.getInfo()).state, 'running')
    assert.equal(await again.files.read('kept.txt'), 'kept')
  } finally {
    await sbx.kill()
  }
})

test('getHost names a port the sandbox URL routes; a private sandbox needs its traffic token', async () => {
  const sbx = await e2b.Sandbox.create()
  const locked = await e2b.Sandbox.create({ network: { allowPublicTraffic: false } })
  try {
    for (const s of [sbx, locked]) {
      await s.commands.run('mkdir -p srv && echo served > srv/index.txt')
      await s.commands.run('cd srv && python3 -m http.server 8000', { background: true })
    }
    // Node's fetch will not send another Host: the request is written by hand.
    const { request } = await import('node:http')
    const [hostname, port] = process.env.LIZARD_SDK_TEST_PROXY.split(':')
    const get = (host, headers = {}) =>
      new Promise((resolve, reject) => {
        const req = request({ hostname, port, path: '/index.txt', headers: { Host: host, ...headers } }, (res) => {
          let body = ''
          res.on('data', (c) => (body += c))
          res.on('end', () => resolve([res.statusCode, body]))
        })
        req.on('error', reject)
        req.end()
      })
    // With a TLS listener the domain carries its port: `https://${getHost(port)}` reaches it.
    const [tlsHostname, tlsPort] = process.env.LIZARD_SDK_TEST_TLS_PROXY.split(':')
    const host = sbx.getHost(8000)
    assert.equal(host, `8000-${sbx.sandboxId}.sandbox.local.lizard.localhost:${tlsPort}`)
    let answer
    for (let i = 0; i < 120; i++) {
      answer = await get(host)
      if (answer[0] === 200) break
      await new Promise((r) => setTimeout(r, 500))
    }
    assert.deepEqual(answer, [200, 'served\n'])
    // Over HTTPS, the certificate checked for the name against the local CA alone.
    const https = await import('node:https')
    const { readFileSync } = await import('node:fs')
    const secure = await new Promise((resolve, reject) => {
      const req = https.request(
        {
          hostname: tlsHostname,
          port: tlsPort,
          path: '/index.txt',
          servername: host.split(':')[0],
          ca: readFileSync(process.env.LIZARD_SDK_TEST_CA),
          headers: { Host: host },
        },
        (res) => {
          let body = ''
          res.on('data', (c) => (body += c))
          res.on('end', () => resolve([res.statusCode, body]))
        },
      )
      req.on('error', reject)
      req.end()
    })
    assert.deepEqual(secure, [200, 'served\n'])
    assert.equal((await get(locked.getHost(8000)))[0], 403)
    assert.ok(locked.trafficAccessToken, 'no traffic token in the create answer')
    for (let i = 0; i < 120; i++) {
      answer = await get(locked.getHost(8000), { 'E2B-Traffic-Access-Token': locked.trafficAccessToken })
      if (answer[0] === 200) break
      await new Promise((r) => setTimeout(r, 500))
    }
    assert.deepEqual(answer, [200, 'served\n'])
  } finally {
    await sbx.kill()
    await locked.kill()
  }
})

test('a snapshot starts sandboxes with its processes and files, and is deleted', async () => {
  const src = await e2b.Sandbox.create()
  const made = []
  try {
    await src.commands.run('echo original > ~/f; (nohup sleep 4321 >/dev/null 2>&1 &)')
    // SDKs before snapshots existed: the route as newer ones call it.
    const snap = src.createSnapshot
      ? await src.createSnapshot()
      : await (await fetch(`${process.env.E2B_API_URL}/sandboxes/${src.sandboxId}/snapshots`, {
          method: 'POST',
          headers: { 'X-API-KEY': process.env.E2B_API_KEY, 'Content-Type': 'application/json' },
          body: '{}',
        })).json().then((s) => ({ snapshotId: s.snapshotID, names: s.names }))
    assert.match(snap.snapshotId, /^snp_/)
    await src.commands.run('echo changed > ~/f')
    await src.kill()
    const copy = await e2b.Sandbox.create(snap.snapshotId)
    made.push(copy)
    assert.equal((await copy.commands.run('cat ~/f')).stdout, 'original\n')
    assert.equal((await copy.commands.run("pgrep -f 'sleep [4]321'")).exitCode, 0)
    if (e2b.Sandbox.listSnapshots) {
      const page = await e2b.Sandbox.listSnapshots().nextItems()
      assert.deepEqual(page.map((s) => s.snapshotId), [snap.snapshotId])
    }
    if (e2b.Sandbox.deleteSnapshot) {
      assert.equal(await e2b.Sandbox.deleteSnapshot(snap.snapshotId), true)
      assert.equal(await e2b.Sandbox.deleteSnapshot(snap.snapshotId), false)
    } else {
      const gone = await fetch(`${process.env.E2B_API_URL}/templates/${snap.snapshotId}`, {
        method: 'DELETE',
        headers: { 'X-API-KEY': process.env.E2B_API_KEY },
      })
      assert.equal(gone.status, 204)
    }
    await assert.rejects(e2b.Sandbox.create(snap.snapshotId))
    // What was started from it runs on.
    assert.equal((await copy.commands.run('cat ~/f')).stdout, 'original\n')
  } finally {
    for (const s of [src, ...made]) await s.kill().catch(() => {})
  }
})

// `templates.push` and `templates.events` against a small local HTTP server (no Lizard
// server): the calls a push makes and in which order, what is retried, the event stream, and
// the error of a failed build.

import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import fs from 'node:fs'
import http from 'node:http'
import os from 'node:os'
import path from 'node:path'
import { Lizard, BuildError, APIConnectionError } from '../src/index.js'

const sha = (data) => createHash('sha256').update(data).digest('hex')
const ndjson = (...events) => events.map((e) => `${JSON.stringify(e)}\n`).join('')

const BUILD = { buildId: 'b1', template: 'tiny', status: 'queued', steps: [], createdAt: '2026-01-01T00:00:00Z' }
const EVENTS = [
  { type: 'phase', message: 'booting the build VM' },
  { type: 'step', index: 1, total: 1, description: 'run true', cached: false },
  { type: 'output', stream: 'stdout', data: 'hi\n' },
  { type: 'stepDone', index: 1, durationMs: 7 },
  { type: 'done', status: 'ready' },
]

const dirs = []
function pushed() {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), 'lizard-push-'))
  dirs.push(d)
  fs.writeFileSync(path.join(d, 'lizard.template.toml'), 'name = "tiny"\nfrom = "base"\n')
  fs.writeFileSync(path.join(d, 'a.txt'), 'a')
  fs.writeFileSync(path.join(d, 'b.txt'), 'b')
  return d
}
after(() => {
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true })
})

/**
 * A server answering with `answer(req, body, n)` → [status, body, contentType?] or
 * 'reset' (drop the connection); records every request.
 */
async function withServer(answer, fn) {
  const seen = []
  const sockets = new Set()
  const srv = http.createServer((req, res) => {
    const chunks = []
    req.on('data', (c) => chunks.push(c))
    req.on('end', () => {
      const url = new URL(req.url, 'http://x')
      const body = Buffer.concat(chunks)
      seen.push({ method: req.method, path: url.pathname, query: Object.fromEntries(url.searchParams), body })
      const out = answer({ method: req.method, path: url.pathname }, body, seen.length)
      if (out === 'reset') return req.socket.destroy()
      const [status, data, type = 'application/json'] = out
      res.writeHead(status, { 'Content-Type': type })
      res.end(data === undefined ? '' : typeof data === 'string' ? data : JSON.stringify(data))
    })
  })
  srv.on('connection', (s) => sockets.add(s))
  await new Promise((r) => srv.listen(0, '127.0.0.1', r))
  try {
    return await fn(new Lizard({ apiUrl: `http://127.0.0.1:${srv.address().port}`, apiKey: 'lz_test' }), seen)
  } finally {
    for (const s of sockets) s.destroy()
    await new Promise((r) => srv.close(r))
  }
}

test('push uploads only the missing blobs (a PUT is retried), then follows the build', async () => {
  const d = pushed()
  let puts = 0
  const answer = (req, body) => {
    if (req.path === '/v1/templates/blobs/missing') return [200, { missing: [sha('b')] }]
    if (req.path.startsWith('/v1/templates/blobs/')) return ++puts === 1 ? [502, { code: 'BAD_GATEWAY', message: 'busy' }] : [204]
    if (req.path === '/v1/templates') return [202, BUILD]
    if (req.path === '/v1/templates/tiny/builds/b1/events') return [200, ndjson(...EVENTS), 'application/x-ndjson']
    if (req.path === '/v1/templates/tiny/builds/b1') {
      return [200, { ...BUILD, status: 'ready', steps: [{ index: 1, description: 'run true', cached: false, status: 'ready', durationMs: 7 }] }]
    }
    return [404, { code: 'NOT_FOUND', message: req.path }]
  }
  await withServer(answer, async (lz, seen) => {
    const got = []
    const info = await lz.templates.push(d, { onEvent: (e) => got.push(e), workspace: 'ws' })
    assert.equal(info.status, 'ready')
    assert.equal(info.steps[0].durationMs, 7)
    assert.deepEqual(got, EVENTS)
    assert.deepEqual(
      seen.map((r) => `${r.method} ${r.path}`),
      [
        'POST /v1/templates/blobs/missing',
        `PUT /v1/templates/blobs/${sha('b')}`,
        `PUT /v1/templates/blobs/${sha('b')}`,
        'POST /v1/templates',
        'GET /v1/templates/tiny/builds/b1/events',
        'GET /v1/templates/tiny/builds/b1',
      ],
    )
    assert.ok(seen.filter((r) => r.path !== '/v1/templates').every((r) => r.query.workspace === 'ws'))
    assert.equal(seen[1].body.toString(), 'b')
    const toml = fs.readFileSync(path.join(d, 'lizard.template.toml'))
    assert.deepEqual(JSON.parse(seen[0].body), { sha256: [sha('a'), sha('b'), sha(toml)].sort() })
    const push = JSON.parse(seen[3].body)
    assert.equal(push.format, 'toml')
    assert.equal(push.workspace, 'ws')
    assert.equal(push.name, undefined)
    assert.equal(push.recipe, 'name = "tiny"\nfrom = "base"\n')
    assert.deepEqual(push.files.map((f) => f.path), ['a.txt', 'b.txt', 'lizard.template.toml'])
  })
})

test('the push itself is not retried', async () => {
  const d = pushed()
  await withServer(
    (req) => (req.path === '/v1/templates/blobs/missing' ? [200, { missing: [] }] : 'reset'),
    async (lz, seen) => {
      await assert.rejects(lz.templates.push(d), APIConnectionError)
      assert.equal(seen.filter((r) => r.path === '/v1/templates').length, 1)
    },
  )
})

test('a failed build rejects with its code, step and output tail', async () => {
  const d = pushed()
  const failure = { code: 'STEP_FAILED', message: 'step 2 (run false) exited 1', step: 2, outputTail: 'boom\n' }
  const answer = (req) => {
    if (req.path === '/v1/templates/blobs/missing') return [200, { missing: [] }]
    if (req.path === '/v1/templates') return [202, BUILD]
    if (req.path.endsWith('/events')) return [200, ndjson({ type: 'done', status: 'failed', error: failure })]
    return [200, { ...BUILD, status: 'failed', error: failure }]
  }
  await withServer(answer, async (lz, seen) => {
    await assert.rejects(
      lz.templates.push(d, { name: 'other' }),
      (e) => e instanceof BuildError && e.code === 'STEP_FAILED' && e.step === 2 && e.outputTail === 'boom\n' && e.build.status === 'failed' && e.message.includes('boom'),
    )
    assert.equal(JSON.parse(seen.find((r) => r.path === '/v1/templates').body).name, 'other')
  })
})

test('a broken event stream falls back to the build status', async () => {
  const d = pushed()
  let gets = 0
  const answer = (req) => {
    if (req.path === '/v1/templates/blobs/missing') return [200, { missing: [] }]
    if (req.path === '/v1/templates') return [202, BUILD]
    if (req.path.endsWith('/events')) return [200, ndjson(EVENTS[0])] // cut before `done`
    return [200, { ...BUILD, status: ++gets < 2 ? 'running' : 'ready' }]
  }
  await withServer(answer, async (lz) => {
    assert.equal((await lz.templates.push(d)).status, 'ready')
    assert.equal(gets, 2)
  })
})

test('events end after done; a cut stream is an error', async () => {
  await withServer(
    () => [200, `${ndjson(...EVENTS)}{"type":"phase","message":"never read"}\n`],
    async (lz) => {
      const got = []
      for await (const e of lz.templates.events('tiny', 'b1')) got.push(e.type)
      assert.deepEqual(got, ['phase', 'step', 'output', 'stepDone', 'done'])
    },
  )
  // The last line needs no newline.
  await withServer(
    () => [200, ndjson(...EVENTS).trimEnd()],
    async (lz) => {
      const got = []
      for await (const e of lz.templates.events('tiny', 'b1')) got.push(e.type)
      assert.equal(got.at(-1), 'done')
    },
  )
  await withServer(
    () => [200, ndjson(...EVENTS.slice(0, 2))],
    async (lz) => {
      const drain = async () => {
        for await (const _ of lz.templates.events('tiny', 'b1'));
      }
      await assert.rejects(drain(), (e) => e instanceof APIConnectionError && /ended before/.test(e.message))
    },
  )
})

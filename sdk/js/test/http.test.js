// The HTTP layer against small local HTTP servers (no Lizard server): error mapping, which
// calls are retried, timeouts, connection reuse.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import net from 'node:net'
import {
  HttpClient,
  NotFoundError,
  ConflictError,
  PaymentRequiredError,
  PermissionDeniedError,
  RateLimitError,
  BadGatewayError,
  APIConnectionError,
  APITimeoutError,
} from '../src/index.js'
import { IDEMPOTENCY_HEADER, withIdempotencyKey } from '../src/http.js'

/** A server answering each request with `answer(req, n)` → [status, body]; records requests. */
async function withServer(answer, fn) {
  const seen = []
  const sockets = new Set()
  const srv = http.createServer((req, res) => {
    const chunks = []
    req.on('data', (c) => chunks.push(c))
    req.on('end', () => {
      seen.push({ method: req.method, url: req.url, headers: req.headers, body: Buffer.concat(chunks).toString(), port: req.socket.remotePort })
      const [status, body, headers] = answer(req, seen.length)
      res.writeHead(status, { 'Content-Type': 'application/json', ...(headers ?? {}) })
      res.end(body === undefined ? '' : JSON.stringify(body))
    })
  })
  srv.on('connection', (s) => sockets.add(s))
  await new Promise((r) => srv.listen(0, '127.0.0.1', r))
  try {
    return await fn(`http://127.0.0.1:${srv.address().port}`, seen)
  } finally {
    for (const s of sockets) s.destroy()
    await new Promise((r) => srv.close(r))
  }
}

test('error bodies become typed errors carrying the code', async () => {
  for (const [status, code, Cls] of [
    [404, 'NOT_FOUND', NotFoundError],
    [409, 'CONFLICT', ConflictError],
    [402, 'PAYMENT_REQUIRED', PaymentRequiredError],
    [403, 'ACCOUNT_SCOPE_REQUIRED', PermissionDeniedError],
  ]) {
    await withServer(() => [status, { code, message: 'why' }], async (url) => {
      const c = new HttpClient({ apiUrl: url, apiKey: 'lz_test' })
      await assert.rejects(c.get('/v1/x'), (e) => e instanceof Cls && e.code === code && e.status === status && e.serverMessage === 'why')
    })
  }
})

test('the key header, JSON body and query', async () => {
  await withServer(() => [200, { ok: true }], async (url, seen) => {
    const c = new HttpClient({ apiUrl: url, apiKey: 'lz_test' })
    assert.deepEqual(await c.post('/v1/y', { a: 1 }, { query: { force: true, skip: undefined } }), { ok: true })
    assert.equal(seen[0].headers['x-api-key'], 'lz_test')
    assert.equal(seen[0].url, '/v1/y?force=true')
    assert.equal(seen[0].body, '{"a":1}')
  })
})

test('429 is retried for any call, 503 only for calls safe to repeat', async () => {
  await withServer((req, n) => (n < 3 ? [n === 1 ? 429 : 503, { code: 'RATE_LIMITED', message: 'm' }] : [201, { id: 'x' }]), async (url, seen) => {
    const c = new HttpClient({ apiUrl: url })
    // A create carries an idempotency key: safe to retry on 503.
    assert.deepEqual(await c.post('/v1/sandboxes', { template: 'base' }), { id: 'x' })
    assert.deepEqual(seen.map((s) => s.method), ['POST', 'POST', 'POST'])
  })
  await withServer(() => [429, { code: 'RATE_LIMITED', message: 'm' }], async (url, seen) => {
    const c = new HttpClient({ apiUrl: url, maxRetries: 2 })
    await assert.rejects(c.get('/v1/x'), RateLimitError)
    assert.equal(seen.length, 3)
  })
  // A POST without a key (a pause) is not retried on 503: it may have been done.
  await withServer(() => [503, { code: 'UNAVAILABLE', message: 'm' }], async (url, seen) => {
    const c = new HttpClient({ apiUrl: url })
    await assert.rejects(c.post('/v1/sandboxes/x/pause'))
    assert.equal(seen.length, 1)
  })
})

test('creates and execs carry one idempotency key across their retries', async () => {
  await withServer((req, n) => (n === 1 ? [503, { code: 'UNAVAILABLE', message: 'm' }] : [200, { exitCode: 0 }]), async (url, seen) => {
    const c = new HttpClient({ apiUrl: url })
    assert.deepEqual(await c.post('/v1/sandboxes/s/exec', { cmd: 'echo run >> /tmp/runs' }), { exitCode: 0 })
    const keys = seen.map((s) => s.headers['idempotency-key'])
    assert.equal(keys.length, 2)
    assert.ok(keys[0] && keys[0] === keys[1], String(keys))
  })
  for (const path of ['/v1/sandboxes', '/v1/sandboxes/s/fork', '/v1/volumes']) {
    assert.ok(withIdempotencyKey('POST', path)[IDEMPOTENCY_HEADER], path)
  }
  assert.deepEqual(withIdempotencyKey('POST', '/v1/sandboxes/s/pause'), {})
  assert.deepEqual(withIdempotencyKey('POST', '/v1/sandboxes', { 'idempotency-key': 'mine' }), { 'idempotency-key': 'mine' })
})

test('a replayed failure is final; a keyed call in progress is waited for', async () => {
  await withServer(() => [503, { code: 'UNAVAILABLE', message: 'm' }, { 'Idempotency-Replayed': 'true' }], async (url, seen) => {
    const c = new HttpClient({ apiUrl: url })
    await assert.rejects(c.post('/v1/sandboxes/s/exec', { cmd: 'x' }))
    assert.equal(seen.length, 1)
  })
  await withServer(
    (req, n) => (n === 1 ? [409, { code: 'CONFLICT', message: 'still served' }, { 'Retry-After': '0' }] : [201, { sandboxId: 's' }]),
    async (url, seen) => {
      const c = new HttpClient({ apiUrl: url })
      assert.deepEqual(await c.post('/v1/sandboxes', { template: 'base' }), { sandboxId: 's' })
      assert.equal(seen.length, 2)
    },
  )
})

test('calls not safe to repeat are not retried on 502; idempotent ones are', async () => {
  await withServer(() => [502, { code: 'BOOT_FAILED', message: 'm' }], async (url, seen) => {
    const c = new HttpClient({ apiUrl: url })
    await assert.rejects(c.post('/v1/sandboxes/x/resume'), BadGatewayError)
    assert.equal(seen.length, 1)
    await assert.rejects(c.get('/v1/sandboxes'), BadGatewayError)
    assert.equal(seen.length, 1 + 4)
  })
})

test('connection failures: a POST not safe to repeat fails at once, DELETE is retried', async () => {
  // A port with nothing listening: bind, note it, close.
  const port = await new Promise((r) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const p = s.address().port
      s.close(() => r(p))
    })
  })
  const c = new HttpClient({ apiUrl: `http://127.0.0.1:${port}`, maxRetries: 2 })
  let t = Date.now()
  await assert.rejects(c.post('/v1/sandboxes/x/pause'), APIConnectionError)
  const once = Date.now() - t
  t = Date.now()
  await assert.rejects(c.delete('/v1/sandboxes/x'), APIConnectionError)
  assert.ok(Date.now() - t >= 200 && once < 200, `backoff: ${once} ms then ${Date.now() - t} ms`)
})

test('a silent server: the call ends after its timeout', async () => {
  const sockets = []
  const srv = net.createServer((s) => sockets.push(s))
  await new Promise((r) => srv.listen(0, '127.0.0.1', r))
  try {
    const c = new HttpClient({ apiUrl: `http://127.0.0.1:${srv.address().port}`, timeoutMs: 500, maxRetries: 0 })
    const t = Date.now()
    await assert.rejects(c.get('/v1/x'), APITimeoutError)
    const took = Date.now() - t
    assert.ok(took >= 400 && took < 5000, String(took))
  } finally {
    for (const s of sockets) s.destroy()
    await new Promise((r) => srv.close(r))
  }
})

test('connections are reused', async () => {
  await withServer(() => [200, []], async (url, seen) => {
    const c = new HttpClient({ apiUrl: url })
    for (let i = 0; i < 10; i++) assert.deepEqual(await c.get('/v1/workspaces'), [])
    // undici's pool may alternate between two kept-alive connections; never one per call.
    assert.ok(new Set(seen.map((s) => s.port)).size <= 2, JSON.stringify(seen.map((s) => s.port)))
  })
})

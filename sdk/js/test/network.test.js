// The network options of a create (allowInternetAccess, allowOut, denyOut, publicUrls)
// against a real server: each reaches it (a bad CIDR in either list is refused), and a
// sandbox with private URLs answers only to its access token.

import { test, before } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import { Sandbox, InvalidArgumentError } from '../src/index.js'
import { server, myProject } from './helpers.js'

let srv

before(async () => {
  srv = await server()
  await myProject()
})

/** One GET through the sandbox-URL proxy with `headers` (Host included). */
function get(path, headers) {
  const [hostname, port] = srv.proxy.split(':')
  return new Promise((resolve, reject) => {
    const req = http.get({ hostname, port: Number(port), path, headers, timeout: 10_000 }, (res) => {
      const chunks = []
      res.on('data', (c) => chunks.push(c))
      res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(chunks).toString() }))
    })
    req.on('timeout', () => req.destroy(new Error('timeout')))
    req.on('error', reject)
  })
}

for (const field of ['allowOut', 'denyOut']) {
  test(`${field} reaches the server`, async () => {
    await assert.rejects(Sandbox.create('base', { project: 'my-project', [field]: ['not-a-cidr'] }), InvalidArgumentError)
  })
}

test('a sandbox without internet and with private URLs answers only to its token', async () => {
  const sb = await Sandbox.create('base', {
    project: 'my-project',
    allowInternetAccess: false,
    allowOut: ['198.51.100.7', 'registry.example', '*.cdn.example'],
    denyOut: ['203.0.113.0/24'],
    publicUrls: false,
  })
  try {
    const token = sb.accessToken
    assert.ok(token?.startsWith('lzat_'), `token ${token}`)
    // Shown once: a later read of the sandbox does not carry it.
    assert.equal((await Sandbox.connect(sb.sandboxId)).accessToken, undefined)
    await sb.process.exec('nohup python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 &')
    const host = sb.getHost(8000)
    const deadline = Date.now() + 60_000
    let r
    for (;;) {
      r = await get('/', { Host: host, 'X-Lizard-Access-Token': token })
      if (r.status === 200 || Date.now() > deadline) break
      await new Promise((res) => setTimeout(res, 250))
    }
    assert.equal(r.status, 200, r.body)
    assert.ok(r.body.includes('Directory listing'))
    assert.equal((await get(`/?lizardAccessToken=${token}`, { Host: host })).status, 200)
    assert.equal((await get('/', { Host: host })).status, 403)
    assert.equal((await get('/', { Host: host, 'X-Lizard-Access-Token': 'lzat_wrong' })).status, 403)
    // A signed URL stands in for the token: its host, path and proof, until it expires.
    const url = new URL(await sb.getSignedUrl(8000, { expiresInSeconds: 2, path: '/?a=1' }))
    assert.equal(url.hostname, host)
    assert.ok(url.searchParams.get('lizardSignature'), url.href)
    const signed = await get(url.pathname + url.search, { Host: host })
    assert.equal(signed.status, 200, signed.body)
    const until = Date.now() + 10_000
    while ((await get(url.pathname + url.search, { Host: host })).status === 200) {
      assert.ok(Date.now() < until, 'the signed URL outlived its expiry')
      await new Promise((res) => setTimeout(res, 250))
    }
    await assert.rejects(sb.getSignedUrl(8000, { expiresInSeconds: 0 }), InvalidArgumentError)
  } finally {
    await sb.kill().catch(() => {})
  }
})

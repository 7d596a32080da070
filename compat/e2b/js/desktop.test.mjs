// E2B's desktop add-on from npm (`@e2b/desktop`, unchanged) against a real `lizard server`
// on Lizard's `desktop` template: the SDK's own Xvfb at the size it asks and its XFCE
// session, the mouse, a screenshot, and a stream behind a password whose page is served
// at the URL the SDK makes, over the server's TLS listener under the local CA.
// scripts/test-sdk.sh installs the version asked for (E2B_JS_DESKTOP_VERSIONS).
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { request } from 'node:https'
import { forgetE2bEnv, scopedE2bEnv } from './setup.mjs'

let workspace
let desktop

before(async () => {
  workspace = await scopedE2bEnv('e2b-desktop-js')
  desktop = await import('@e2b/desktop')
})

after(() => forgetE2bEnv(workspace))

/** `https://${host}${path}` sent to the TLS listener, the certificate checked for the name
 * against the local CA alone: [status, body]. */
function httpsGet(host, path) {
  const [hostname, port] = process.env.LIZARD_SDK_TEST_TLS_PROXY.split(':')
  return new Promise((resolve, reject) => {
    const req = request(
      {
        hostname,
        port,
        path,
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
}

test('the SDK starts its desktop at its size, drives it and streams it over HTTPS', async () => {
  const sbx = await desktop.Sandbox.create({ resolution: [640, 480], timeoutMs: 900_000 })
  try {
    assert.deepEqual(await sbx.getScreenSize(), { width: 640, height: 480 })
    await sbx.moveMouse(40, 50)
    assert.deepEqual(await sbx.getCursorPosition(), { x: 40, y: 50 })
    const png = Buffer.from(await sbx.screenshot())
    assert.equal(png.subarray(1, 4).toString('latin1'), 'PNG')
    assert.deepEqual([png.readUInt32BE(16), png.readUInt32BE(20)], [640, 480])

    await sbx.stream.start({ requireAuth: true })
    const key = sbx.stream.getAuthKey()
    const url = new URL(sbx.stream.getUrl({ authKey: key }))
    const host = sbx.getHost(6080)
    assert.equal(url.origin, `https://${host}`)
    assert.equal(url.searchParams.get('password'), key)
    const [status, page] = await httpsGet(host, '/vnc.html')
    assert.equal(status, 200)
    assert.match(page, /noVNC/)
    await assert.rejects(sbx.stream.start(), /already running/)
    await sbx.stream.stop()
  } finally {
    await sbx.kill()
  }
})

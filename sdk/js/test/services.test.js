// `lizard.services` against a real server: a directory deployed as a service answers at its
// URL through the proxy, a second version replaces it, a version failing its health check
// rejects with DeployError while the previous one serves on, the logs carry the app's
// output, and a delete frees the name (the URL answers 404).

import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { Lizard, DeployError, InvalidArgumentError, NotFoundError } from '../src/index.js'
import { server, myProject, waitForHttp, getViaProxy } from './helpers.js'

const APP = `
import http.server
VERSION = open('version.txt').read().strip()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(500 if VERSION.startswith('broken') else 200)
        self.end_headers()
        self.wfile.write(VERSION.encode())
    def log_message(self, fmt, *args):
        print('request', fmt % args, flush=True)
print('app', VERSION, 'starting', flush=True)
http.server.ThreadingHTTPServer(('0.0.0.0', 8000), H).serve_forever()
`
const FAST = { intervalMs: 1000, graceMs: 5000 }
const NAME = 'sdk-js-svc'

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lizard-sdk-svc-'))
function app(version) {
  fs.writeFileSync(path.join(dir, 'app.py'), APP)
  fs.writeFileSync(path.join(dir, 'version.txt'), version)
  fs.writeFileSync(path.join(dir, '.gitignore'), 'secret.txt\n')
  fs.writeFileSync(path.join(dir, 'secret.txt'), 'never uploaded')
  return dir
}

let lizard
let proxy
before(async () => {
  proxy = (await server()).proxy
  await myProject()
  lizard = new Lizard({ project: 'my-project' })
})
after(async () => {
  await lizard?.services.delete(NAME).catch(() => {})
  fs.rmSync(dir, { recursive: true, force: true })
})

test('a directory deploys as a service; versions replace it; a failing one is rolled back', async () => {
  let svc = await lizard.services.deploy(app('v1'), NAME, { cmd: 'python3 app.py', port: 8000, health: FAST })
  assert.equal(svc.status, 'live')
  assert.equal(svc.liveVersion, 1)
  const host = svc.url.split('//')[1].split(':')[0]
  assert.equal(host, `${NAME}.svc.local.lizard.localhost`)
  await waitForHttp(proxy, host, 'v1')
  assert.ok((await lizard.services.list()).some((s) => s.name === NAME))

  svc = await lizard.services.deploy(app('v2'), NAME, { cmd: 'python3 app.py', port: 8000, health: FAST })
  assert.equal(svc.liveVersion, 2)
  await waitForHttp(proxy, host, 'v2')
  const logs = (await lizard.services.logs(NAME)).map((l) => l.data).join('')
  assert.match(logs, /app v2 starting/)

  await assert.rejects(
    lizard.services.deploy(app('broken'), NAME, { cmd: 'python3 app.py', port: 8000, health: FAST }),
    (e) => e instanceof DeployError && e.code === 'UNHEALTHY' && /500/.test(e.serverMessage),
  )
  assert.equal((await lizard.services.get(NAME)).liveVersion, 2)
  await waitForHttp(proxy, host, 'v2')

  await lizard.services.delete(NAME)
  await assert.rejects(lizard.services.get(NAME), (e) => e instanceof NotFoundError)
  assert.equal((await getViaProxy(proxy, host)).status, 404)
})

test('a deploy without a port is refused and records nothing', async () => {
  await assert.rejects(
    lizard.services.deploy(app('v1'), 'sdk-js-noport', { cmd: 'python3 app.py', port: 0 }),
    (e) => e instanceof InvalidArgumentError && /port/.test(e.message),
  )
  await assert.rejects(lizard.services.get('sdk-js-noport'), (e) => e instanceof NotFoundError)
})

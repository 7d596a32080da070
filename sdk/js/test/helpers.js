// Test helpers: a real `lizard server` (real microVMs, real SQLite, real HTTP).
//
// scripts/test-sdk.sh starts one server for both SDK suites and passes it in
// LIZARD_SDK_TEST_API_URL, LIZARD_SDK_TEST_API_KEY and LIZARD_SDK_TEST_PROXY. Without those,
// each test file starts its own from target/debug/lizard (images from LIZARD_TEST_DATA_DIR).

import { spawn } from 'node:child_process'
import fs from 'node:fs'
import http from 'node:http'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'
import readline from 'node:readline'
import { fileURLToPath } from 'node:url'
import { after } from 'node:test'
import { Lizard, NotFoundError, requestObservers } from '../src/index.js'

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..')

/** Every request any SDK client sent in this process (for the OpenAPI contract test). */
export const SENT = []
requestObservers.push((method, p, query, json, apiUrl) => SENT.push({ method, path: p, query, json, apiUrl }))

// Requests of every test file go to LIZARD_SDK_TEST_RECORD_DIR, so the contract test
// (which runs last) checks them all.
process.on('exit', () => {
  const dir = process.env.LIZARD_SDK_TEST_RECORD_DIR
  if (dir && SENT.length) fs.writeFileSync(path.join(dir, `${process.pid}.json`), JSON.stringify(SENT))
})

const freePort = () =>
  new Promise((resolve, reject) => {
    const s = net.createServer()
    s.once('error', reject)
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address()
      s.close(() => resolve(port))
    })
  })

/** The server this process started (stopped after all tests of the file). */
let started
// Registered at import, so it is a hook of the file's root: it runs after every test.
after(async () => {
  if (!started) return
  const { child, data } = started
  started = undefined
  child.kill('SIGTERM')
  await new Promise((resolve) => {
    const t = setTimeout(() => child.kill('SIGKILL'), 120_000)
    child.once('exit', () => (clearTimeout(t), resolve()))
  })
  fs.rmSync(data, { recursive: true, force: true })
})

async function startServer() {
  const bin = process.env.LIZARD_BIN ?? path.join(REPO, 'target/debug/lizard')
  const images = process.env.LIZARD_TEST_DATA_DIR ?? '/var/cache/lizard-test-data'
  const data = fs.mkdtempSync(path.join(os.tmpdir(), 'lizard-sdk-js-'))
  fs.symlinkSync(path.join(images, 'images'), path.join(data, 'images'))
  if (fs.existsSync(path.join(images, 'accel.json'))) fs.copyFileSync(path.join(images, 'accel.json'), path.join(data, 'accel.json'))
  const api = await freePort()
  const proxy = await freePort()
  const env = { ...process.env }
  delete env.LIZARD_API_URL
  delete env.LIZARD_API_KEY
  const log = fs.openSync(path.join(data, 'server.log'), 'w')
  const child = spawn(
    bin,
    ['--data-dir', data, 'server', '--listen', `127.0.0.1:${api}`, '--proxy-listen', `127.0.0.1:${proxy}`],
    { env, stdio: ['ignore', 'pipe', log] },
  )
  const lines = readline.createInterface({ input: child.stdout })
  const first = await new Promise((resolve, reject) => {
    lines.once('line', resolve)
    child.once('exit', (code) => reject(new Error(`lizard server exited ${code}; see ${data}/server.log`)))
  })
  if (!first.startsWith('LIZARD_API_KEY=')) throw new Error(`server said ${first}`)
  const url = `http://127.0.0.1:${api}`
  const deadline = Date.now() + 60_000
  for (;;) {
    try {
      if ((await fetch(`${url}/health`)).ok) break
    } catch {
      // not up yet
    }
    if (Date.now() > deadline) throw new Error('the server did not come up')
    await new Promise((r) => setTimeout(r, 100))
  }
  started = { child, data }
  return { url, key: first.slice('LIZARD_API_KEY='.length), proxy: `127.0.0.1:${proxy}` }
}

let serverPromise
/** The server of this run; sets LIZARD_API_URL and LIZARD_API_KEY as a user's program has them. */
export function server() {
  serverPromise ??= (async () => {
    const s = process.env.LIZARD_SDK_TEST_API_URL
      ? { url: process.env.LIZARD_SDK_TEST_API_URL, key: process.env.LIZARD_SDK_TEST_API_KEY, proxy: process.env.LIZARD_SDK_TEST_PROXY }
      : await startServer()
    process.env.LIZARD_API_URL = s.url
    process.env.LIZARD_API_KEY = s.key
    return s
  })()
  return serverPromise
}

/** The server's OpenAPI document. */
export async function openapi() {
  const s = await server()
  return (await fetch(`${s.url}/openapi.json`)).json()
}

/** The project the reference's examples name: `my-project` (in a workspace of its own). */
export async function myProject() {
  await server()
  const lizard = new Lizard()
  try {
    return await lizard.projects.get('my-project')
  } catch (e) {
    if (!(e instanceof NotFoundError)) throw e
    const ws = await lizard.workspaces.create({ name: 'sdk-examples' })
    return lizard.projects.create({ workspaceId: ws.id, name: 'my-project' })
  }
}

/** One GET through the sandbox-URL proxy with the sandbox's Host (fetch cannot set Host). */
export function getViaProxy(proxy, host, p = '/') {
  const [hostname, port] = proxy.split(':')
  return new Promise((resolve, reject) => {
    const req = http.get({ hostname, port: Number(port), path: p, headers: { Host: host }, timeout: 10_000 }, (res) => {
      const chunks = []
      res.on('data', (c) => chunks.push(c))
      res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(chunks).toString() }))
    })
    req.on('timeout', () => req.destroy(new Error('timeout')))
    req.on('error', reject)
  })
}

/** GET `/` of a sandbox host until it answers 200 with `expect`; bounded in time. */
export async function waitForHttp(proxy, host, expect, timeoutMs = 60_000) {
  const deadline = Date.now() + timeoutMs
  let last
  while (Date.now() < deadline) {
    try {
      last = await getViaProxy(proxy, host)
      if (last.status === 200 && last.body.includes(expect)) return last
    } catch (e) {
      last = e
    }
    await new Promise((r) => setTimeout(r, 250))
  }
  throw new Error(`${host} never answered ${expect}: last ${JSON.stringify(last?.message ?? last)}`)
}

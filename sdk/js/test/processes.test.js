// Background processes, terminals and port waits against a real server: one `base`
// sandbox for the file (creates are slow under TCG), paused and resumed in the middle of a
// streamed process and of a PTY session.

import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, TimedOutError, NotFoundError, ConflictError } from '../src/index.js'
import { server, myProject, getViaProxy } from './helpers.js'

let sandbox
let proxy

before(async () => {
  proxy = (await server()).proxy
  await myProject()
  sandbox = await Sandbox.create('base', { project: 'my-project', timeoutMs: 15 * 60_000 })
})

after(async () => {
  await sandbox?.kill().catch(() => {})
})

const until = async (what, check, timeoutMs = 30_000) => {
  const deadline = Date.now() + timeoutMs
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 50))
  }
}

test('start streams output, takes stdin, is listed, and ends with its exit code', async () => {
  const seen = []
  const h = await sandbox.process.start('echo out; echo err >&2; read line; echo "got $line"; exit 3', {
    onStdout: (t) => seen.push(t),
    onStderr: (t) => seen.push(`E:${t}`),
  })
  assert.ok(h.pid > 1)
  const listed = await sandbox.process.list()
  assert.ok(listed.some((p) => p.pid === h.pid && p.cmd.startsWith('echo out')), JSON.stringify(listed))
  await h.sendStdin('hello\n')
  const r = await h.wait()
  assert.deepEqual([r.stdout, r.stderr, r.exitCode], ['out\ngot hello\n', 'err\n', 3])
  assert.ok(seen.join('').includes('got hello'), JSON.stringify(seen))
  // Ended processes stay listed with their exit code.
  assert.equal((await sandbox.process.list()).find((p) => p.pid === h.pid).exitCode, 3)
})

test('closeStdin gives EOF; kill ends a process; connect from another client replays its output', async () => {
  const cat = await sandbox.process.start('cat; echo done')
  await cat.sendStdin('abc')
  await cat.closeStdin()
  assert.deepEqual(await cat.wait(), { stdout: 'abcdone\n', stderr: '', exitCode: 0 })
  await assert.rejects(cat.sendStdin('late'), ConflictError)

  const ticker = await sandbox.process.start(['sh', '-c', 'echo first; exec sleep 600'])
  const other = await Sandbox.connect(sandbox.sandboxId)
  const replayed = []
  const again = await other.process.connect(ticker.pid, { onStdout: (t) => replayed.push(t) })
  await until('the replayed output', () => replayed.join('') === 'first\n')
  await other.process.kill(ticker.pid, 'SIGTERM')
  const r = await again.wait()
  assert.equal(r.exitCode, 143)
  await assert.rejects(sandbox.process.connect(999999), NotFoundError)
})

test('a callback that throws: wait() rejects with its error, then follows on without repeats', async () => {
  const calls = []
  const h = await sandbox.process.start('echo one; read x; echo two', {
    onStdout: (t) => {
      calls.push(t)
      if (calls.length === 1) throw new Error('boom')
    },
  })
  await assert.rejects(h.wait(), /boom/)
  const listed = await sandbox.process.list()
  assert.equal(listed.find((p) => p.pid === h.pid).exitCode, undefined) // it runs on
  await h.sendStdin('go\n')
  const r = await h.wait()
  assert.equal(r.stdout, 'one\ntwo\n')
  assert.deepEqual(calls, ['one\n', 'two\n'])
})

test('waitForPort resolves once a server listens, and times out with TIMED_OUT', async () => {
  // docs/sdks.md's quick start: a Node server started in the background, then its URL.
  await sandbox.fs.write('/app/server.js', "require('http').createServer((_, r) => r.end('hello from Lizard')).listen(3000)")
  await sandbox.process.start('node /app/server.js')
  await sandbox.waitForPort(3000, { timeoutMs: 60_000 })
  const ports = await sandbox.listPorts()
  const web = ports.find((p) => p.port === 3000)
  assert.ok(web && Number.isInteger(web.pid) && web.cmd.includes('server.js'), JSON.stringify(ports))
  assert.ok(['0.0.0.0', '::'].includes(web.address), JSON.stringify(web))
  // The platform's own guest ports (the agent's API forward) are never a user's.
  assert.ok(!ports.some((p) => [49171, 49999].includes(p.port)), JSON.stringify(ports))
  const r = await getViaProxy(proxy, sandbox.getHost(3000))
  assert.deepEqual([r.status, r.body], [200, 'hello from Lizard'])
  const started = Date.now()
  const e = await sandbox.waitForPort(3999, { timeoutMs: 500 }).catch((e) => e)
  assert.ok(e instanceof TimedOutError, String(e))
  assert.equal(e.code, 'TIMED_OUT')
  assert.ok(Date.now() - started >= 500)
})

/** Everything a terminal printed, as text. */
const screen = (chunks) => Buffer.concat(chunks.map((c) => Buffer.from(c))).toString()

test('a PTY is a real terminal: tty, stty size after a resize, job control', async () => {
  const out = []
  const pty = await sandbox.pty.create({ cols: 100, rows: 30, onData: (d) => out.push(d) })
  await pty.sendInput('tty; stty size\n')
  await until('tty and stty size', () => /\/dev\/pts\/\d+/.test(screen(out)) && screen(out).includes('30 100'))
  await pty.resize({ cols: 120, rows: 40 })
  await pty.sendInput('stty size\n')
  await until('the new size', () => screen(out).includes('40 120'))
  await pty.sendInput('sleep 100 &\njobs\n')
  await until('the job', () => /\[1\]\+\s+Running\s+sleep 100/.test(screen(out)))
  await pty.sendInput('kill %1; exit 7\n')
  assert.equal((await pty.wait()).exitCode, 7)
})

test('pause and resume in the middle of a streamed process and of a PTY session', async () => {
  const lines = []
  const counter = await sandbox.process.start('for i in $(seq 1 40); do echo $i; sleep 0.1; done', {
    onStdout: (t) => lines.push(t),
  })
  const out = []
  const pty = await sandbox.pty.create({ onData: (d) => out.push(d) })
  await pty.sendInput('echo before-pause\n')
  await until('output before the pause', () => lines.join('').includes('3\n') && screen(out).includes('before-pause\r\n'))
  // A wait() pending during the pause: its stream broke off, it tried once more and rejects
  // (the check is attached at once: the rejection may come before pause() returns).
  const pending = assert.rejects(pty.wait())
  await sandbox.pause()
  await pending
  await sandbox.resume()
  // The counter ran on where it was; its handle follows it again, without repeats.
  const r = await counter.wait()
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, Array.from({ length: 40 }, (_, i) => `${i + 1}\n`).join(''))
  assert.equal(lines.join(''), r.stdout)
  // The terminal's shell is the same process, reattached from a new handle.
  const again = []
  const back = await sandbox.pty.connect(pty.pid, { onData: (d) => again.push(d) })
  await until('the replayed screen', () => screen(again).includes('before-pause'))
  await back.sendInput('echo after-$((20+1))\n')
  await until('output after the resume', () => screen(again).includes('after-21'))
  await back.sendInput('exit\n')
  const whole = await back.wait()
  assert.equal(whole.exitCode, 0)
  // The first handle's wait() follows on where its stream broke off: each byte once.
  assert.equal((await pty.wait()).stdout, whole.stdout)
  assert.equal(screen(out), whole.stdout)
})

// `lizard.templates` against a real server: the built-ins, a push of a tiny directory (copy,
// run, a start command) built in a microVM, a sandbox from it, a failing step, and delete
// refused while a sandbox uses the template. Steps are kept short: each push boots a build VM.

import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { Lizard, BuildError, ConflictError, NotFoundError } from '../src/index.js'
import { server, myProject, waitForHttp } from './helpers.js'

const recipe = (name, run) => `name = "${name}"
from = "base"
[[steps]]
copy = { src = "site/", dest = "/opt/site/" }
[[steps]]
run = "${run}"
[start]
cmd = "python3 -m http.server 8000 --directory /opt/site"
ready = { port = 8000 }
`

const dirs = []
function makeDir(name, run) {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), 'lizard-sdk-tpl-'))
  dirs.push(d)
  fs.mkdirSync(path.join(d, 'site'))
  fs.writeFileSync(path.join(d, 'site/hello.txt'), 'hello from a pushed template\n')
  fs.writeFileSync(path.join(d, 'site/notes.tmp'), 'left out by .lizardignore')
  fs.writeFileSync(path.join(d, '.lizardignore'), '*.tmp\n')
  fs.writeFileSync(path.join(d, 'lizard.template.toml'), recipe(name, run))
  return d
}

let lizard
let proxy
before(async () => {
  proxy = (await server()).proxy
  await myProject()
  lizard = new Lizard({ project: 'my-project' })
})
after(async () => {
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true })
  const left = await pushed?.catch(() => undefined)
  if (left) await lizard.templates.delete(left.name).catch(() => {})
})

test('list shows the built-ins', async () => {
  const byName = Object.fromEntries((await lizard.templates.list()).map((t) => [t.name, t]))
  for (const name of ['base', 'code-interpreter-v1']) {
    assert.equal(byName[name].builtin, true, name)
    assert.equal(byName[name].ready, true, name)
  }
  assert.equal((await lizard.templates.get('base')).builtin, true)
})

test('get of an unknown template is NotFoundError', async () => {
  await assert.rejects(lizard.templates.get('nope'), (e) => e instanceof NotFoundError && e.code === 'NOT_FOUND')
})

// One template pushed for the file (by the first test that needs it; deleted by the last).
let pushed
async function pushOnce() {
  pushed ??= (async () => {
    const name = `sdk-js-${randomUUID().slice(0, 6)}`
    const events = []
    const build = await lizard.templates.push(makeDir(name, 'echo built > /opt/site/built.txt'), { onEvent: (e) => events.push(e) })
    return { name, build, events }
  })()
  return pushed
}

test('push builds and streams its events in order', async () => {
  const { name, build, events } = await pushOnce()
  assert.equal(build.status, 'ready')
  assert.equal(build.template, name)
  assert.deepEqual(build.steps.map((s) => [s.index, s.status]), [[1, 'ready'], [2, 'ready']])
  // Each step before its end, `done` last.
  const kinds = events.filter((e) => ['step', 'stepDone', 'done'].includes(e.type)).map((e) => `${e.type}${e.index ?? ''}`)
  assert.deepEqual(events.at(-1), { type: 'done', status: 'ready' })
  const at = (k) => kinds.indexOf(k)
  assert.ok(at('step1') < at('stepDone1') && at('stepDone1') < at('step2') && at('step2') < at('stepDone2'), String(kinds))
  assert.ok(at('step1') >= 0, String(kinds))
  // The whole stream can be read again, and the build's status is kept.
  const again = []
  for await (const e of lizard.templates.events(name, build.buildId)) again.push(e.type)
  assert.equal(again.at(-1), 'done')
  assert.equal((await lizard.templates.getBuild(name, build.buildId)).status, 'ready')
  const info = await lizard.templates.get(name)
  assert.equal(info.ready, true)
  assert.equal(info.builtin, false)
  assert.equal(info.from, 'base')
  assert.equal(info.buildId, build.buildId)
  assert.ok((await lizard.templates.list()).some((t) => t.name === name))
})

test('a failing step rejects with STEP_FAILED, its index and output tail; the unchanged prefix is cached', async () => {
  await pushOnce()
  const name = `sdk-js-fail-${randomUUID().slice(0, 6)}`
  const seen = []
  await assert.rejects(
    lizard.templates.push(makeDir(name, 'echo about to fail; exit 3'), { onEvent: (e) => seen.push(e) }),
    (e) => {
      assert.ok(e instanceof BuildError, String(e))
      assert.equal(e.code, 'STEP_FAILED')
      assert.equal(e.step, 2)
      assert.match(e.outputTail ?? '', /about to fail/)
      assert.equal(e.build.status, 'failed')
      // Step 1 is the pushed template's first step over the same content: taken from the cache.
      assert.deepEqual(e.build.steps.map((s) => [s.index, s.cached]), [[1, true], [2, false]])
      return true
    },
  )
  assert.equal(seen.at(-1).type, 'done')
  assert.equal(seen.at(-1).status, 'failed')
  assert.equal((await lizard.templates.get(name)).ready, false)
  await lizard.templates.delete(name)
})

test('create from it; delete refused while a sandbox uses it', async () => {
  const { name } = await pushOnce()
  const sb = await lizard.create(name)
  try {
    assert.equal(sb.template, name)
    assert.equal(await sb.fs.read('/opt/site/hello.txt'), 'hello from a pushed template\n')
    assert.equal((await sb.process.exec('cat /opt/site/built.txt')).stdout, 'built\n')
    assert.deepEqual((await sb.process.exec('ls /opt/site')).stdout.split(/\s+/).filter(Boolean), ['built.txt', 'hello.txt'])
    // The start command was in the snapshot: it serves without any exec.
    await waitForHttp(proxy, sb.getHost(8000), 'built.txt', 30_000)
    await assert.rejects(lizard.templates.delete(name), (e) => e instanceof ConflictError && e.code === 'CONFLICT')
  } finally {
    await sb.kill()
  }
  await lizard.templates.delete(name)
  await assert.rejects(lizard.templates.get(name), NotFoundError)
})

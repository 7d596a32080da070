// Files beyond read/write against a real server: what is at a path, renames, several files
// in one call, a directory as one tar archive, and directory watches (events, stop, and
// the end of a watch at a pause).

import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { execFileSync } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { mkdtempSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { APIConnectionError, InvalidArgumentError, Lizard, NotFoundError } from '../src/index.js'
import { writeTar } from '../src/tar.js'
import { server, myProject } from './helpers.js'

let sandbox

before(async () => {
  await server()
  await myProject()
  sandbox = await new Lizard({ project: 'my-project' }).create('base')
})

after(async () => {
  await sandbox?.kill().catch(() => {})
})

async function freshDir() {
  const d = `/tmp/files-js-${randomUUID().slice(0, 8)}`
  await sandbox.fs.makeDir(d)
  return d
}

async function waitUntil(check, what, timeoutMs = 30_000) {
  const deadline = Date.now() + timeoutMs
  while (!(await check())) {
    assert.ok(Date.now() < deadline, `not within ${timeoutMs} ms: ${what}`)
    await new Promise((r) => setTimeout(r, 50))
  }
}

/** The names in a tar archive, read by the system's tar. */
function tarNames(bytes) {
  const dir = mkdtempSync(join(tmpdir(), 'lizard-js-tar-'))
  writeFileSync(join(dir, 'a.tar'), bytes)
  return execFileSync('tar', ['-tf', join(dir, 'a.tar')], { encoding: 'utf8' }).trim().split('\n').sort()
}

test('getInfo, exists and rename, with typed errors', async () => {
  const d = await freshDir()
  await sandbox.fs.write(`${d}/a.txt`, 'hello', { mode: 0o600 })
  await sandbox.process.exec(`ln -s a.txt ${d}/link`)
  const info = await sandbox.fs.getInfo(`${d}/a.txt`)
  assert.deepEqual([info.name, info.type, info.size, info.mode, info.owner], ['a.txt', 'file', 5, 0o600, 'root'])
  assert.equal((await sandbox.fs.getInfo(`${d}/link`)).symlinkTarget, 'a.txt')
  assert.equal(await sandbox.fs.exists(`${d}/a.txt`), true)
  assert.equal(await sandbox.fs.exists(`${d}/nothing`), false)
  const moved = await sandbox.fs.rename(`${d}/a.txt`, `${d}/b.txt`)
  assert.equal(moved.path, `${d}/b.txt`)
  await assert.rejects(sandbox.fs.getInfo(`${d}/a.txt`), (e) => e instanceof NotFoundError && e.code === 'NOT_FOUND')
  await assert.rejects(sandbox.fs.downloadDir(`${d}/b.txt`), (e) => e instanceof InvalidArgumentError && /not a directory/.test(e.message))
})

test('writeFiles and downloadDir move many files in one call each', async () => {
  const d = await freshDir()
  const long = `${d}/up/${'n'.repeat(120)}.txt`
  const r = await sandbox.fs.writeFiles({ [`${d}/up/a.txt`]: 'alpha', [`${d}/up/deep/b.bin`]: new Uint8Array([1, 2, 3]), [long]: 'x' })
  assert.deepEqual([r.path, r.entries, r.bytesWritten], [`${d}/up`, 3, 9])
  assert.equal(await sandbox.fs.read(`${d}/up/a.txt`), 'alpha')
  assert.equal(await sandbox.fs.read(long), 'x')
  const tar = await sandbox.fs.downloadDir(`${d}/up`)
  assert.deepEqual(tarNames(tar), ['a.txt', 'deep', 'deep/b.bin', `${'n'.repeat(120)}.txt`])
  // The archive back in, elsewhere; an entry leaving the target is refused.
  assert.equal((await sandbox.fs.writeArchive(`${d}/copy`, tar)).entries, 4)
  assert.deepEqual([...(await sandbox.fs.readBytes(`${d}/copy/deep/b.bin`))], [1, 2, 3])
  const evil = writeTar([{ name: '../escaped', data: new TextEncoder().encode('no'), mode: 0o644 }])
  await assert.rejects(sandbox.fs.writeArchive(`${d}/target`, evil), (e) => e instanceof InvalidArgumentError && e.code === 'INVALID_ARGUMENT')
  assert.equal(await sandbox.fs.exists(`${d}/escaped`), false)
})

test('watch reports changes until stopped; a pause ends it', async () => {
  const d = await freshDir()
  const seen = []
  const exits = []
  const handle = await sandbox.fs.watch(d, { recursive: true, onEvent: (e) => seen.push(e), onExit: (e) => exits.push(e) })
  // A new directory is watched once its own event is read: what happens in it before then
  // shows only as what it holds at that moment, so the test waits for it.
  await sandbox.fs.makeDir(`${d}/sub`)
  await waitUntil(() => seen.some((e) => e.type === 'create' && e.path === `${d}/sub`), 'the new directory')
  await sandbox.process.exec(`echo 1 > ${d}/sub/f && mv ${d}/sub/f ${d}/sub/g && rm ${d}/sub/g`)
  await waitUntil(() => seen.some((e) => e.type === 'remove' && e.path === `${d}/sub/g`), 'the removal')
  assert.ok(seen.some((e) => e.type === 'create' && e.path === `${d}/sub` && e.isDir), JSON.stringify(seen))
  assert.ok(seen.some((e) => e.type === 'rename' && e.path === `${d}/sub/f` && e.newPath === `${d}/sub/g`))
  await handle.stop()
  assert.equal(exits.length, 0)
  await assert.rejects(sandbox.fs.watch(`${d}/nothing`), (e) => e instanceof NotFoundError)
  // A pause ends a watch: onExit hears of it; a new one works after the resume.
  const paused = await sandbox.fs.watch(d, { onEvent: () => {}, onExit: (e) => exits.push(e) })
  await sandbox.pause()
  await waitUntil(() => exits.length === 1, 'the watch ending at the pause')
  assert.ok(exits[0] instanceof APIConnectionError, String(exits[0]))
  await sandbox.resume()
  const again = []
  const handle2 = await sandbox.fs.watch(d, { onEvent: (e) => again.push(e) })
  await sandbox.fs.write(`${d}/after`, '2')
  await waitUntil(() => again.some((e) => e.path.startsWith(`${d}/`)), 'an event after the resume')
  await handle2.stop()
  await paused.stop()
})

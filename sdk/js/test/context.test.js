// The push's directory scan (no server): ignore rules, symlinks, modes, hashes, the order of
// the manifest and the recipe file.

import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import { execFileSync } from 'node:child_process'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { ContextError } from '../src/index.js'
import { readRecipe, scan } from '../src/context.js'
import { IgnoreRules, isIgnored } from '../src/ignore.js'

const sha = (data) => createHash('sha256').update(data).digest('hex')
const made = []
const tmp = () => {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), 'lizard-ctx-'))
  made.push(d)
  return d
}
after(() => {
  for (const d of made) fs.rmSync(d, { recursive: true, force: true })
})

function tree() {
  const d = tmp()
  fs.mkdirSync(path.join(d, 'tools/sub'), { recursive: true })
  fs.writeFileSync(path.join(d, 'tools/setup.sh'), '#!/bin/sh\necho hi\n', { mode: 0o755 })
  fs.chmodSync(path.join(d, 'tools/setup.sh'), 0o755)
  fs.writeFileSync(path.join(d, 'tools/sub/data'), 'data')
  fs.writeFileSync(path.join(d, 'tools-b'), 'sorts between tools and tools/ in byte order')
  fs.writeFileSync(path.join(d, 'same-as-data'), 'data')
  fs.chmodSync(path.join(d, 'tools/sub'), 0o750)
  fs.symlinkSync('setup.sh', path.join(d, 'tools/run.sh'))
  fs.symlinkSync('/etc/passwd', path.join(d, 'passwd'))
  return d
}

const paths = async (d) => (await scan(d)).entries.map((e) => e.path)

test('scan lists files, dirs and symlinks in byte order, with modes and hashes', async () => {
  const d = tree()
  const { entries, filesByHash } = await scan(d)
  assert.deepEqual(
    entries.map((e) => e.path),
    ['passwd', 'same-as-data', 'tools', 'tools-b', 'tools/run.sh', 'tools/setup.sh', 'tools/sub', 'tools/sub/data'],
  )
  const by = Object.fromEntries(entries.map((e) => [e.path, e]))
  assert.deepEqual(by['tools/setup.sh'], { path: 'tools/setup.sh', mode: 0o755, type: 'file', sha256: sha('#!/bin/sh\necho hi\n'), size: 18 })
  assert.deepEqual(by['tools/sub'], { path: 'tools/sub', mode: 0o750, type: 'dir' })
  // Links are recorded, never followed: the one pointing out is the server's to refuse.
  assert.deepEqual(by['tools/run.sh'], { path: 'tools/run.sh', mode: 0o777, type: 'symlink', target: 'setup.sh' })
  assert.deepEqual(by.passwd, { path: 'passwd', mode: 0o777, type: 'symlink', target: '/etc/passwd' })
  // Two files with one content: one upload.
  assert.deepEqual([...filesByHash.keys()].sort(), [sha('data'), sha('#!/bin/sh\necho hi\n'), sha(fs.readFileSync(path.join(d, 'tools-b')))].sort())
})

test('a symlinked directory is not entered; non-ASCII names sort by their bytes', async () => {
  const d = tree()
  const outside = tmp()
  fs.writeFileSync(path.join(outside, 'secret'), 's')
  fs.symlinkSync(outside, path.join(d, 'out'))
  fs.writeFileSync(path.join(d, '\u{1F600}'), 'astral') // UTF-16 would sort it before U+FF5E
  fs.writeFileSync(path.join(d, '\uFF5E'), 'bmp')
  const p = await paths(d)
  assert.ok(p.includes('out') && !p.some((x) => x.startsWith('out/')))
  assert.deepEqual(p.slice(-2), ['\uFF5E', '\u{1F600}'])
})

test('.lizardignore leaves out names, dirs and globs; a nested one overrides', async () => {
  const d = tree()
  fs.writeFileSync(path.join(d, '.lizardignore'), '# comment\n\ntools/sub/\n*.sh\n!setup.sh\nsame-as-data\n')
  assert.deepEqual(await paths(d), ['.lizardignore', 'passwd', 'tools', 'tools-b', 'tools/setup.sh'])
  fs.writeFileSync(path.join(d, '.lizardignore'), '*.sh\n')
  fs.writeFileSync(path.join(d, 'tools/.lizardignore'), '!run.sh\ndata\n')
  assert.deepEqual(await paths(d), [
    '.lizardignore', 'passwd', 'same-as-data', 'tools', 'tools-b', 'tools/.lizardignore', 'tools/run.sh', 'tools/sub',
  ])
})

test('ignore pattern rules', () => {
  const rules = [new IgnoreRules('', ['build/', '/top.txt', 'docs/*.md', '**/cache', 'a?c', '[xy].log'])]
  const cases = [
    ['build', true, true], ['build', false, false], ['src/build', true, true],
    ['top.txt', false, true], ['sub/top.txt', false, false],
    ['docs/a.md', false, true], ['docs/sub/a.md', false, false], ['x/docs/a.md', false, false],
    ['cache', true, true], ['deep/er/cache', false, true],
    ['abc', false, true], ['a/c', false, false],
    ['x.log', false, true], ['z.log', false, false],
  ]
  for (const [p, isDir, ignored] of cases) assert.equal(isIgnored(rules, p, isDir), ignored, `${p} ${isDir}`)
  const nested = [new IgnoreRules('', ['*.tmp']), new IgnoreRules('keep', ['!*.tmp', '/local'])]
  assert.ok(isIgnored(nested, 'a.tmp', false) && !isIgnored(nested, 'keep/a.tmp', false))
  assert.ok(isIgnored(nested, 'keep/local', false) && !isIgnored(nested, 'keep/x/local', false))
})

test('special files are refused unless ignored', async () => {
  const d = tree()
  execFileSync('mkfifo', [path.join(d, 'pipe')])
  await assert.rejects(scan(d), (e) => e instanceof ContextError && e.message.includes('pipe'))
  fs.writeFileSync(path.join(d, '.lizardignore'), 'pipe\n')
  assert.ok(!(await paths(d)).includes('pipe'))
})

test('the recipe: lizard.template.toml, else a Dockerfile with a name', async () => {
  const d = tmp()
  await assert.rejects(readRecipe(d), (e) => e instanceof ContextError && /neither lizard.template.toml nor Dockerfile/.test(e.message))
  fs.writeFileSync(path.join(d, 'Dockerfile'), 'FROM base\nRUN true\n')
  await assert.rejects(readRecipe(d), (e) => e instanceof ContextError && /needs a name/.test(e.message))
  assert.deepEqual(await readRecipe(d, 'mine'), { text: 'FROM base\nRUN true\n', format: 'dockerfile' })
  fs.writeFileSync(path.join(d, 'lizard.template.toml'), 'name = "t"\nfrom = "base"\n')
  assert.deepEqual(await readRecipe(d), { text: 'name = "t"\nfrom = "base"\n', format: 'toml' })
  await assert.rejects(scan(path.join(d, 'nope')), (e) => e instanceof ContextError && /not a directory/.test(e.message))
})

// The tar writer of `fs.writeFiles`, read back by the system's tar (no server).

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { execFileSync } from 'node:child_process'
import { mkdtempSync, readFileSync, statSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { commonDir, writeTar } from '../src/tar.js'

test('GNU tar reads what writeTar writes, long names and modes included', () => {
  const long = 'd/' + 'n'.repeat(150) + '.txt'
  const archive = writeTar([
    { name: 'a.txt', data: new TextEncoder().encode('hello'), mode: 0o640 },
    { name: long, data: new Uint8Array([0, 1, 2, 255]), mode: 0o755 },
  ])
  assert.equal(archive.length % 512, 0)
  const dir = mkdtempSync(join(tmpdir(), 'lizard-tar-'))
  writeFileSync(join(dir, 'x.tar'), archive)
  const listed = execFileSync('tar', ['-tf', join(dir, 'x.tar')], { encoding: 'utf8' }).trim().split('\n')
  assert.deepEqual(listed, ['a.txt', long])
  execFileSync('tar', ['-xf', join(dir, 'x.tar'), '-C', dir])
  assert.equal(readFileSync(join(dir, 'a.txt'), 'utf8'), 'hello')
  assert.deepEqual([...readFileSync(join(dir, long))], [0, 1, 2, 255])
  assert.equal(statSync(join(dir, 'a.txt')).mode & 0o777, 0o640)
})

test('the common directory of absolute file paths', () => {
  assert.equal(commonDir(['/app/a.txt', '/app/sub/b.txt']), '/app')
  assert.equal(commonDir(['/app/a.txt']), '/app')
  assert.equal(commonDir(['/app/a.txt', '/srv/b']), '/')
  assert.equal(commonDir(['/a/b/c/d', '/a/b/x/y']), '/a/b')
})

// readCodeEvents without a server: NDJSON split anywhere folds into one Execution, the
// callbacks see each event as it comes, and a stream without its `end` is an error.

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { readCodeEvents, APIConnectionError } from '../src/index.js'

async function* chunks(text, size) {
  const bytes = new TextEncoder().encode(text)
  for (let i = 0; i < bytes.length; i += size) yield bytes.slice(i, i + size)
}

const STREAM = [
  { type: 'stdout', text: 'héllo\n' },
  { type: 'result', data: { 'image/png': 'iVBOR', 'text/plain': '<Figure>' }, isMainResult: false },
  { type: 'result', data: { 'text/plain': '42', 'application/x-custom': 1 }, isMainResult: true },
  { type: 'error', name: 'ZeroDivisionError', value: 'division by zero', traceback: 'tb' },
  { type: 'end', executionCount: 3 },
].map((e) => JSON.stringify(e)).join('\n') + '\n'

test('events fold into an Execution whatever the chunking', async () => {
  for (const size of [1, 7, 4096]) {
    const seen = []
    const execution = await readCodeEvents(chunks(STREAM, size), {
      onStdout: (t) => seen.push(['stdout', t]),
      onResult: (r) => seen.push(['result', r.formats()]),
      onError: (e) => seen.push(['error', e.name]),
    })
    assert.deepEqual(execution.logs.stdout, ['héllo\n'])
    assert.equal(execution.text, '42')
    assert.equal(execution.results[0].png, 'iVBOR')
    assert.deepEqual(execution.results[1].extra, { 'application/x-custom': 1 })
    assert.equal(execution.error.name, 'ZeroDivisionError')
    assert.equal(execution.executionCount, 3)
    assert.deepEqual(seen, [['stdout', 'héllo\n'], ['result', ['text', 'png']], ['result', ['text', 'application/x-custom']], ['error', 'ZeroDivisionError']])
  }
})

test('a stream without its end is a connection error', async () => {
  await assert.rejects(readCodeEvents(chunks('{"type":"stdout","text":"x"}\n', 5)), APIConnectionError)
})

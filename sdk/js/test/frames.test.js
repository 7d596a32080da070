// The streamed-exec frame decoder, fed byte by byte (no server).

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { readExecFrames } from '../src/frames.js'
import { NotFoundError, APIConnectionError } from '../src/index.js'

function frame(kind, payload) {
  const data = typeof payload === 'string' ? new TextEncoder().encode(payload) : payload
  const out = new Uint8Array(5 + data.length)
  new DataView(out.buffer).setUint8(0, kind)
  new DataView(out.buffer).setUint32(1, data.length)
  out.set(data, 5)
  return out
}

async function* byteByByte(...frames) {
  for (const f of frames) for (const b of f) yield Uint8Array.of(b)
}

test('frames split anywhere, UTF-8 split across frames', async () => {
  const e = new TextEncoder().encode('é') // two bytes
  const seen = []
  const r = await readExecFrames(
    byteByByte(frame(4, 'a'), frame(4, e.subarray(0, 1)), frame(5, 'warn'), frame(4, e.subarray(1)), frame(6, '{"exitCode":3,"timedOut":false}')),
    (t) => seen.push(t),
    undefined,
  )
  assert.deepEqual(r, { stdout: 'aé', stderr: 'warn', exitCode: 3, timedOut: false })
  assert.equal(seen.join(''), 'aé')
})

test('an error frame is a typed error; a cut stream is a connection error', async () => {
  await assert.rejects(readExecFrames(byteByByte(frame(7, '{"code":"NOT_FOUND","message":"no /x"}'))), (e) => e instanceof NotFoundError && e.code === 'NOT_FOUND')
  await assert.rejects(readExecFrames(byteByByte(frame(4, 'partial'))), APIConnectionError)
})

// The streamed exec body (POST /v1/sandboxes/{id}/exec?stream=true): frames of
// [kind: u8][length: u32 big-endian][payload]; stdout (4) and stderr (5) carry the command's
// bytes, then exit (6, JSON { exitCode, signal?, timedOut }) or error (7, JSON { code,
// message }) ends it.

import { APIConnectionError, errorFor } from './errors.js'

const STDOUT = 4
const STDERR = 5
const EXIT = 6
const ERROR = 7

/** The agent's error codes, as the API's statuses. */
const AGENT_STATUS = { NOT_FOUND: 404, INVALID_ARGUMENT: 422, IS_A_DIRECTORY: 422, NOT_A_DIRECTORY: 422, PERMISSION_DENIED: 403 }

/** Decode frames from an async iterable of byte chunks, calling the callbacks with text as it arrives. */
export async function readExecFrames(chunks, onStdout, onStderr) {
  const decoders = { [STDOUT]: new TextDecoder(), [STDERR]: new TextDecoder() }
  const callbacks = { [STDOUT]: onStdout, [STDERR]: onStderr }
  const out = { [STDOUT]: [], [STDERR]: [] }
  const emit = (kind, text) => {
    if (!text) return
    out[kind].push(text)
    callbacks[kind]?.(text)
  }
  let buf = new Uint8Array(0)
  for await (const chunk of chunks) {
    const joined = new Uint8Array(buf.length + chunk.length)
    joined.set(buf)
    joined.set(chunk, buf.length)
    buf = joined
    while (buf.length >= 5) {
      const view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength)
      const kind = view.getUint8(0)
      const length = view.getUint32(1)
      if (buf.length < 5 + length) break
      const payload = buf.subarray(5, 5 + length)
      buf = buf.subarray(5 + length)
      if (kind === STDOUT || kind === STDERR) {
        emit(kind, decoders[kind].decode(payload, { stream: true }))
      } else if (kind === EXIT) {
        for (const k of [STDOUT, STDERR]) emit(k, decoders[k].decode())
        const status = JSON.parse(new TextDecoder().decode(payload))
        return {
          stdout: out[STDOUT].join(''),
          stderr: out[STDERR].join(''),
          exitCode: status.exitCode ?? -1,
          timedOut: status.timedOut ?? false,
        }
      } else if (kind === ERROR) {
        const err = JSON.parse(new TextDecoder().decode(payload))
        const code = String(err.code ?? 'INTERNAL')
        throw errorFor(AGENT_STATUS[code] ?? 500, code, String(err.message ?? ''))
      }
    }
  }
  throw new APIConnectionError('the exec stream ended before the command did')
}

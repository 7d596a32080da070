// The streamed exec body (POST /v1/sandboxes/{id}/exec?stream=true): frames of
// [kind: u8][length: u32 big-endian][payload]; stdout (4) and stderr (5) carry the command's
// bytes, then exit (6, JSON { exitCode, signal?, timedOut }) or error (7, JSON { code,
// message }) ends it.

import { APIConnectionError, errorFor } from './errors.js'

export const STDOUT = 4
export const STDERR = 5
export const EXIT = 6
export const ERROR = 7
/** A background process's first frame: its JSON `ProcessInfo` ({ pid, cmd, startedAtMs, pty }). */
export const STARTED = 8

/** The agent's error codes, as the API's statuses. */
const AGENT_STATUS = { NOT_FOUND: 404, INVALID_ARGUMENT: 422, IS_A_DIRECTORY: 422, NOT_A_DIRECTORY: 422, PERMISSION_DENIED: 403 }

/** The frames of an async iterable of byte chunks, as `{ kind, payload }`. */
export async function* frames(chunks) {
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
      yield { kind, payload: buf.subarray(5, 5 + length) }
      buf = buf.subarray(5 + length)
    }
  }
}

/** The JSON payload of a frame. */
export const json = (payload) => JSON.parse(new TextDecoder().decode(payload))

/** The typed error an `error` frame carries. */
export function frameError(payload) {
  const err = json(payload)
  const code = String(err.code ?? 'INTERNAL')
  return errorFor(AGENT_STATUS[code] ?? STATUS[code] ?? 500, code, String(err.message ?? ''))
}

/** The API's own codes an `error` frame may carry (a process stream that broke off). */
const STATUS = { UNAVAILABLE: 503, CONFLICT: 409, BOOT_FAILED: 502 }

/**
 * Decode exec frames, calling `onStdout` / `onStderr` with text as it arrives; resolves to
 * `{ stdout, stderr, exitCode, timedOut }` at the exit frame. `onStarted` gets a background
 * process's `ProcessInfo`.
 */
export async function readExecFrames(chunks, onStdout, onStderr, onStarted) {
  const decoders = { [STDOUT]: new TextDecoder(), [STDERR]: new TextDecoder() }
  const callbacks = { [STDOUT]: onStdout, [STDERR]: onStderr }
  const out = { [STDOUT]: [], [STDERR]: [] }
  const emit = (kind, text) => {
    if (!text) return
    out[kind].push(text)
    callbacks[kind]?.(text)
  }
  for await (const { kind, payload } of frames(chunks)) {
    if (kind === STDOUT || kind === STDERR) {
      emit(kind, decoders[kind].decode(payload, { stream: true }))
    } else if (kind === STARTED) {
      onStarted?.(json(payload))
    } else if (kind === EXIT) {
      for (const k of [STDOUT, STDERR]) emit(k, decoders[k].decode())
      const status = json(payload)
      return {
        stdout: out[STDOUT].join(''),
        stderr: out[STDERR].join(''),
        exitCode: status.exitCode ?? -1,
        timedOut: status.timedOut ?? false,
      }
    } else if (kind === ERROR) {
      throw frameError(payload)
    }
  }
  throw new APIConnectionError('the exec stream ended before the command did')
}

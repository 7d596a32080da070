// Background processes and terminals (`sandbox.process.start/list/connect/kill`,
// `sandbox.pty.create`): they belong to the sandbox, not to this client. A handle follows
// one over HTTP (`POST …/processes` answers with its frames; `GET …/processes/{pid}/output`
// reattaches: the output the sandbox kept — its newest 1 MiB — then live output, then the
// exit). A handle that lost its stream (a pause, a network cut) reattaches in `wait()`,
// skipping the output it already delivered.

import { APIConnectionError } from './errors.js'
import { frames, json, frameError, STDOUT, STDERR, STARTED, EXIT, ERROR } from './frames.js'

/** A stream open this long (a server process) is not cut by the client's own timeout. */
export const STREAM_TIMEOUT_MS = 2 ** 31 - 1

const processPath = (sandbox, rest = '') => `/v1/sandboxes/${encodeURIComponent(sandbox.sandboxId)}/processes${rest}`

/** The request body of an exec or a start: `cmd` a shell string or an argv array. */
export function commandBody(cmd, opts) {
  const body = Array.isArray(cmd) ? { argv: cmd } : { cmd }
  if (opts.cwd !== undefined) body.cwd = opts.cwd
  if (opts.envs && Object.keys(opts.envs).length) body.env = opts.envs
  if (opts.user !== undefined) body.user = opts.user
  if (opts.pty !== undefined) body.pty = opts.pty
  return body
}

/**
 * A process running in a sandbox: `pid`, `wait()`, `kill(signal?)`, `sendStdin(data)`,
 * `closeStdin()`, `disconnect()` (stop following it; it runs on).
 */
export class ProcessHandle {
  #sandbox
  #onOutput
  #following
  #abort
  /** Bytes of output delivered so far (a reattach skips them). */
  #seen = 0
  #out = { [STDOUT]: [], [STDERR]: [] }
  #decoders = { [STDOUT]: new TextDecoder(), [STDERR]: new TextDecoder() }

  constructor(sandbox, info, onOutput) {
    this.#sandbox = sandbox
    this.info = info
    this.#onOutput = onOutput
  }

  get pid() {
    return this.info.pid
  }

  /** Follow the frames of `resp` (after `skip` bytes of output) until the exit. */
  _follow(resp, abort, skip = 0) {
    this.#abort = abort
    this.#following = this.#consume(resp.body, skip)
    // A failure (a callback that threw, a stream that broke off) ends the following and
    // closes its stream; wait() reports it, nobody else awaits this.
    this.#following.catch(() => abort.abort())
  }

  async #consume(body, skip) {
    for await (const { kind, payload } of frames(body)) {
      if (kind === STDOUT || kind === STDERR) {
        let data = payload
        const n = Math.min(skip, data.length)
        skip -= n
        data = data.subarray(n)
        if (!data.length) continue
        this.#seen += data.length
        this.#out[kind].push(this.#decoders[kind].decode(data, { stream: true }))
        this.#onOutput?.(kind, data)
      } else if (kind === STARTED) {
        this.info = json(payload)
      } else if (kind === EXIT) {
        const status = json(payload)
        const text = (k) => this.#out[k].join('') + this.#decoders[k].decode()
        return { stdout: text(STDOUT), stderr: text(STDERR), exitCode: status.exitCode ?? -1 }
      } else if (kind === ERROR) {
        // The process itself never fails here: its stream broke off (a pause, a VM that
        // stopped answering); the process may run on.
        const cause = frameError(payload)
        throw new APIConnectionError(`the stream of process ${this.pid} broke off: ${cause.message}`, { cause })
      }
    }
    throw new APIConnectionError(`the stream of process ${this.pid} broke off; it may still run`)
  }

  /** Reattach: the sandbox's kept output from where this handle stopped, then live output. */
  async _reattach() {
    const abort = new AbortController()
    const resp = await this.#sandbox._http.request('GET', processPath(this.#sandbox, `/${this.pid}/output`), {
      timeoutMs: STREAM_TIMEOUT_MS,
      signal: abort.signal,
    })
    this._follow(resp, abort, this.#seen)
  }

  /**
   * Wait for the process to end: `{ stdout, stderr, exitCode }` (output within the 1 MiB the
   * sandbox keeps per process). A stream that broke off is followed again first, from where
   * it stopped. An error a callback threw rejects it (the process runs on; a next wait()
   * follows on without delivering anything twice).
   */
  async wait() {
    for (let attempt = 0; ; attempt++) {
      try {
        if (!this.#following) await this._reattach()
        return await this.#following
      } catch (e) {
        // Followed again by the next wait(), e.g. after a resume.
        this.#following = undefined
        if (attempt > 0 || !(e instanceof APIConnectionError)) throw e
      }
    }
  }

  /** Stop following the process (it runs on; `process.connect(pid)` reattaches). */
  disconnect() {
    this.#abort?.abort()
    this.#following = undefined
  }

  /** Send a signal (default `SIGKILL`) to the process's group. */
  async kill(signal = 'SIGKILL') {
    await this.#sandbox.process.kill(this.pid, signal)
  }

  /** Write to the process's stdin (its terminal's keyboard, for a PTY). */
  async sendStdin(data) {
    await this.#sandbox._http.request('POST', processPath(this.#sandbox, `/${this.pid}/stdin`), {
      body: typeof data === 'string' ? new TextEncoder().encode(data) : data,
      headers: { 'Content-Type': 'application/octet-stream' },
    })
  }

  /** End the process's stdin (a PTY gets ^D). */
  async closeStdin() {
    await this.#sandbox._http.delete(processPath(this.#sandbox, `/${this.pid}/stdin`))
  }
}

/** A terminal in a sandbox: a `ProcessHandle` with `sendInput` and `resize`. */
export class PtyHandle extends ProcessHandle {
  #sandbox
  constructor(sandbox, info, onOutput) {
    super(sandbox, info, onOutput)
    this.#sandbox = sandbox
  }

  /** Type into the terminal. */
  sendInput(data) {
    return this.sendStdin(data)
  }

  /** A new terminal size; its programs get SIGWINCH. */
  async resize({ cols, rows }) {
    await this.#sandbox._http.post(processPath(this.#sandbox, `/${this.pid}/resize`), { cols, rows })
  }
}

/** Start `body` and follow it (or just learn its pid, without callbacks). */
async function start(sandbox, body, follow, Handle, onOutput) {
  const abort = new AbortController()
  const resp = await sandbox._http.request('POST', processPath(sandbox), { json: body, timeoutMs: STREAM_TIMEOUT_MS, signal: abort.signal })
  const reader = resp.body[Symbol.asyncIterator]()
  // The first frame is `Started`: read it off the front of the body.
  let buf = new Uint8Array(0)
  while (buf.length < 5 || buf.length < 5 + new DataView(buf.buffer, buf.byteOffset).getUint32(1)) {
    const { value, done } = await reader.next()
    if (done) throw new APIConnectionError('the process stream ended before it started')
    const joined = new Uint8Array(buf.length + value.length)
    joined.set(buf)
    joined.set(value, buf.length)
    buf = joined
  }
  const length = new DataView(buf.buffer, buf.byteOffset).getUint32(1)
  const handle = new Handle(sandbox, json(buf.subarray(5, 5 + length)), onOutput)
  if (!follow) {
    abort.abort()
    return handle
  }
  const rest = buf.subarray(5 + length)
  async function* remaining() {
    if (rest.length) yield rest
    for (;;) {
      const { value, done } = await reader.next()
      if (done) return
      yield value
    }
  }
  handle._follow({ body: remaining() }, abort)
  return handle
}

/** `onStdout` / `onStderr` as one output callback, decoding UTF-8 across chunks. */
function textCallbacks(opts) {
  const callbacks = { [STDOUT]: opts.onStdout, [STDERR]: opts.onStderr }
  const decoders = { [STDOUT]: new TextDecoder(), [STDERR]: new TextDecoder() }
  return (kind, bytes) => callbacks[kind]?.(decoders[kind].decode(bytes, { stream: true }))
}

/** `sandbox.process`'s background half (`exec` lives in sandbox.js). */
export const backgroundProcesses = {
  /**
   * Start `cmd` (a shell string, or an argv array) in the background: a `ProcessHandle`.
   * With `onStdout` / `onStderr` its output streams to them until it ends or `disconnect()`.
   */
  start(sandbox, cmd, opts = {}) {
    const follow = Boolean(opts.onStdout || opts.onStderr)
    return start(sandbox, commandBody(cmd, opts), follow, ProcessHandle, textCallbacks(opts))
  },

  /** The processes the sandbox keeps: `[{ pid, cmd, startedAtMs, pty, exitCode? }]`. */
  list(sandbox) {
    return sandbox._http.get(processPath(sandbox))
  },

  /** Reattach to process `pid` (from any client): its kept output, then live output. */
  async connect(sandbox, pid, opts = {}) {
    const handle = new ProcessHandle(sandbox, { pid }, textCallbacks(opts))
    await handle._reattach()
    return handle
  },

  async kill(sandbox, pid, signal = 'SIGKILL') {
    await sandbox._http.post(processPath(sandbox, `/${pid}/signal`), { signal })
  },
}

/** `sandbox.pty`: terminals in the sandbox. */
export class Pty {
  #sandbox
  constructor(sandbox) {
    this.#sandbox = sandbox
  }

  /**
   * A terminal of `cols` × `rows` (default 80 × 24) running `cmd` (default the login shell):
   * a `PtyHandle`; `onData` receives the terminal's output bytes (Uint8Array) as they come.
   */
  create(opts = {}) {
    const { cols = 80, rows = 24, cmd = 'command -v bash >/dev/null && exec bash -l; exec sh -l' } = opts
    const body = commandBody(cmd, { ...opts, pty: { cols, rows } })
    return start(this.#sandbox, body, true, PtyHandle, (_, bytes) => opts.onData?.(bytes))
  }

  /** Reattach to terminal `pid`: its kept output, then live output, to `onData`. */
  async connect(pid, opts = {}) {
    const handle = new PtyHandle(this.#sandbox, { pid }, (_, bytes) => opts.onData?.(bytes))
    await handle._reattach()
    return handle
  }
}

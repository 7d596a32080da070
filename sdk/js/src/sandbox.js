// A sandbox: one microVM, its files (`sandbox.fs`) and processes (`sandbox.process`).

import { HttpClient } from './http.js'
import { APIConnectionError, APITimeoutError, NotFoundError } from './errors.js'
import { commonDir, writeTar } from './tar.js'
import { readExecFrames } from './frames.js'
import { Desktop } from './desktop.js'
import { CodeInterpreter } from './code.js'
import { backgroundProcesses, commandBody, Pty } from './processes.js'

/** Creating the first sandbox of a template boots it and saves its snapshot: slow. */
export const CREATE_TIMEOUT_MS = 600_000
/** A command without `timeoutMs` may run this long before the call gives up. */
export const EXEC_TIMEOUT_MS = 3_600_000

const sandboxPath = (id, rest = '') => `/v1/sandboxes/${encodeURIComponent(id)}${rest}`

/** A 404 because the server has no such route (older server), not no such sandbox. */
const noRoute = (e) => e instanceof NotFoundError && String(e.serverMessage).startsWith('no route for')

function clientFor(opts) {
  return opts.http ?? new HttpClient({ apiKey: opts.apiKey, apiUrl: opts.apiUrl, timeoutMs: opts.requestTimeoutMs })
}

/** `sandbox.fs`: read and write files inside the microVM. */
export class Filesystem {
  #sandbox
  constructor(sandbox) {
    this.#sandbox = sandbox
  }

  /** Write a file (string or bytes); parents are created, the file replaced atomically. */
  async write(path, data, opts = {}) {
    const body = typeof data === 'string' ? new TextEncoder().encode(data) : data
    const query = { path }
    if (opts.mode !== undefined) query.mode = opts.mode.toString(8)
    const resp = await this.#sandbox._http.request('PUT', sandboxPath(this.#sandbox.sandboxId, '/files'), {
      query,
      body,
      headers: { 'Content-Type': 'application/octet-stream' },
    })
    await resp.body?.cancel()
  }

  /** A file's content as text (UTF-8). */
  async read(path) {
    return new TextDecoder().decode(await this.readBytes(path))
  }

  /** A file's exact bytes. */
  async readBytes(path) {
    const resp = await this.#sandbox._http.request('GET', sandboxPath(this.#sandbox.sandboxId, '/files'), { query: { path } })
    return new Uint8Array(await resp.arrayBuffer())
  }

  /** A directory's entries ({ name, path, type, size, mode }), sorted by name. */
  list(path) {
    return this.#sandbox._http.get(sandboxPath(this.#sandbox.sandboxId, '/files/list'), { query: { path } })
  }

  /** Delete a file, or a directory with everything in it. */
  async remove(path) {
    await this.#sandbox._http.delete(sandboxPath(this.#sandbox.sandboxId, '/files'), { query: { path } })
  }

  /** Create a directory and its parents. */
  async makeDir(path) {
    await this.#sandbox._http.post(sandboxPath(this.#sandbox.sandboxId, '/files/mkdir'), undefined, { query: { path } })
  }

  /** What is at `path` ({ name, path, type, size, mode, uid, gid, owner, group, mtimeMs,
   * symlinkTarget }): a link is described, not followed. NotFoundError when nothing is. */
  getInfo(path) {
    return this.#sandbox._http.get(sandboxPath(this.#sandbox.sandboxId, '/files/info'), { query: { path } })
  }

  /** Whether anything (a dangling link included) is at `path`. */
  async exists(path) {
    const answer = await this.#sandbox._http.get(sandboxPath(this.#sandbox.sandboxId, '/files/exists'), { query: { path } })
    return answer.exists
  }

  /** Move a file or directory (a file at `newPath` is replaced); resolves to what is there now. */
  rename(oldPath, newPath) {
    const query = { path: oldPath, to: newPath }
    return this.#sandbox._http.post(sandboxPath(this.#sandbox.sandboxId, '/files/rename'), undefined, { query })
  }

  /** Unpack a tar archive (bytes) into the directory `path`, created with its parents; an
   * entry that would land outside it is refused (InvalidArgumentError). */
  async writeArchive(path, archive) {
    const resp = await this.#sandbox._http.request('PUT', sandboxPath(this.#sandbox.sandboxId, '/files/archive'), {
      query: { path },
      body: archive,
      headers: { 'Content-Type': 'application/octet-stream' },
    })
    return resp.json()
  }

  /** Write several files in one call: `{ [absolutePath]: string | Uint8Array }` (parents
   * are created; each file gets `opts.mode`, default 0o644). They travel as one tar archive. */
  writeFiles(files, opts = {}) {
    const paths = Object.keys(files)
    if (!paths.length || !paths.every((p) => p.startsWith('/') && p.split('/').some(Boolean))) {
      throw new TypeError('writeFiles takes { absolutePath: content } with at least one file')
    }
    const dir = commonDir(paths)
    const entries = paths.map((p) => {
      const data = files[p]
      const name = p.split('/').filter(Boolean).slice(dir.split('/').filter(Boolean).length).join('/')
      return { name, data: typeof data === 'string' ? new TextEncoder().encode(data) : data, mode: opts.mode ?? 0o644 }
    })
    return this.writeArchive(dir, writeTar(entries))
  }

  /** The directory `path` and everything under it as a tar archive (links as links). */
  async downloadDir(path) {
    const resp = await this.#sandbox._http.request('GET', sandboxPath(this.#sandbox.sandboxId, '/files/archive'), {
      query: { path },
    })
    return new Uint8Array(await resp.arrayBuffer())
  }

  /**
   * Follow the changes in the directory `path` (and, `recursive`, every directory under
   * it): `onEvent` gets each event ({ type: 'create' | 'write' | 'remove' | 'rename' |
   * 'overflow', path, newPath?, isDir }) as it happens. Resolves, once the watch is in
   * place, to a handle whose `stop()` ends it. The watch ends by itself when the sandbox
   * pauses or goes away: `onExit` then gets the error (watch again after a resume).
   */
  async watch(path, { recursive = false, onEvent, onExit } = {}) {
    const controller = new AbortController()
    const p = sandboxPath(this.#sandbox.sandboxId, '/files/watch')
    const resp = await this.#sandbox._http.request('GET', p, { query: { path, recursive }, signal: controller.signal })
    let stopped = false
    // The server sends a blank line every 15 s of silence: a minute of nothing means it is gone.
    let silence
    const alive = () => {
      clearTimeout(silence)
      silence = setTimeout(() => controller.abort(new APITimeoutError(`GET ${p}: silent for ${WATCH_SILENCE_MS} ms`)), WATCH_SILENCE_MS)
    }
    const done = (async () => {
      let error = new APIConnectionError(`the watch of ${path} ended`)
      try {
        alive()
        for await (const line of ndjsonLines(resp.body)) {
          alive()
          if (line) await onEvent?.(JSON.parse(line))
        }
      } catch (e) {
        error = controller.signal.reason instanceof APITimeoutError ? controller.signal.reason : new APIConnectionError(`GET ${p}: ${e?.cause?.message ?? e?.message ?? e}`, { cause: e })
      } finally {
        clearTimeout(silence)
      }
      if (!stopped) await onExit?.(error)
    })()
    return {
      async stop() {
        stopped = true
        controller.abort()
        await done
      },
    }
  }
}

/** A watch's stream is silent at most this long (it carries a blank line every 15 s). */
export const WATCH_SILENCE_MS = 60_000

/** The lines of an NDJSON body, as they arrive (trimmed; blank ones included). */
async function* ndjsonLines(body) {
  const decoder = new TextDecoder()
  let buffered = ''
  for await (const chunk of body) {
    buffered += decoder.decode(chunk, { stream: true })
    let nl
    while ((nl = buffered.indexOf('\n')) !== -1) {
      yield buffered.slice(0, nl).trim()
      buffered = buffered.slice(nl + 1)
    }
  }
}

/** `sandbox.process`: run commands inside the microVM. */
export class Process {
  #sandbox
  constructor(sandbox) {
    this.#sandbox = sandbox
  }

  /**
   * Run `cmd` and wait for it: a string runs under `/bin/sh -c` (so `server &` starts it in
   * the background), an array is the exact argv. Resolves to `{ stdout, stderr, exitCode }`;
   * a non-zero exit code is returned, not thrown. `timeoutMs` kills the command (exit code
   * 124); `requestTimeoutMs` bounds the HTTP call itself. `onStdout` and `onStderr`
   * receive the output as it arrives (the result still has all of it).
   */
  async exec(cmd, opts = {}) {
    const body = commandBody(cmd, opts)
    if (opts.timeoutMs !== undefined) body.timeoutMs = opts.timeoutMs
    if (opts.stdin !== undefined) body.stdin = opts.stdin
    const timeoutMs = opts.requestTimeoutMs ?? (opts.timeoutMs !== undefined ? opts.timeoutMs + 60_000 : EXEC_TIMEOUT_MS)
    const path = sandboxPath(this.#sandbox.sandboxId, '/exec')
    if (!opts.onStdout && !opts.onStderr) return this.#sandbox._http.post(path, body, { timeoutMs })
    const resp = await this.#sandbox._http.request('POST', path, { query: { stream: true }, json: body, timeoutMs })
    return readExecFrames(resp.body, opts.onStdout, opts.onStderr)
  }

  /**
   * Start `cmd` in the background (it outlives this call and this client): a
   * `ProcessHandle` with `pid`, `wait()`, `kill(signal?)`, `sendStdin(data)`, `closeStdin()`
   * and `disconnect()`. `onStdout` / `onStderr` receive its output as it arrives.
   */
  start(cmd, opts = {}) {
    return backgroundProcesses.start(this.#sandbox, cmd, opts)
  }

  /** The processes the sandbox keeps (running, and the most recent ended ones). */
  list() {
    return backgroundProcesses.list(this.#sandbox)
  }

  /** Reattach to a background process by pid: its kept output (the newest 1 MiB), then live output. */
  connect(pid, opts = {}) {
    return backgroundProcesses.connect(this.#sandbox, pid, opts)
  }

  /** Send a signal (default SIGKILL) to process `pid`'s group. */
  kill(pid, signal = 'SIGKILL') {
    return backgroundProcesses.kill(this.#sandbox, pid, signal)
  }
}

/** A running (or paused) sandbox. Make one with `Sandbox.create`, `lizard.create` or `Sandbox.connect`. */
export class Sandbox extends CodeInterpreter {
  constructor(info, http) {
    super()
    this.info = info
    this._http = http
    this.fs = new Filesystem(this)
    this.process = new Process(this)
    this.pty = new Pty(this)
    this.desktop = new Desktop(this)
  }

  get sandboxId() {
    return this.info.sandboxId
  }
  get id() {
    return this.info.sandboxId
  }
  get template() {
    return this.info.template
  }
  get state() {
    return this.info.state
  }
  /** The token a private sandbox's URLs require (only on the object `create` returned). */
  get accessToken() {
    return this.info.accessToken
  }

  /**
   * Boot a new microVM from `template` in a project: `project` (id, slug or name) or
   * `projectId` (exact id). `lizardToken` is an API key placed inside as LIZARD_API_KEY for
   * the `lizard` CLI there; `volumeName` mounts that volume at /workspace. `resolution`
   * (`[width, height]`) restarts a `desktop` sandbox's screen at that size before resolving.
   * Network: `allowInternetAccess: false` cuts the sandbox off the internet except for the
   * CIDRs and domain names (`registry.example`, `*.example`) in `allowOut`; `denyOut` entries
   * are never reachable. `publicUrls: false` makes its URLs answer only to requests carrying
   * `sandbox.accessToken` (header `X-Lizard-Access-Token`, or the `lizardAccessToken` query
   * parameter).
   */
  static async create(template = 'base', opts = {}) {
    const http = clientFor(opts)
    const body = { template }
    const fields = {
      project: opts.project,
      projectId: opts.projectId,
      timeoutMs: opts.timeoutMs,
      env: opts.envs && Object.keys(opts.envs).length ? opts.envs : undefined,
      metadata: opts.metadata && Object.keys(opts.metadata).length ? opts.metadata : undefined,
      lizardToken: opts.lizardToken,
      volumeName: opts.volumeName,
      vcpus: opts.vcpus,
      memoryMib: opts.memoryMib,
      onTimeout: opts.onTimeout,
      allowInternetAccess: opts.allowInternetAccess,
      allowOut: opts.allowOut && opts.allowOut.length ? [...opts.allowOut] : undefined,
      denyOut: opts.denyOut && opts.denyOut.length ? [...opts.denyOut] : undefined,
      publicUrls: opts.publicUrls,
    }
    for (const [k, v] of Object.entries(fields)) if (v !== undefined) body[k] = v
    const timeoutMs = opts.requestTimeoutMs ?? Math.max(http.timeoutMs, CREATE_TIMEOUT_MS)
    const info = await http.post('/v1/sandboxes', body, { timeoutMs })
    const sandbox = new Sandbox(info, http)
    if (opts.resolution) await sandbox.desktop.setResolution(...opts.resolution)
    return sandbox
  }

  /** An existing sandbox by id, resumed if paused. Throws NotFoundError once killed or expired. */
  static async connect(sandboxId, opts = {}) {
    const http = clientFor(opts)
    let info
    try {
      info = await http.post(sandboxPath(sandboxId, '/connect'), undefined, { timeoutMs: Math.max(http.timeoutMs, CREATE_TIMEOUT_MS) })
    } catch (e) {
      if (!noRoute(e)) throw e
      info = await http.get(sandboxPath(sandboxId))
    }
    return new Sandbox(info, http)
  }

  /** The running sandboxes the key reaches (optionally of one project or workspace). */
  static list(opts = {}) {
    return clientFor(opts).get('/v1/sandboxes', { query: { projectId: opts.projectId, workspaceId: opts.workspaceId } })
  }

  /** The sandbox's current state (throws NotFoundError once it is gone). */
  async getInfo() {
    this.info = await this._http.get(sandboxPath(this.sandboxId))
    return this.info
  }

  async isRunning() {
    try {
      return (await this.getInfo()).state === 'running'
    } catch (e) {
      if (e instanceof NotFoundError) return false
      throw e
    }
  }

  /** Kill the sandbox `timeoutMs` from now (extends or shortens its lifetime). */
  async setTimeout(timeoutMs) {
    this.info = await this._http.post(sandboxPath(this.sandboxId, '/timeout'), { timeoutMs })
  }

  /** Stop the microVM and delete everything in it. */
  async kill() {
    await this._http.delete(sandboxPath(this.sandboxId))
  }

  /** Freeze the sandbox: memory and processes are saved and the VM stops. */
  async pause() {
    this.info = await this._http.post(sandboxPath(this.sandboxId, '/pause'), undefined, {
      timeoutMs: Math.max(this._http.timeoutMs, CREATE_TIMEOUT_MS),
    })
  }

  /** Start a paused sandbox again where it stopped. */
  async resume() {
    this.info = await this._http.post(sandboxPath(this.sandboxId, '/resume'), undefined, {
      timeoutMs: Math.max(this._http.timeoutMs, CREATE_TIMEOUT_MS),
    })
  }

  /** `count` copies of this running sandbox (processes, memory and files), each with its own id. */
  async fork(count = 1) {
    const infos = await this._http.post(sandboxPath(this.sandboxId, '/fork'), { count }, {
      timeoutMs: Math.max(this._http.timeoutMs, CREATE_TIMEOUT_MS),
    })
    return infos.map((info) => new Sandbox(info, this._http))
  }

  /**
   * Resolve once something listens on TCP `port` inside the sandbox (the sandbox's agent
   * watches its socket table); `TimedOutError` after `timeoutMs` (default 60 s, at most 10 min).
   */
  async waitForPort(port, opts = {}) {
    const timeoutMs = opts.timeoutMs ?? 60_000
    await this._http.get(sandboxPath(this.sandboxId, `/ports/${port}/wait`), {
      query: { timeoutMs },
      timeoutMs: timeoutMs + 60_000,
    })
  }

  /**
   * A URL to `port` that works without the sandbox's access token for `expiresInSeconds`
   * (default 3600, at most a week), for a sandbox created with `publicUrls: false` (a
   * public sandbox's URL comes back without a proof). Its first request sets a cookie for
   * that host, so a page's own later requests work too. `urlPort`: the proxy's port when
   * it is not the scheme's default (a laptop server's is 7172).
   */
  async getSignedUrl(port, { expiresInSeconds = 3600, path = '/', scheme = 'http', urlPort } = {}) {
    const signed = await this._http.post(sandboxPath(this.sandboxId, '/signed-urls'), { port, expiresInSeconds })
    const origin = `${scheme}://${signed.host}${urlPort !== undefined ? `:${urlPort}` : ''}`
    if (!signed.query) return origin + path
    return `${origin}${path}${path.includes('?') ? '&' : '?'}${signed.query}`
  }

  /**
   * The TCP ports something listens on in the sandbox, by port (the platform's own left
   * out): `{ port, address, pid?, cmd? }`; `ConflictError` while it is paused.
   */
  async listPorts() {
    return this._http.get(sandboxPath(this.sandboxId, '/ports'))
  }

  /** The public host serving `port` inside the sandbox: `{sandboxId}-{port}.sandbox.{region}.{domain}`. */
  getHost(port) {
    if (!this.info.domain) throw new Error('the server did not say which domain serves this sandbox')
    return `${this.sandboxId}-${port}.${this.info.domain}`
  }
}

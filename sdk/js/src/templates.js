// `lizard.templates`: list, read and delete templates, follow and cancel their builds, and
// push a directory as a template (what `lizard push` does).

import fs from 'node:fs/promises'
import { APIConnectionError, APITimeoutError, BuildError } from './errors.js'
import { readRecipe, scan } from './context.js'

/** A whole event stream may last this long (a build is bounded by its own time limit). */
export const EVENTS_TIMEOUT_MS = 4 * 3_600_000
/** How often a push whose event stream broke asks for the build's status instead. */
export const POLL_INTERVAL_MS = 2_000
/** An upload of one file may take this long. */
const UPLOAD_TIMEOUT_MS = 600_000

const seg = encodeURIComponent
const templatePath = (name, rest = '') => `/v1/templates/${seg(name)}${rest}`
const buildPath = (name, buildId, rest = '') => templatePath(name, `/builds/${seg(buildId)}${rest}`)
const FINAL = new Set(['ready', 'failed', 'cancelled'])
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

/**
 * `lizard.templates`: templates are built-in (`base`, `code-interpreter-v1`, visible to
 * every key) or pushed by a workspace. A client with a project works in that project's
 * workspace; `{ workspace }` (id, slug or name) picks one explicitly; a key that reaches a
 * single workspace needs neither.
 */
export class Templates {
  #client
  constructor(client) {
    this.#client = client
  }

  get #http() {
    return this.#client.platform
  }

  async #scope(workspace) {
    if (workspace !== undefined) return { workspace }
    if (this.#client.project) return { project: await this.#client.projectId() }
    return {}
  }

  /** The built-ins, then the templates of the workspace (all the key reaches without one). */
  async list({ workspace } = {}) {
    return this.#http.get('/v1/templates', { query: await this.#scope(workspace) })
  }

  /** A template by name; NotFoundError if there is none the key reaches. */
  async get(name, { workspace } = {}) {
    return this.#http.get(templatePath(name), { query: await this.#scope(workspace) })
  }

  /** Delete a pushed template and its builds: ConflictError while a sandbox uses it, PermissionDeniedError for a built-in. */
  async delete(name, { workspace } = {}) {
    await this.#http.delete(templatePath(name), { query: await this.#scope(workspace) })
  }

  /** A build's status, steps (cached or not), failure and log. */
  async getBuild(name, buildId, { workspace } = {}) {
    return this.#http.get(buildPath(name, buildId), { query: await this.#scope(workspace) })
  }

  /** Stop a queued or running build (ConflictError once it has finished). */
  async cancelBuild(name, buildId, { workspace } = {}) {
    await this.#http.delete(buildPath(name, buildId), { query: await this.#scope(workspace) })
  }

  /**
   * A build's events from the first, as they happen, ending after `done` (an async
   * iterable). APIConnectionError if the stream breaks before `done`; `timeoutMs` bounds the
   * whole stream.
   */
  async *events(name, buildId, { workspace, timeoutMs = EVENTS_TIMEOUT_MS } = {}) {
    const p = buildPath(name, buildId, '/events')
    const resp = await this.#http.request('GET', p, { query: await this.#scope(workspace), timeoutMs })
    const decoder = new TextDecoder()
    const parse = (line) => {
      try {
        return JSON.parse(line)
      } catch (e) {
        throw new APIConnectionError(`GET ${p}: a line that is not JSON: ${e.message}`, { cause: e })
      }
    }
    let buffered = ''
    try {
      for await (const chunk of resp.body) {
        buffered += decoder.decode(chunk, { stream: true })
        let nl
        while ((nl = buffered.indexOf('\n')) !== -1) {
          const line = buffered.slice(0, nl).trim()
          buffered = buffered.slice(nl + 1)
          if (!line) continue
          const event = parse(line)
          yield event
          if (event.type === 'done') return
        }
      }
    } catch (e) {
      if (e instanceof APIConnectionError) throw e
      if (e?.name === 'TimeoutError' || e?.name === 'AbortError') {
        throw new APITimeoutError(`GET ${p}: timed out after ${timeoutMs} ms`, { cause: e })
      }
      throw new APIConnectionError(`GET ${p}: ${e?.cause?.message ?? e?.message ?? e}`, { cause: e })
    } finally {
      await resp.body?.cancel().catch(() => {})
    }
    const last = (buffered + decoder.decode()).trim()
    if (last) {
      const event = parse(last)
      yield event
      if (event.type === 'done') return
    }
    throw new APIConnectionError(`GET ${p}: the stream ended before the build did`)
  }

  /**
   * Build a template from a directory, as `lizard push` does: read its
   * lizard.template.toml (or Dockerfile, which needs `name`; `name` also overrides the
   * recipe's), upload the files the server lacks (`.lizardignore` leaves paths out), start
   * the build and follow it, giving each event to `onEvent`. Resolves to the finished build;
   * rejects with BuildError (`code`, `step`, `outputTail`) when it failed or was cancelled,
   * and with APITimeoutError after `timeoutMs` (the build goes on: cancel it with
   * `cancelBuild`).
   */
  async push(dir = '.', { name, onEvent, workspace, timeoutMs } = {}) {
    const deadline = timeoutMs === undefined ? undefined : Date.now() + timeoutMs
    const recipe = await readRecipe(dir, name)
    const manifest = await scan(dir)
    const scope = await this.#scope(workspace)
    await this._uploadMissing(manifest, scope)
    const body = { recipe: recipe.text, format: recipe.format, files: manifest.entries, ...scope }
    if (name) body.name = name
    // Not retried on a broken connection: a second POST would start a second build.
    const build = await this.#http.post('/v1/templates', body)
    const final = await this.#follow(build, scope, onEvent, deadline)
    if (final.status !== 'ready') throw new BuildError(final)
    return final
  }

  /** Upload what the server lacks of a scanned directory (also what `lizard.services` deploys). @internal */
  async _uploadMissing(manifest, scope) {
    const hashes = [...manifest.filesByHash.keys()].sort()
    if (!hashes.length) return
    const { missing } = await this.#http.post('/v1/templates/blobs/missing', { sha256: hashes }, { query: scope })
    for (const sha256 of missing) {
      const source = manifest.filesByHash.get(sha256)
      if (source === undefined) throw new APIConnectionError(`the server asked for ${sha256}, which the push does not have`)
      // PUT is idempotent: retried like any other by the HTTP client.
      const resp = await this.#http.request('PUT', `/v1/templates/blobs/${sha256}`, {
        query: scope,
        body: await fs.readFile(source),
        headers: { 'Content-Type': 'application/octet-stream' },
        timeoutMs: Math.max(this.#http.timeoutMs, UPLOAD_TIMEOUT_MS),
      })
      await resp.body?.cancel()
    }
  }

  /**
   * Read the build's events until `done`, then its final status. A broken stream falls back
   * to polling the status (the events would start over from the first).
   */
  async #follow(build, scope, onEvent, deadline) {
    const { template, buildId } = build
    const timeoutMs = deadline === undefined ? EVENTS_TIMEOUT_MS : Math.max(deadline - Date.now(), 1000)
    try {
      for await (const event of this.events(template, buildId, { workspace: scope.workspace, timeoutMs })) onEvent?.(event)
    } catch (e) {
      if (!(e instanceof APIConnectionError)) throw e
      // The status says how it ended (or that it still runs).
    }
    for (;;) {
      const info = await this.#http.get(buildPath(template, buildId), { query: scope })
      if (FINAL.has(info.status)) return info
      if (deadline !== undefined && Date.now() >= deadline) {
        throw new APITimeoutError(`build ${buildId} of ${template} still running after the timeout`)
      }
      await sleep(POLL_INTERVAL_MS)
    }
  }
}

// `lizard.services`: deploy a directory as a persistent service (what `lizard up` does),
// list, read, roll back and delete services, and read their logs.

import { APITimeoutError, DeployError, NotFoundError } from './errors.js'
import { scan } from './context.js'

/** How often a deploy asks how its version is doing. */
export const POLL_INTERVAL_MS = 500
/** How long a deploy waits for its version to go live or fail, by default. */
export const DEPLOY_TIMEOUT_MS = 900_000

const servicePath = (name, rest = '') => `/v1/services/${encodeURIComponent(name)}${rest}`
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

/**
 * `lizard.services`: services of the client's project. A deploy uploads the directory's
 * files the server lacks (by content hash; `.gitignore` and `.lizardignore` honoured, `.git`
 * left out), then creates the service or deploys a new version; the server builds it
 * (base template + files + `build` step) and moves the traffic once its instances pass
 * their health checks.
 */
export class Services {
  #client
  constructor(client) {
    this.#client = client
  }

  get #http() {
    return this.#client.platform
  }

  /**
   * Deploy `dir` as the service `name` (new, or a new version of the project's service of
   * that name). `health` ({ path, intervalMs, timeoutMs, graceMs }) and `scale` ({ min,
   * max, idle: 'pause' | 'keep', idleAfterMs }) as the API takes them. With `wait` (the
   * default), resolves once the version is live and rejects with DeployError when it failed.
   */
  async deploy(dir, name, { cmd, port, template = 'base', build, env, health, scale, wait = true, timeoutMs = DEPLOY_TIMEOUT_MS } = {}) {
    const spec = { template, cmd, port }
    if (build) spec.build = build
    if (env) spec.env = env
    if (health) spec.health = health
    if (scale) spec.scale = scale
    const projectId = await this.#client.projectId()
    const manifest = await scan(dir, { app: true })
    await this.#client.templates._uploadMissing(manifest, { project: projectId })
    let exists = true
    try {
      await this.get(name)
    } catch (e) {
      if (!(e instanceof NotFoundError)) throw e
      exists = false
    }
    // Not retried on a broken connection: a second POST would start a second deploy.
    const info = exists
      ? await this.#http.post(servicePath(name, '/versions'), { spec, files: manifest.entries })
      : await this.#http.post('/v1/services', { name, projectId, spec, files: manifest.entries })
    const version = Math.max(...info.versions.map((v) => v.version))
    return wait ? this.#settle(name, version, timeoutMs) : info
  }

  async #settle(name, version, timeoutMs) {
    const deadline = Date.now() + timeoutMs
    for (;;) {
      const info = await this.get(name)
      const status = info.versions.find((v) => v.version === version)?.status
      if (status === 'live') return info
      if (status !== 'building' && status !== 'starting') throw new DeployError(info, version)
      if (Date.now() >= deadline) throw new APITimeoutError(`version ${version} of ${name} still deploying after ${timeoutMs} ms`)
      await sleep(POLL_INTERVAL_MS)
    }
  }

  /** The services of the client's project (all the key reaches without one). */
  async list() {
    const query = this.#client.project ? { projectId: await this.#client.projectId() } : {}
    return this.#http.get('/v1/services', { query })
  }

  /** A service: `url`, `status`, `liveVersion`, `versions`, `instances`; NotFoundError outside the key's reach. */
  async get(name) {
    return this.#http.get(servicePath(name))
  }

  /** Back to `version` (default: the one live before), once it is live again. */
  async rollback(name, { version, timeoutMs = DEPLOY_TIMEOUT_MS } = {}) {
    const info = await this.#http.post(servicePath(name, '/rollback'), version === undefined ? {} : { version })
    const target = info.versions.find((v) => v.status === 'starting')?.version
    return target === undefined ? info : this.#settle(name, target, timeoutMs)
  }

  /** Stop every instance, delete every version's layer, free the name. */
  async delete(name) {
    await this.#http.delete(servicePath(name))
  }

  /** The last `tail` bytes of each running instance's output: `{ sandboxId, version, data }` each. */
  async logs(name, { tail } = {}) {
    const query = tail === undefined ? {} : { tail }
    const resp = await this.#http.request('GET', servicePath(name, '/logs'), { query })
    const text = await resp.text()
    return text.split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l))
  }
}

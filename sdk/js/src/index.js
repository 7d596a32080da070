// @lizard-build/sdk: `Lizard`, a client pinned to one project, with the account's namespaces.

import { HttpClient } from './http.js'
import { Sandbox } from './sandbox.js'
import { ConflictError, NotFoundError } from './errors.js'
import { Templates } from './templates.js'
import { Services } from './services.js'

export * from './errors.js'
export { HttpClient, requestObservers } from './http.js'
export { Sandbox, Filesystem, Process } from './sandbox.js'
export { ProcessHandle, PtyHandle, Pty } from './processes.js'
export { Desktop, DesktopStream, DesktopError } from './desktop.js'
export { CodeInterpreter, Execution, ExecutionError, Result, readCodeEvents } from './code.js'
export { Templates } from './templates.js'
export { Services } from './services.js'

const seg = encodeURIComponent

/** `lizard.workspaces`: the units of isolation between your users. */
export class Workspaces {
  #http
  constructor(http) {
    this.#http = http
  }
  list() {
    return this.#http.get('/v1/workspaces')
  }
  create({ name }) {
    return this.#http.post('/v1/workspaces', { name })
  }
  /** A workspace by id, slug or name; NotFoundError when there is none. */
  find(nameOrSlugOrId) {
    return this.#http.get(`/v1/workspaces/${seg(nameOrSlugOrId)}`)
  }
  /** Delete an empty workspace; `{ force: true }` deletes everything in it, irreversibly. */
  async delete(id, { force } = {}) {
    await this.#http.delete(`/v1/workspaces/${seg(id)}`, { query: force ? { force: true } : {} })
  }
}

/** `lizard.projects`: what sandboxes and volumes live in and are billed to. */
export class Projects {
  #http
  constructor(http) {
    this.#http = http
  }
  list({ workspaceId } = {}) {
    return this.#http.get('/v1/projects', { query: { workspaceId } })
  }
  /** A project by id, slug or name. */
  get(id) {
    return this.#http.get(`/v1/projects/${seg(id)}`)
  }
  create({ workspaceId, name }) {
    return this.#http.post('/v1/projects', { workspaceId, name })
  }
  update(id, { name }) {
    return this.#http.patch(`/v1/projects/${seg(id)}`, { name })
  }
  async delete(id) {
    await this.#http.delete(`/v1/projects/${seg(id)}`)
  }
}

/** `lizard.apiKeys`: keys, optionally scoped to workspaces and/or projects. */
export class ApiKeys {
  #http
  constructor(http) {
    this.#http = http
  }
  list() {
    return this.#http.get('/v1/api-keys')
  }
  /** A new key; `key.key` is the secret, returned this once. No scope = everything the caller reaches. */
  create({ name, workspaces, projects }) {
    const body = { name }
    if (workspaces !== undefined) body.workspaces = workspaces
    if (projects !== undefined) body.projects = projects
    return this.#http.post('/v1/api-keys', body)
  }
  async delete(id) {
    await this.#http.delete(`/v1/api-keys/${seg(id)}`)
  }
}

/** `lizard.regions`: where sandboxes and volumes can be placed. */
export class Regions {
  #http
  constructor(http) {
    this.#http = http
  }
  list() {
    return this.#http.get('/v1/regions')
  }
}

/** `lizard.volumes`: disks that outlive sandboxes, mounted at /workspace; named within the client's project. */
export class Volumes {
  #client
  constructor(client) {
    this.#client = client
  }
  async #project() {
    return { projectId: await this.#client.projectId() }
  }
  /** Create a volume; ConflictError if the name is taken in the project. */
  async create(name, { sizeGb, region } = {}) {
    const body = { name, ...(await this.#project()) }
    if (sizeGb !== undefined) body.sizeGb = sizeGb
    if (region !== undefined) body.region = region
    return this.#client.platform.post('/v1/volumes', body)
  }
  async get(nameOrId) {
    return this.#client.platform.get(`/v1/volumes/${seg(nameOrId)}`, { query: await this.#project() })
  }
  /** The volume with this name, created if absent. */
  async getOrCreate(name, opts = {}) {
    try {
      return await this.get(name)
    } catch (e) {
      if (!(e instanceof NotFoundError)) throw e
    }
    try {
      return await this.create(name, opts)
    } catch (e) {
      if (!(e instanceof ConflictError)) throw e
      return this.get(name) // created by someone else between the two calls
    }
  }
  async list() {
    return this.#client.platform.get('/v1/volumes', { query: await this.#project() })
  }
  async delete(nameOrId) {
    await this.#client.platform.delete(`/v1/volumes/${seg(nameOrId)}`, { query: await this.#project() })
  }
}

/** `lizard.billing`: balance and ledger. Unscoped keys only (else 403 ACCOUNT_SCOPE_REQUIRED). */
export class Billing {
  #http
  constructor(http) {
    this.#http = http
  }
  balance() {
    return this.#http.get('/v1/billing/balance')
  }
  transactions({ limit, cursor, includeUsage } = {}) {
    return this.#http.get('/v1/billing/transactions', { query: { limit, cursor, includeUsage } })
  }
  /** Credits and usage per UTC period (`granularity`: 'month' | 'day'). */
  summary({ granularity, periods } = {}) {
    return this.#http.get('/v1/billing/summary', { query: { granularity, periods } })
  }
  live() {
    return this.#http.get('/v1/billing/live')
  }
}

/** `lizard.metrics`: usage within the key's scope (what you bill a user from). */
export class Metrics {
  #http
  constructor(http) {
    this.#http = http
  }
  /** Sandbox-seconds, cost and running count per project and workspace the key reaches. */
  get({ workspaceId, projectId, from, to } = {}) {
    return this.#http.get('/v1/metrics', { query: { workspaceId, projectId, from, to } })
  }
}

/**
 * A client pinned to one project (id, slug or name: resolved to an id on first use and
 * cached). `apiKey` defaults to LIZARD_API_KEY, `apiUrl` to LIZARD_API_URL. `timeoutMs`
 * bounds each call; calls that cannot run twice (idempotent ones, and creates and execs,
 * which carry an Idempotency-Key) and 429 answers are retried up to `maxRetries` times
 * with backoff.
 */
export class Lizard {
  #projectId
  constructor(opts = {}) {
    this.project = opts.project
    this.platform = new HttpClient(opts)
    this.workspaces = new Workspaces(this.platform)
    this.projects = new Projects(this.platform)
    this.apiKeys = new ApiKeys(this.platform)
    this.regions = new Regions(this.platform)
    this.volumes = new Volumes(this)
    this.billing = new Billing(this.platform)
    this.metrics = new Metrics(this.platform)
    this.templates = new Templates(this)
    this.services = new Services(this)
  }

  /** The pinned project's id (looked up once). */
  async projectId() {
    if (this.#projectId === undefined) {
      if (!this.project) throw new Error('this client has no project: pass new Lizard({ project })')
      this.#projectId = (await this.projects.get(this.project)).id
    }
    return this.#projectId
  }

  /** Boot a sandbox from `template` in the client's project. */
  async create(template = 'base', opts = {}) {
    return Sandbox.create(template, { ...opts, project: undefined, projectId: await this.projectId(), http: this.platform })
  }

  connect(sandboxId) {
    return Sandbox.connect(sandboxId, { http: this.platform })
  }

  /** Running sandboxes of the client's project (all the key reaches without one). */
  async list() {
    return Sandbox.list({ projectId: this.project ? await this.projectId() : undefined, http: this.platform })
  }

  /** The account behind the key; a scoped key sees its identity and scopes only. */
  whoami() {
    return this.platform.get('/v1/whoami')
  }
}

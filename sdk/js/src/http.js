// The HTTP client under every call: Node's built-in fetch (undici keeps connections alive
// and reuses them), a timeout on every request, and retries with exponential backoff where a
// retry cannot do anything twice.
//
// A call is safe to retry when its method is idempotent (GET, HEAD, PUT, DELETE, OPTIONS) or
// it carries an Idempotency-Key — which the client adds to the calls that create or run
// something (create sandbox, exec, fork, create volume), one key per call, the same on each
// of its retries, so that the server answers a retry with the first answer instead of doing
// the work again. Safe calls are retried on network failures, timeouts and 502/503/504;
// every call on 429 (refused before anything was done, after its Retry-After); a keyed call
// also on 409 with Retry-After (its first attempt is still being served). A replayed answer
// (Idempotency-Replayed) is final.

import { errorFor, APIConnectionError, APITimeoutError } from './errors.js'

export const DEFAULT_API_URL = 'http://127.0.0.1:7171'
export const DEFAULT_TIMEOUT_MS = 60_000
export const DEFAULT_MAX_RETRIES = 3

import { randomUUID } from 'node:crypto'

const IDEMPOTENT = new Set(['GET', 'HEAD', 'PUT', 'DELETE', 'OPTIONS'])
/** Retried whatever the call: the server refused before doing anything. */
const RETRY_ANY = new Set([429])
/** Retried for calls safe to repeat (idempotent method or idempotency key). */
const RETRY_SAFE = new Set([502, 503, 504])

/** The header that makes a POST safe to retry. */
export const IDEMPOTENCY_HEADER = 'Idempotency-Key'
/** POST routes that create or run something: each call gets its own idempotency key. */
const KEYED_POSTS = [/^\/v1\/sandboxes$/, /^\/v1\/sandboxes\/[^/]+\/(exec|fork)$/, /^\/v1\/volumes$/]

/** `headers` plus a fresh Idempotency-Key when `method path` creates or runs something and
 * the caller did not set one. */
export function withIdempotencyKey(method, path, headers = {}) {
  const out = { ...headers }
  const keyed = Object.keys(out).some((k) => k.toLowerCase() === IDEMPOTENCY_HEADER.toLowerCase())
  if (method === 'POST' && !keyed && KEYED_POSTS.some((p) => p.test(path))) {
    out[IDEMPOTENCY_HEADER] = randomUUID()
  }
  return out
}

/** Whether an error answer may be retried (see the top of this file). */
function retryable(resp, idempotent, keyed) {
  if (resp.headers.get('idempotency-replayed')) return false
  const inProgress = keyed && resp.status === 409 && resp.headers.has('retry-after')
  return RETRY_ANY.has(resp.status) || (idempotent && RETRY_SAFE.has(resp.status)) || inProgress
}

/** A signal that aborts after `ms` (without keeping Node running) or when `also` aborts. */
function deadline(ms, also) {
  if (!also) return AbortSignal.timeout(ms)
  const ctl = new AbortController()
  const timer = setTimeout(() => ctl.abort(new DOMException('timed out', 'TimeoutError')), ms)
  timer.unref?.()
  if (also.aborted) ctl.abort(also.reason)
  also.addEventListener('abort', () => ctl.abort(also.reason), { once: true })
  return ctl.signal
}

/** Observers of every request any client sends; the OpenAPI contract tests use them. */
export const requestObservers = []

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

function backoffMs(attempt) {
  const base = Math.min(250 * 2 ** (attempt - 1), 8000)
  return base * (0.75 + Math.random() * 0.5)
}

function retryAfterMs(resp) {
  const v = resp.headers.get('retry-after')
  const s = v ? Number(v) : NaN
  return Number.isFinite(s) ? Math.min(s, 30) * 1000 : undefined
}

function env(name) {
  return typeof process !== 'undefined' ? process.env[name] : undefined
}

/**
 * The raw HTTP client (`lizard.platform`): JSON in, JSON out, typed errors.
 * `apiKey` defaults to LIZARD_API_KEY, `apiUrl` to LIZARD_API_URL (then http://127.0.0.1:7171).
 */
export class HttpClient {
  constructor(opts = {}) {
    this.apiKey = opts.apiKey ?? env('LIZARD_API_KEY')
    this.apiUrl = (opts.apiUrl ?? env('LIZARD_API_URL') ?? DEFAULT_API_URL).replace(/\/+$/, '')
    this.timeoutMs = opts.timeoutMs ?? DEFAULT_TIMEOUT_MS
    this.maxRetries = opts.maxRetries ?? DEFAULT_MAX_RETRIES
  }

  /** Send one request (retried where safe); throws the typed error on 4xx/5xx. `opts.signal`
   * aborts it (and the reading of its body). */
  async request(method, path, opts = {}) {
    method = method.toUpperCase()
    const query = {}
    for (const [k, v] of Object.entries(opts.query ?? {})) {
      if (v !== undefined && v !== null) query[k] = String(v)
    }
    for (const observe of requestObservers) observe(method, path, query, opts.json, this.apiUrl)
    const qs = new URLSearchParams(query).toString()
    const url = `${this.apiUrl}${path}${qs ? `?${qs}` : ''}`
    const headers = withIdempotencyKey(method, path, { 'User-Agent': 'lizard-sdk-js/0.1.0', ...(opts.headers ?? {}) })
    const keyed = Object.keys(headers).some((k) => k.toLowerCase() === IDEMPOTENCY_HEADER.toLowerCase())
    if (this.apiKey) headers['X-API-Key'] = this.apiKey
    let body = opts.body
    if (opts.json !== undefined) {
      headers['Content-Type'] = 'application/json'
      body = JSON.stringify(opts.json)
    }
    const timeoutMs = opts.timeoutMs ?? this.timeoutMs
    const idempotent = IDEMPOTENT.has(method) || keyed
    for (let attempt = 0; ; attempt++) {
      const canRetry = attempt < this.maxRetries
      let resp
      try {
        // A caller's own signal without a timeout of its own (a watch, which lives until
        // stopped) replaces the timeout; with both, whichever comes first ends the call.
        const signal = opts.signal && opts.timeoutMs === undefined ? opts.signal : deadline(timeoutMs, opts.signal)
        resp = await fetch(url, { method, headers, body, signal })
      } catch (e) {
        if (idempotent && canRetry) {
          await sleep(backoffMs(attempt + 1))
          continue
        }
        if (e?.name === 'TimeoutError' || e?.name === 'AbortError') {
          throw new APITimeoutError(`${method} ${path}: timed out after ${timeoutMs} ms`, { cause: e })
        }
        throw new APIConnectionError(`${method} ${path}: ${e?.cause?.message ?? e?.message ?? e}`, { cause: e })
      }
      if (resp.status < 400) return resp
      if (retryable(resp, idempotent, keyed) && canRetry) {
        await resp.body?.cancel()
        await sleep(retryAfterMs(resp) ?? backoffMs(attempt + 1))
        continue
      }
      throw await errorFromResponse(resp)
    }
  }

  async #json(method, path, opts) {
    const resp = await this.request(method, path, opts)
    const text = await resp.text()
    return resp.status === 204 || text === '' ? undefined : JSON.parse(text)
  }

  get(path, opts = {}) {
    return this.#json('GET', path, opts)
  }
  post(path, json, opts = {}) {
    return this.#json('POST', path, { ...opts, json })
  }
  put(path, json, opts = {}) {
    return this.#json('PUT', path, { ...opts, json })
  }
  patch(path, json, opts = {}) {
    return this.#json('PATCH', path, { ...opts, json })
  }
  delete(path, opts = {}) {
    return this.#json('DELETE', path, opts)
  }
}

async function errorFromResponse(resp) {
  const text = await resp.text().catch(() => '')
  let code
  let message = text || resp.statusText
  try {
    const body = JSON.parse(text)
    if (body && typeof body === 'object') {
      code = body.code
      message = body.message ?? message
    }
  } catch {
    // not JSON: keep the text
  }
  return errorFor(resp.status, code, message)
}

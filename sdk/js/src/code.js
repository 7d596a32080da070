// Stateful code execution in the `interpreter` template: `sandbox.runCode` and code
// contexts, named after the best-known code-interpreter SDK so code moves over unchanged.
//
// An execution streams from the server as the code runs (`onStdout`, `onStderr`,
// `onResult`, `onError` see each piece as it arrives) and resolves to the whole
// `Execution`. An exception raised by the code is `execution.error`, not a rejection; so
// is a timeout (`TimeoutError`: the context was interrupted and keeps its state) and a dead
// interpreter (`DeadKernelError`: the next run starts a new one).

import { APIConnectionError, APITimeoutError } from './errors.js'

/** `runCode` without `timeoutMs` interrupts the code after this long (the server's default). */
export const DEFAULT_CODE_TIMEOUT_MS = 300_000
/** How long the HTTP call may outlive the code's own timeout. */
const REQUEST_GRACE_MS = 90_000

/** MIME type → `Result` field. */
const MIME_FIELDS = {
  'text/plain': 'text',
  'text/html': 'html',
  'text/markdown': 'markdown',
  'image/svg+xml': 'svg',
  'image/png': 'png',
  'image/jpeg': 'jpeg',
  'application/pdf': 'pdf',
  'text/latex': 'latex',
  'application/json': 'json',
  'application/javascript': 'javascript',
}

/**
 * Something the code displayed: the cell's value (`isMainResult`) or a `display()`/figure.
 * Each MIME type is a field (`png`, `jpeg` base64; `json` decoded); others are in `extra`;
 * the whole bundle is `data`.
 */
export class Result {
  constructor(data, isMainResult) {
    this.isMainResult = Boolean(isMainResult)
    this.extra = {}
    Object.defineProperty(this, 'data', { value: { ...data }, enumerable: false })
    for (const [mime, value] of Object.entries(data ?? {})) {
      const name = MIME_FIELDS[mime]
      if (name === undefined) this.extra[mime] = value
      else this[name] = Array.isArray(value) && name !== 'json' ? value.join('') : value
    }
  }

  /** The names of the formats this result has (`text`, `png`, …). */
  formats() {
    return [...Object.values(MIME_FIELDS).filter((n) => this[n] !== undefined), ...Object.keys(this.extra)]
  }

  toString() {
    return this.text ?? ''
  }
}

export class ExecutionError {
  constructor(name, value, traceback) {
    this.name = name
    this.value = value
    this.traceback = traceback
  }
}

export class Execution {
  constructor() {
    this.results = []
    this.logs = { stdout: [], stderr: [] }
    this.error = undefined
    this.executionCount = undefined
  }

  /** The main result's text (the value of the cell's last expression), if any. */
  get text() {
    return this.results.find((r) => r.isMainResult)?.text
  }
}

const codePath = (sandboxId, rest = '') => `/v1/sandboxes/${encodeURIComponent(sandboxId)}/code${rest}`
const contextId = (context) => (typeof context === 'string' ? context : context.id)

/** Fold an execution's NDJSON lines into an `Execution`, calling back as they come. */
export async function readCodeEvents(body, { onStdout, onStderr, onResult, onError } = {}) {
  const execution = new Execution()
  const decoder = new TextDecoder()
  let buffered = ''
  const take = (line) => {
    let event
    try {
      event = JSON.parse(line)
    } catch (e) {
      throw new APIConnectionError(`runCode: a line that is not JSON: ${e.message}`, { cause: e })
    }
    switch (event.type) {
      case 'stdout':
        execution.logs.stdout.push(event.text)
        onStdout?.(event.text)
        break
      case 'stderr':
        execution.logs.stderr.push(event.text)
        onStderr?.(event.text)
        break
      case 'result': {
        const result = new Result(event.data, event.isMainResult)
        execution.results.push(result)
        onResult?.(result)
        break
      }
      case 'error':
        execution.error = new ExecutionError(event.name, event.value, event.traceback ?? '')
        onError?.(execution.error)
        break
      case 'end':
        execution.executionCount = event.executionCount
        return true
    }
    return false
  }
  for await (const chunk of body) {
    buffered += decoder.decode(chunk, { stream: true })
    let nl
    while ((nl = buffered.indexOf('\n')) !== -1) {
      const line = buffered.slice(0, nl).trim()
      buffered = buffered.slice(nl + 1)
      if (line && take(line)) return execution
    }
  }
  throw new APIConnectionError('runCode: the stream ended before the execution did')
}

/** `runCode` and the code-context methods of a `Sandbox` (its base class). */
export class CodeInterpreter {
  /**
   * Run `code` in a context: `context`, or `language`'s default one ('python' — an
   * IPython kernel —, 'javascript' or 'bash'; default python), not both. `envs` hold for
   * this run only; `timeoutMs` (default 300 000) interrupts the code; `requestTimeoutMs`
   * bounds the HTTP call.
   */
  async runCode(code, opts = {}) {
    const body = { code }
    if (opts.language !== undefined) body.language = opts.language
    if (opts.context !== undefined) body.contextId = contextId(opts.context)
    if (opts.envs && Object.keys(opts.envs).length) body.envs = { ...opts.envs }
    if (opts.timeoutMs !== undefined) body.timeoutMs = opts.timeoutMs
    const timeoutMs = opts.requestTimeoutMs ?? (opts.timeoutMs ?? DEFAULT_CODE_TIMEOUT_MS) + REQUEST_GRACE_MS
    const path = codePath(this.sandboxId)
    const resp = await this._http.request('POST', path, { json: body, timeoutMs })
    try {
      return await readCodeEvents(resp.body, opts)
    } catch (e) {
      if (e instanceof APIConnectionError) throw e
      if (e?.name === 'TimeoutError' || e?.name === 'AbortError') {
        throw new APITimeoutError(`POST ${path}: timed out after ${timeoutMs} ms`, { cause: e })
      }
      throw new APIConnectionError(`POST ${path}: ${e?.cause?.message ?? e?.message ?? e}`, { cause: e })
    }
  }

  /** A new context with its own interpreter (started before this resolves). */
  async createCodeContext(opts = {}) {
    const body = {}
    if (opts.language !== undefined) body.language = opts.language
    if (opts.cwd !== undefined) body.cwd = opts.cwd
    return this._http.post(codePath(this.sandboxId, '/contexts'), body, { timeoutMs: 240_000 })
  }

  /** Every context of the sandbox (the default ones, once used, included). */
  async listCodeContexts() {
    return this._http.get(codePath(this.sandboxId, '/contexts'))
  }

  /** A new interpreter for the context: same id, variables gone. */
  async restartCodeContext(context) {
    const p = codePath(this.sandboxId, `/contexts/${encodeURIComponent(contextId(context))}/restart`)
    return this._http.post(p, undefined, { timeoutMs: 240_000 })
  }

  /** End the context's interpreter. */
  async removeCodeContext(context) {
    await this._http.delete(codePath(this.sandboxId, `/contexts/${encodeURIComponent(contextId(context))}`))
  }
}

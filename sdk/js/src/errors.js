// Typed errors. Every error the server answers has a stable `code` (NOT_FOUND,
// ACCOUNT_SCOPE_REQUIRED, …) and an HTTP status; the class follows the status, and `code`
// keeps the server's exact word so callers can branch on it.

export class LizardError extends Error {
  constructor(message, options) {
    super(message, options)
    this.name = new.target.name
  }
}

/** The server could not be reached (after the retries an idempotent call gets). */
export class APIConnectionError extends LizardError {}
/** The call took longer than its timeout. */
export class APITimeoutError extends APIConnectionError {}

/**
 * A directory cannot be pushed as it is: no recipe file, a Dockerfile without a name, a file
 * that is neither a file, a directory nor a symlink, a name that is not UTF-8.
 */
export class ContextError extends LizardError {}

/**
 * A template build ended without a template: `code` (STEP_FAILED, TIMED_OUT,
 * START_NOT_READY, CANCELLED, INTERNAL), `serverMessage`, the failing `step` (1-based) and
 * the tail of its output where a step failed; `build` is the whole build status.
 */
/**
 * A service's version did not go live: `code` (`START_NOT_READY`, `UNHEALTHY`,
 * `BUILD_FAILED`, …), the app's last output (`logTail`) and the service as it stands
 * (`service`: the previous version, if any, still serves).
 */
export class DeployError extends LizardError {
  constructor(service, version) {
    const error = service.versions?.find((v) => v.version === version)?.error ?? {}
    const code = error.code ?? 'FAILED'
    const message = error.message ?? `version ${version} failed`
    super(`${code}: ${message}${error.logTail ? `\n${error.logTail}` : ''}`)
    this.service = service
    this.code = code
    this.serverMessage = message
    this.logTail = error.logTail
  }
}

export class BuildError extends LizardError {
  constructor(build) {
    const failure = build.error
    const code = failure?.code ?? String(build.status).toUpperCase()
    const message = failure?.message ?? `the build ended ${build.status}`
    super(`${code}: ${message}${failure?.outputTail ? `\n${failure.outputTail}` : ''}`)
    this.build = build
    this.code = code
    this.serverMessage = message
    this.step = failure?.step
    this.outputTail = failure?.outputTail
  }
}

/** The server answered with an error: `status` (HTTP), `code` and `message`. */
export class APIError extends LizardError {
  constructor(status, code, message) {
    super(`${code}: ${message}`)
    this.status = status
    this.code = code
    this.serverMessage = message
  }
}

export class InvalidArgumentError extends APIError {}
export class AuthenticationError extends APIError {}
export class PermissionDeniedError extends APIError {}
export class PaymentRequiredError extends APIError {}
export class NotFoundError extends APIError {}
export class ConflictError extends APIError {}
export class RateLimitError extends APIError {}
export class InternalServerError extends APIError {}
export class NotImplementedByServerError extends APIError {}
export class BadGatewayError extends APIError {}
export class UnavailableError extends APIError {}
/** 408 `TIMED_OUT`: what the call waited for (a port to listen) did not happen in time. */
export class TimedOutError extends APIError {}

const BY_STATUS = {
  401: AuthenticationError,
  402: PaymentRequiredError,
  403: PermissionDeniedError,
  404: NotFoundError,
  408: TimedOutError,
  409: ConflictError,
  429: RateLimitError,
  500: InternalServerError,
  501: NotImplementedByServerError,
  502: BadGatewayError,
  503: UnavailableError,
}

/** The typed error for an error response. */
export function errorFor(status, code, message) {
  const Cls = BY_STATUS[status] ?? (status >= 400 && status < 500 ? InvalidArgumentError : APIError)
  return new Cls(status, code ?? `HTTP_${status}`, message)
}

// Type declarations of @lizard-build/sdk.

export interface ClientOptions {
  /** API key; defaults to the LIZARD_API_KEY environment variable. */
  apiKey?: string
  /** API root; defaults to LIZARD_API_URL, then http://127.0.0.1:7171. */
  apiUrl?: string
  /** Bound of each HTTP call in ms (default 60 000; create and exec allow longer). */
  timeoutMs?: number
  /** Retries of calls that cannot run twice (idempotent, or carrying an Idempotency-Key:
   * creates and execs) and of 429 answers (default 3). */
  maxRetries?: number
}

export interface LizardOptions extends ClientOptions {
  /** The project sandboxes and volumes go in: its id, slug or name. */
  project?: string
}

export interface RequestOptions {
  query?: Record<string, string | number | boolean | undefined | null>
  json?: unknown
  body?: BodyInit
  headers?: Record<string, string>
  timeoutMs?: number
  /** Ends the call when aborted; replaces `timeoutMs` (for calls that live until stopped). */
  signal?: AbortSignal
}

/** The raw HTTP client (`lizard.platform`), for endpoints not wrapped yet. */
export class HttpClient {
  constructor(opts?: ClientOptions)
  readonly apiKey: string | undefined
  readonly apiUrl: string
  timeoutMs: number
  maxRetries: number
  request(method: string, path: string, opts?: RequestOptions): Promise<Response>
  get<T = any>(path: string, opts?: RequestOptions): Promise<T>
  post<T = any>(path: string, json?: unknown, opts?: RequestOptions): Promise<T>
  put<T = any>(path: string, json?: unknown, opts?: RequestOptions): Promise<T>
  patch<T = any>(path: string, json?: unknown, opts?: RequestOptions): Promise<T>
  delete<T = any>(path: string, opts?: RequestOptions): Promise<T>
}

/** Called with every request any client sends (used by the OpenAPI contract tests). */
export const requestObservers: Array<
  (method: string, path: string, query: Record<string, string>, json: unknown, apiUrl: string) => void
>

export interface Workspace {
  id: string
  name: string
  slug: string
  createdAt: string
}
export interface Project {
  id: string
  workspaceId: string
  name: string
  slug: string
  createdAt: string
}
export interface ApiKey {
  id: string
  name: string
  prefix: string
  workspaces: string[] | null
  projects: string[] | null
  createdAt: string
}
export interface CreatedApiKey extends ApiKey {
  /** The secret, returned exactly once. */
  key: string
}
export interface WhoAmI {
  accountId: string
  keyId: string
  keyName: string
  scoped: boolean
  email?: string
  plan?: string
  workspaces?: string[]
  projects?: string[]
}
export interface Region {
  id: string
  name: string
  sandboxDomain: string
}
export interface Volume {
  id: string
  name: string
  projectId: string
  sizeGb?: number
  region?: string
  createdAt?: string
  [field: string]: unknown
}
export interface SandboxInfo {
  sandboxId: string
  template: string
  state: 'running' | 'paused'
  vcpus: number
  memoryMib: number
  startedAt: string
  metadata?: Record<string, string>
  projectId?: string
  endAt?: string
  domain?: string
  /** Only in a create's answer with `publicUrls: false`: the token its URLs require. */
  accessToken?: string
}
export interface FileEntry {
  name: string
  path: string
  type: 'file' | 'dir' | 'symlink' | 'other'
  size: number
  mode: number
}
/** What is at a path (`lstat`: a link is described, with its target, not followed). */
export interface FileInfo {
  name: string
  path: string
  type: 'file' | 'dir' | 'symlink' | 'other'
  size: number
  mode: number
  uid: number
  gid: number
  owner: string
  group: string
  /** Milliseconds since the Unix epoch. */
  mtimeMs: number
  symlinkTarget?: string
}

/** A change in a watched directory. `overflow`: the guest's event queue overflowed and
 * events were lost (the watch goes on; rescan what matters). */
export interface FsEvent {
  type: 'create' | 'write' | 'remove' | 'rename' | 'overflow'
  path: string
  /** Where a `rename` moved it. */
  newPath?: string
  isDir: boolean
}

/** An unpacked archive: the directory, its entries and the bytes of file content written. */
export interface ArchiveResult {
  path: string
  entries: number
  bytesWritten: number
}

export interface WatchOptions {
  /** Watch every directory under it too (new ones included). */
  recursive?: boolean
  onEvent?: (event: FsEvent) => void | Promise<void>
  /** The watch ended by itself (the sandbox paused or went away), with why. */
  onExit?: (error: Error) => void | Promise<void>
}

export interface WatchHandle {
  /** End the watch (its stream closes; `onExit` is not called). */
  stop(): Promise<void>
}

export interface ProcessResult {
  stdout: string
  stderr: string
  exitCode: number
  timedOut: boolean
}

/** A template: a built-in (`builtin`, visible to every key) or one a workspace pushed. */
export interface TemplateInfo {
  name: string
  description: string
  builtin: boolean
  /** A build has succeeded: sandboxes can be created from it. */
  ready: boolean
  workspaceId?: string
  /** The template it was built from. */
  from?: string
  /** The build sandboxes are created from. */
  buildId?: string
  /** The newest build (maybe still running, or failed). */
  latestBuildId?: string
  /** The command every sandbox of it starts with, already running. */
  startCmd?: string
  /** Bytes on disk of its own layers (what it adds over its base). */
  sizeBytes?: number
  createdAt?: string
  updatedAt?: string
}
export type BuildStatus = 'queued' | 'running' | 'ready' | 'failed' | 'cancelled'
/** One step of a build, as far as it got. */
export interface BuildStepInfo {
  /** 1-based, in recipe order. */
  index: number
  description: string
  /** Its layer came from the cache: it did not run. */
  cached: boolean
  status: BuildStatus
  durationMs?: number
}
/** Why a build failed. */
export interface BuildFailure {
  code: 'STEP_FAILED' | 'TIMED_OUT' | 'START_NOT_READY' | 'CANCELLED' | 'INTERNAL' | (string & {})
  message: string
  /** The step that failed (1-based). */
  step?: number
  /** The last lines the failing command printed. */
  outputTail?: string
}
export interface TemplateBuildInfo {
  buildId: string
  template: string
  status: BuildStatus
  steps: BuildStepInfo[]
  error?: BuildFailure
  createdAt: string
  finishedAt?: string
  /** The build's output so far (the last 64 KiB). */
  log: string
}
/** One line of a build's event stream; `done` is always the last. */
export type BuildEvent =
  | { type: 'step'; index: number; total: number; description: string; cached: boolean }
  | { type: 'output'; stream: 'stdout' | 'stderr'; data: string }
  | { type: 'stepDone'; index: number; durationMs: number }
  | { type: 'phase'; message: string }
  | { type: 'done'; status: BuildStatus; error?: BuildFailure }

export interface TemplateScope {
  /** The workspace (id, slug or name); default: the client's project's, or the key's only one. */
  workspace?: string
}
export interface PushOptions extends TemplateScope {
  /** The template's name: required for a Dockerfile, overrides the recipe's `name`. */
  name?: string
  /** Called with each build event as it happens. */
  onEvent?: (event: BuildEvent) => void
  /** Give up waiting after this long (APITimeoutError; the build goes on). */
  timeoutMs?: number
}

/** Options of `lizard.create` (the client gives the project and the connection). */
export interface CreateOptions {
  /** Lifetime from now (default 5 minutes). */
  timeoutMs?: number
  envs?: Record<string, string>
  metadata?: Record<string, string>
  /** An API key placed in the sandbox as LIZARD_API_KEY, for the `lizard` CLI inside. */
  lizardToken?: string
  /** A volume of the project, mounted at /workspace. */
  volumeName?: string
  vcpus?: number
  memoryMib?: number
  onTimeout?: 'kill' | 'pause'
  /** `[width, height]` of a `desktop` sandbox's screen (restarted at that size before create resolves). */
  resolution?: [number, number]
  /** Bound of the create call itself (ms). */
  requestTimeoutMs?: number
  /** Whether destinations in neither `allowOut` nor `denyOut` are reachable (default true).
   * Private, link-local and loopback ranges, other sandboxes and the host never are. */
  allowInternetAccess?: boolean
  /** CIDRs or domain names (`registry.example`, `*.example`) reachable even without internet
   * access (never an address the platform denies). */
  allowOut?: string[]
  /** CIDRs or domain names never reachable; wins over `allowOut`. */
  denyOut?: string[]
  /** Whether anyone may use the sandbox's URLs (default true). `false`: every request must
   * carry `sandbox.accessToken` (header `X-Lizard-Access-Token` or query `lizardAccessToken`). */
  publicUrls?: boolean
}

/** Options of `Sandbox.create`: a project (`project`: id, slug or name; or `projectId`),
 * the sandbox's options, and optionally the connection (`apiKey`, `apiUrl`). */
export interface SandboxOptions extends CreateOptions {
  project?: string
  projectId?: string
  apiKey?: string
  apiUrl?: string
  maxRetries?: number
  http?: HttpClient
}

export interface ExecOptions {
  cwd?: string
  envs?: Record<string, string>
  user?: string
  /** Kill the command after this long (exit code 124). */
  timeoutMs?: number
  stdin?: string
  /** Bound of the HTTP call itself (ms). */
  requestTimeoutMs?: number
  /** Called with stdout text as it arrives (the result still has all of it). */
  onStdout?: (data: string) => void
  /** Called with stderr text as it arrives. */
  onStderr?: (data: string) => void
}

export class Filesystem {
  write(path: string, data: string | Uint8Array, opts?: { mode?: number }): Promise<void>
  read(path: string): Promise<string>
  readBytes(path: string): Promise<Uint8Array>
  list(path: string): Promise<FileEntry[]>
  remove(path: string): Promise<void>
  makeDir(path: string): Promise<void>
  getInfo(path: string): Promise<FileInfo>
  exists(path: string): Promise<boolean>
  rename(oldPath: string, newPath: string): Promise<FileInfo>
  /** Several files in one call, as one tar archive: `{ [absolutePath]: content }`. */
  writeFiles(files: Record<string, string | Uint8Array>, opts?: { mode?: number }): Promise<ArchiveResult>
  /** Unpack a tar archive into a directory (created); no entry may land outside it. */
  writeArchive(path: string, archive: Uint8Array): Promise<ArchiveResult>
  /** A directory and everything under it as a tar archive. */
  downloadDir(path: string): Promise<Uint8Array>
  /** Follow a directory's changes; resolves once the watch is in place. */
  watch(path: string, opts?: WatchOptions): Promise<WatchHandle>
}

export class Process {
  exec(cmd: string | string[], opts?: ExecOptions): Promise<ProcessResult>
  /** Start `cmd` in the background: it outlives this call and this client. */
  start(cmd: string | string[], opts?: StartOptions): Promise<ProcessHandle>
  /** The processes the sandbox keeps (running, and the most recent ended ones). */
  list(): Promise<ProcessInfo[]>
  /** Reattach to a background process: its kept output (the newest 1 MiB), then live output. */
  connect(pid: number, opts?: { onStdout?: (text: string) => void; onStderr?: (text: string) => void }): Promise<ProcessHandle>
  /** Send a signal (default SIGKILL) to the process's group. */
  kill(pid: number, signal?: string): Promise<void>
}

export interface StartOptions {
  cwd?: string
  envs?: Record<string, string>
  user?: string
  onStdout?: (text: string) => void
  onStderr?: (text: string) => void
}
export interface ProcessInfo {
  pid: number
  cmd: string
  startedAtMs: number
  pty: boolean
  exitCode?: number
}
/** A TCP port something listens on in a sandbox (`sandbox.listPorts()`). */
export interface ListeningPort {
  port: number
  /** `0.0.0.0`, `::` or a loopback address. */
  address: string
  /** The process holding it, where the sandbox's agent found it. */
  pid?: number
  cmd?: string
}
export interface BackgroundResult {
  stdout: string
  stderr: string
  exitCode: number
}
export class ProcessHandle {
  info: ProcessInfo
  readonly pid: number
  /**
   * Wait for the end; a broken stream (a pause, a network cut) is followed again once, from
   * where it stopped. Rejects with the error a callback threw (the process runs on; a next
   * `wait()` follows on without delivering anything twice).
   */
  wait(): Promise<BackgroundResult>
  kill(signal?: string): Promise<void>
  sendStdin(data: string | Uint8Array): Promise<void>
  /** End stdin (a PTY gets ^D). */
  closeStdin(): Promise<void>
  /** Stop following the process; it runs on. */
  disconnect(): void
}
export class PtyHandle extends ProcessHandle {
  sendInput(data: string | Uint8Array): Promise<void>
  resize(size: { cols: number; rows: number }): Promise<void>
}
export interface PtyOptions {
  cols?: number
  rows?: number
  /** A shell command (default: the login shell). */
  cmd?: string
  cwd?: string
  envs?: Record<string, string>
  user?: string
  /** The terminal's output bytes as they come. */
  onData?: (data: Uint8Array) => void
}
export class Pty {
  create(opts?: PtyOptions): Promise<PtyHandle>
  connect(pid: number, opts?: { onData?: (data: Uint8Array) => void }): Promise<PtyHandle>
}

export class Sandbox {
  info: SandboxInfo
  readonly sandboxId: string
  readonly id: string
  readonly template: string
  readonly state: 'running' | 'paused'
  /** The token a private sandbox's URLs require (only on the object `create` returned). */
  readonly accessToken?: string
  readonly fs: Filesystem
  readonly process: Process
  /** Terminals in the sandbox. */
  readonly pty: Pty
  /** Computer use on a `desktop` sandbox's screen. */
  readonly desktop: Desktop
  static create(template?: string, opts?: SandboxOptions): Promise<Sandbox>
  static connect(sandboxId: string, opts?: ClientOptions & { http?: HttpClient }): Promise<Sandbox>
  static list(opts?: ClientOptions & { projectId?: string; workspaceId?: string; http?: HttpClient }): Promise<SandboxInfo[]>
  getInfo(): Promise<SandboxInfo>
  isRunning(): Promise<boolean>
  setTimeout(timeoutMs: number): Promise<void>
  kill(): Promise<void>
  pause(): Promise<void>
  resume(): Promise<void>
  /** `count` copies of this running sandbox (processes, memory and files), each with its own id. */
  fork(count?: number): Promise<Sandbox[]>
  getHost(port: number): string
  /** A URL to `port` that works without the access token until it expires (default 3600 s, at most a week). */
  getSignedUrl(
    port: number,
    opts?: { expiresInSeconds?: number; path?: string; scheme?: 'http' | 'https'; urlPort?: number },
  ): Promise<string>
  /** Resolve once something listens on `port` in the sandbox; `TimedOutError` after `timeoutMs` (default 60 000). */
  waitForPort(port: number, opts?: { timeoutMs?: number }): Promise<void>
  /** The TCP ports something listens on in the sandbox (the platform's own left out); `ConflictError` while paused. */
  listPorts(): Promise<ListeningPort[]>
  /**
   * Run code in a context (the `interpreter` template): `context`, or `language`'s default
   * one (default python), not both. Output streams to the callbacks as it happens; an
   * exception, a timeout (`TimeoutError`) or a dead interpreter (`DeadKernelError`) is
   * `execution.error`.
   */
  runCode(code: string, opts?: RunCodeOpts): Promise<Execution>
  createCodeContext(opts?: { language?: CodeLanguage; cwd?: string }): Promise<CodeContext>
  listCodeContexts(): Promise<CodeContext[]>
  restartCodeContext(context: CodeContext | string): Promise<CodeContext>
  removeCodeContext(context: CodeContext | string): Promise<void>
}

export type CodeLanguage = 'python' | 'javascript' | 'typescript' | 'r' | 'bash'
export interface CodeContext {
  id: string
  language: CodeLanguage
  cwd: string
}
export interface RunCodeOpts {
  language?: CodeLanguage
  context?: CodeContext | string
  onStdout?: (text: string) => void
  onStderr?: (text: string) => void
  onResult?: (result: Result) => void
  onError?: (error: ExecutionError) => void
  /** Environment for this run only. */
  envs?: Record<string, string>
  /** Interrupts the code after this long (default 300 000); the context keeps its state. */
  timeoutMs?: number
  /** Bounds the HTTP call (default: timeoutMs + 90 s). */
  requestTimeoutMs?: number
}
/** Something the code displayed; each MIME type of its bundle is a field. */
export class Result {
  readonly isMainResult: boolean
  readonly text?: string
  readonly html?: string
  readonly markdown?: string
  readonly svg?: string
  /** Base64. */
  readonly png?: string
  /** Base64. */
  readonly jpeg?: string
  readonly pdf?: string
  readonly latex?: string
  readonly json?: unknown
  readonly javascript?: string
  /** MIME types without a field of their own. */
  readonly extra: Record<string, unknown>
  /** The whole MIME bundle. */
  readonly data: Record<string, unknown>
  formats(): string[]
}
export class ExecutionError {
  /** ZeroDivisionError, TypeError, TimeoutError, DeadKernelError, … */
  readonly name: string
  readonly value: string
  readonly traceback: string
}
export class Execution {
  readonly results: Result[]
  readonly logs: { stdout: string[]; stderr: string[] }
  readonly error?: ExecutionError
  readonly executionCount?: number
  /** The main result's text. */
  readonly text?: string
}
export class CodeInterpreter {}
export function readCodeEvents(body: AsyncIterable<Uint8Array>, callbacks?: RunCodeOpts): Promise<Execution>

export class Workspaces {
  list(): Promise<Workspace[]>
  create(opts: { name: string }): Promise<Workspace>
  find(nameOrSlugOrId: string): Promise<Workspace>
  delete(id: string, opts?: { force?: boolean }): Promise<void>
}
export class Projects {
  list(opts?: { workspaceId?: string }): Promise<Project[]>
  get(id: string): Promise<Project>
  create(opts: { workspaceId: string; name: string }): Promise<Project>
  update(id: string, opts: { name: string }): Promise<Project>
  delete(id: string): Promise<void>
}
export class ApiKeys {
  list(): Promise<ApiKey[]>
  create(opts: { name: string; workspaces?: string[]; projects?: string[] }): Promise<CreatedApiKey>
  delete(id: string): Promise<void>
}
export class Regions {
  list(): Promise<Region[]>
}
export class Volumes {
  getOrCreate(name: string, opts?: { sizeGb?: number; region?: string }): Promise<Volume>
  create(name: string, opts?: { sizeGb?: number; region?: string }): Promise<Volume>
  get(nameOrId: string): Promise<Volume>
  list(): Promise<Volume[]>
  delete(nameOrId: string): Promise<void>
}
export class Billing {
  balance(): Promise<Record<string, any>>
  transactions(opts?: { limit?: number; cursor?: string; includeUsage?: boolean }): Promise<Record<string, any>>
  summary(opts?: { granularity?: 'month' | 'day'; periods?: number }): Promise<Record<string, any>>
  live(): Promise<Record<string, any>>
}
export class Metrics {
  get(opts?: { workspaceId?: string; projectId?: string; from?: string; to?: string }): Promise<Record<string, any>>
}

export class Templates {
  /** Built-ins, then the workspace's templates. */
  list(opts?: TemplateScope): Promise<TemplateInfo[]>
  get(name: string, opts?: TemplateScope): Promise<TemplateInfo>
  /** ConflictError while sandboxes use it; PermissionDeniedError for a built-in. */
  delete(name: string, opts?: TemplateScope): Promise<void>
  getBuild(name: string, buildId: string, opts?: TemplateScope): Promise<TemplateBuildInfo>
  cancelBuild(name: string, buildId: string, opts?: TemplateScope): Promise<void>
  /** The build's events from the first, as they happen, ending after `done`. */
  events(name: string, buildId: string, opts?: TemplateScope & { timeoutMs?: number }): AsyncGenerator<BuildEvent, void, undefined>
  /** Upload a directory (lizard.template.toml or Dockerfile) and build it; rejects with BuildError when the build fails. */
  push(dir?: string, opts?: PushOptions): Promise<TemplateBuildInfo>
}

export interface ServiceVersion {
  version: number
  /** building, starting, live, failed or retired. */
  status: string
  spec: Record<string, any>
  buildId?: string
  error?: { code: string; message: string; logTail?: string }
  createdAt: string
}
export interface ServiceInfo {
  serviceId: string
  name: string
  projectId: string
  workspaceId: string
  url: string
  /** deploying, live, failing or failed. */
  status: string
  error?: { code: string; message: string; logTail?: string }
  liveVersion?: number
  versions: ServiceVersion[]
  instances: { sandboxId: string; version: number; state: string; restarts: number }[]
  createdAt: string
  updatedAt: string
}
export interface DeployOptions {
  cmd: string
  port: number
  template?: string
  build?: string
  env?: Record<string, string>
  health?: { path?: string; intervalMs?: number; timeoutMs?: number; graceMs?: number }
  scale?: { min?: number; max?: number; idle?: 'pause' | 'keep'; idleAfterMs?: number }
  /** Resolve once live, reject with DeployError when the version failed (default true). */
  wait?: boolean
  timeoutMs?: number
}
export class Services {
  /** Deploy a directory as the service `name` (new, or a new version). */
  deploy(dir: string, name: string, opts: DeployOptions): Promise<ServiceInfo>
  list(): Promise<ServiceInfo[]>
  get(name: string): Promise<ServiceInfo>
  rollback(name: string, opts?: { version?: number; timeoutMs?: number }): Promise<ServiceInfo>
  delete(name: string): Promise<void>
  logs(name: string, opts?: { tail?: number }): Promise<{ sandboxId: string; version: number; data: string }[]>
}

export class Lizard {
  constructor(opts?: LizardOptions)
  readonly project: string | undefined
  readonly platform: HttpClient
  readonly workspaces: Workspaces
  readonly projects: Projects
  readonly apiKeys: ApiKeys
  readonly regions: Regions
  readonly volumes: Volumes
  readonly billing: Billing
  readonly metrics: Metrics
  readonly templates: Templates
  readonly services: Services
  projectId(): Promise<string>
  create(template?: string, opts?: CreateOptions): Promise<Sandbox>
  connect(sandboxId: string): Promise<Sandbox>
  list(): Promise<SandboxInfo[]>
  whoami(): Promise<WhoAmI>
}

export class LizardError extends Error {}
/** A desktop action failed inside the sandbox (the message carries the tool's stderr). */
export class DesktopError extends LizardError {}

/** `desktop.stream`: the live view, a noVNC page through the sandbox URL (port 6080). */
export class DesktopStream {
  /** The running stream's secret (null when none was started by this object). */
  readonly secret: string | null
  /** Start the live view with a new secret (a running one is replaced). */
  start(): Promise<void>
  /** The noVNC page; `port` is the sandbox-URL proxy's port when not the scheme's default. */
  getUrl(opts?: { viewOnly?: boolean; port?: number; scheme?: 'http' | 'https' }): string
  stop(): Promise<void>
}

export type MouseButton = 'left' | 'middle' | 'right'

/** `sandbox.desktop`: mouse, keyboard, screenshots, apps and the live view. */
export class Desktop {
  readonly stream: DesktopStream
  /** The whole screen as PNG bytes. */
  screenshot(): Promise<Uint8Array>
  getScreenSize(): Promise<{ width: number; height: number }>
  getCursorPosition(): Promise<{ x: number; y: number }>
  /** Restart the desktop at `width` x `height` (open windows are closed). */
  setResolution(width: number, height: number): Promise<void>
  leftClick(x?: number, y?: number): Promise<void>
  rightClick(x?: number, y?: number): Promise<void>
  middleClick(x?: number, y?: number): Promise<void>
  doubleClick(x?: number, y?: number): Promise<void>
  moveMouse(x: number, y: number): Promise<void>
  mousePress(button?: MouseButton): Promise<void>
  mouseRelease(button?: MouseButton): Promise<void>
  drag(from: [number, number], to: [number, number]): Promise<void>
  scroll(direction?: 'up' | 'down' | 'left' | 'right', amount?: number): Promise<void>
  /** Type `text` into the focused window. */
  write(text: string, opts?: { chunkSize?: number; delayInMs?: number }): Promise<void>
  /** One key (`'enter'`, `'a'`, `'F5'`) or a chord (`['ctrl', 'c']`). */
  press(key: string | string[]): Promise<void>
  /** A URL or file in Chromium. */
  open(urlOrFile: string): Promise<void>
  /** A command line, started detached on the desktop. */
  launch(application: string): Promise<void>
  wait(ms: number): Promise<void>
}
export class APIConnectionError extends LizardError {}
export class APITimeoutError extends APIConnectionError {}
/** A directory cannot be pushed as it is (no recipe, a special file, a name not UTF-8). */
export class ContextError extends LizardError {}
/** A service's version did not go live (the previous one, if any, still serves). */
export class DeployError extends LizardError {
  readonly service: ServiceInfo
  /** START_NOT_READY, UNHEALTHY, BUILD_FAILED, … */
  readonly code: string
  readonly serverMessage: string
  readonly logTail: string | undefined
}
/** A template build ended without a template. */
export class BuildError extends LizardError {
  readonly build: TemplateBuildInfo
  /** STEP_FAILED, TIMED_OUT, START_NOT_READY, CANCELLED or INTERNAL. */
  readonly code: string
  readonly serverMessage: string
  /** The failing step (1-based). */
  readonly step: number | undefined
  readonly outputTail: string | undefined
}
export class APIError extends LizardError {
  readonly status: number
  /** The server's stable code, e.g. NOT_FOUND or ACCOUNT_SCOPE_REQUIRED. */
  readonly code: string
  readonly serverMessage: string
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
/** 408 `TIMED_OUT`: a port wait ran out of time. */
export class TimedOutError extends APIError {}
export function errorFor(status: number, code: string | undefined, message: string): APIError

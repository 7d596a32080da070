//! Every HTTP route of Lizard's API, described once: path template, method, what the
//! request carries, what a success answers and which error codes the route documents.
//!
//! The node's router is built from [`node`]; the server's handlers take their paths from
//! here (`#[utoipa::path(post, path = routes::CREATE_SANDBOX.path, …)]`, which both routes
//! and documents them) and a test (`crates/lizard-server/tests/routes.rs`) checks the
//! OpenAPI document against [`SERVER`] — methods, statuses, schemas, error codes, path
//! parameters; the clients (CLI, bench) take their paths from here with [`Route::uri`]. A
//! route cannot be served, documented or called without being in this table.
//!
//! Path templates use `{name}` for a parameter: the syntax of both OpenAPI and axum.
//!
//! Every route that takes a key (those listing `UNAUTHENTICATED`) may also answer 429
//! `RATE_LIMITED` with `Retry-After` (the key's rate or requests in flight); the document
//! lists it on each of them.

use crate::ErrorCode::{
    self, AccountScopeRequired, BootFailed, CodeServiceUnavailable, Conflict, Forbidden, IdempotencyKeyReused,
    InvalidArgument, NotFound, OutputTooLarge, PaymentRequired, QuotaExceeded, TimedOut, Unauthenticated, Unavailable,
};

/// An HTTP method a route answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    Get,
    Post,
    Put,
    Patch,
    Delete,
}

impl Method {
    /// Upper case, as on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Patch => "PATCH",
            Method::Delete => "DELETE",
        }
    }
}

/// What a request or a success response carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// Nothing.
    Empty,
    /// A JSON value of the named type (its name in `lizard_api` and in the OpenAPI schemas).
    Json(&'static str),
    /// A JSON array of the named type.
    JsonList(&'static str),
    /// Raw bytes (`application/octet-stream`).
    Bytes,
    /// Plain text.
    Text,
    /// Newline-delimited JSON (`application/x-ndjson`): a stream of values of the named type.
    Ndjson(&'static str),
    /// Exec frames (`application/vnd.lizard.frames`, see `lizard_agent_proto::frame`).
    Frames,
}

/// One route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub method: Method,
    /// Path template, e.g. `/v1/sandboxes/{id}`.
    pub path: &'static str,
    pub request: Body,
    /// Status of a success.
    pub status: u16,
    pub response: Body,
    /// The error codes the route documents (each answered with [`ErrorCode::status`]).
    pub errors: &'static [ErrorCode],
}

/// Append `key=value` to `uri`'s query, `value` percent-encoded: `?` before the first
/// parameter, `&` before the others (a [`Route::uri`] has no `?` of its own: its
/// arguments are encoded).
pub fn push_query(uri: &mut String, key: &str, value: &str) {
    uri.push(if uri.contains('?') { '&' } else { '?' });
    uri.push_str(key);
    uri.push('=');
    uri.push_str(&urlencoding::encode(value));
}

impl Route {
    /// The path with each `{…}` parameter replaced, in order, by one of `args`,
    /// percent-encoded as one path segment.
    ///
    /// # Panics
    /// When `args` has fewer or more values than the template has parameters: a
    /// programming error the caller's own tests find at once.
    pub fn uri(&self, args: &[&str]) -> String {
        let mut out = String::with_capacity(self.path.len() + 16);
        let mut rest = self.path;
        let mut args = args.iter();
        while let Some(start) = rest.find('{') {
            let end = rest[start..].find('}').map_or(rest.len(), |e| start + e + 1);
            out.push_str(&rest[..start]);
            let arg = args.next().unwrap_or_else(|| panic!("{}: too few path arguments", self.path));
            out.push_str(&urlencoding::encode(arg));
            rest = &rest[end..];
        }
        out.push_str(rest);
        assert!(args.next().is_none(), "{}: too many path arguments", self.path);
        out
    }

    /// Names of the path's parameters, in order.
    pub fn params(&self) -> impl Iterator<Item = &'static str> {
        self.path.split('{').skip(1).filter_map(|s| s.split_once('}').map(|(name, _)| name))
    }
}

/// Path templates, shared by routes that differ only in method.
pub mod path {
    pub const HEALTH: &str = "/health";
    pub const OPENAPI: &str = "/openapi.json";
    pub const SANDBOXES: &str = "/v1/sandboxes";
    pub const SANDBOX: &str = "/v1/sandboxes/{id}";
    pub const SANDBOX_TIMEOUT: &str = "/v1/sandboxes/{id}/timeout";
    pub const SANDBOX_NETWORK: &str = "/v1/sandboxes/{id}/network";
    pub const SANDBOX_SIGNED_URLS: &str = "/v1/sandboxes/{id}/signed-urls";
    pub const SANDBOX_PAUSE: &str = "/v1/sandboxes/{id}/pause";
    pub const SANDBOX_RESUME: &str = "/v1/sandboxes/{id}/resume";
    pub const SANDBOX_CONNECT: &str = "/v1/sandboxes/{id}/connect";
    pub const SANDBOX_FORK: &str = "/v1/sandboxes/{id}/fork";
    pub const SANDBOX_EXEC: &str = "/v1/sandboxes/{id}/exec";
    pub const FILES: &str = "/v1/sandboxes/{id}/files";
    pub const FILES_LIST: &str = "/v1/sandboxes/{id}/files/list";
    pub const FILES_MKDIR: &str = "/v1/sandboxes/{id}/files/mkdir";
    pub const FILES_INFO: &str = "/v1/sandboxes/{id}/files/info";
    pub const FILES_EXISTS: &str = "/v1/sandboxes/{id}/files/exists";
    pub const FILES_RENAME: &str = "/v1/sandboxes/{id}/files/rename";
    pub const FILES_WATCH: &str = "/v1/sandboxes/{id}/files/watch";
    pub const FILES_ARCHIVE: &str = "/v1/sandboxes/{id}/files/archive";
    pub const PROCESSES: &str = "/v1/sandboxes/{id}/processes";
    pub const PROCESS_OUTPUT: &str = "/v1/sandboxes/{id}/processes/{pid}/output";
    pub const PROCESS_STDIN: &str = "/v1/sandboxes/{id}/processes/{pid}/stdin";
    pub const PROCESS_SIGNAL: &str = "/v1/sandboxes/{id}/processes/{pid}/signal";
    pub const PROCESS_RESIZE: &str = "/v1/sandboxes/{id}/processes/{pid}/resize";
    pub const PTY: &str = "/v1/sandboxes/{id}/pty";
    pub const PORTS: &str = "/v1/sandboxes/{id}/ports";
    pub const PORT_WAIT: &str = "/v1/sandboxes/{id}/ports/{port}/wait";
    pub const CODE: &str = "/v1/sandboxes/{id}/code";
    pub const CODE_CONTEXTS: &str = "/v1/sandboxes/{id}/code/contexts";
    pub const CODE_CONTEXT: &str = "/v1/sandboxes/{id}/code/contexts/{contextId}";
    pub const CODE_CONTEXT_RESTART: &str = "/v1/sandboxes/{id}/code/contexts/{contextId}/restart";
    pub const WORKSPACES: &str = "/v1/workspaces";
    pub const WORKSPACE: &str = "/v1/workspaces/{id}";
    pub const PROJECTS: &str = "/v1/projects";
    pub const PROJECT: &str = "/v1/projects/{id}";
    pub const API_KEYS: &str = "/v1/api-keys";
    pub const API_KEY: &str = "/v1/api-keys/{id}";
    pub const WHOAMI: &str = "/v1/whoami";
    pub const ACCOUNT: &str = "/v1/account";
    pub const REGIONS: &str = "/v1/regions";
    pub const BALANCE: &str = "/v1/billing/balance";
    pub const TRANSACTIONS: &str = "/v1/billing/transactions";
    pub const SUMMARY: &str = "/v1/billing/summary";
    pub const LIVE: &str = "/v1/billing/live";
    pub const SANDBOX_COSTS: &str = "/v1/billing/sandboxes";
    pub const METRICS: &str = "/v1/metrics";
    pub const VOLUMES: &str = "/v1/volumes";
    pub const VOLUME: &str = "/v1/volumes/{nameOrId}";
    pub const TEMPLATES: &str = "/v1/templates";
    pub const TEMPLATE: &str = "/v1/templates/{name}";
    pub const TEMPLATE_BLOBS_MISSING: &str = "/v1/templates/blobs/missing";
    pub const TEMPLATE_BLOB: &str = "/v1/templates/blobs/{sha256}";
    pub const TEMPLATE_BUILD: &str = "/v1/templates/{name}/builds/{buildId}";
    pub const TEMPLATE_BUILD_EVENTS: &str = "/v1/templates/{name}/builds/{buildId}/events";
    pub const SERVICES: &str = "/v1/services";
    pub const SERVICE: &str = "/v1/services/{name}";
    pub const SERVICE_VERSIONS: &str = "/v1/services/{name}/versions";
    pub const SERVICE_ROLLBACK: &str = "/v1/services/{name}/rollback";
    pub const SERVICE_LOGS: &str = "/v1/services/{name}/logs";
    pub const CLUSTER_JOIN: &str = "/v1/cluster/join";
    pub const CLUSTER_HEARTBEAT: &str = "/v1/cluster/nodes/{id}/heartbeat";
    pub const CLUSTER_EVENTS: &str = "/v1/cluster/nodes/{id}/events";
    pub const CLUSTER_HALTS: &str = "/v1/cluster/nodes/{id}/halts";
    pub const NODES: &str = "/v1/nodes";
    pub const NODE: &str = "/v1/nodes/{id}";
    pub const NODE_DRAIN: &str = "/v1/nodes/{id}/drain";
    pub const NODE_UNDRAIN: &str = "/v1/nodes/{id}/undrain";
    pub const NODE_TOKENS: &str = "/v1/node-tokens";
    pub const NODE_TOKEN: &str = "/v1/node-tokens/{id}";
    // The node's own API only (see [`super::node`]).
    pub const NODE_VOLUME: &str = "/v1/node/volumes/{id}";
    pub const NODE_VOLUME_HOLDER: &str = "/v1/node/volumes/{id}/holder";
    pub const NODE_BUILDS: &str = "/v1/node/templates/builds";
    pub const NODE_BUILTIN_TEMPLATES: &str = "/v1/node/templates/builtin";
    pub const NODE_TEMPLATE: &str = "/v1/node/templates/{ref}";
    pub const NODE_PORT: &str = "/v1/node/sandboxes/{id}/ports/{port}";
    pub const NODE_SANDBOX_SNAPSHOTS: &str = "/v1/node/sandboxes/{id}/snapshots";
    pub const NODE_SNAPSHOT: &str = "/v1/node/snapshots/{id}";
}

const fn route(
    method: Method,
    path: &'static str,
    request: Body,
    status: u16,
    response: Body,
    errors: &'static [ErrorCode],
) -> Route {
    Route { method, path, request, status, response, errors }
}

use Body::{Bytes, Empty, Frames, Json, JsonList, Ndjson, Text};
use Method::{Delete, Get, Patch, Post, Put};

/// A read: GET with no body, answering 200 with `response`.
const fn get(path: &'static str, response: Body, errors: &'static [ErrorCode]) -> Route {
    route(Get, path, Empty, 200, response, errors)
}

/// A delete: DELETE with no body, answering 204 with nothing.
const fn delete(path: &'static str, errors: &'static [ErrorCode]) -> Route {
    route(Delete, path, Empty, 204, Empty, errors)
}

/// An action: POST of `request`, answering 200 with `response`.
const fn post(path: &'static str, request: Body, response: Body, errors: &'static [ErrorCode]) -> Route {
    route(Post, path, request, 200, response, errors)
}

/// A create: POST of `request`, answering 201 with what it made.
const fn create(path: &'static str, request: Body, response: Body, errors: &'static [ErrorCode]) -> Route {
    route(Post, path, request, 201, response, errors)
}

// --- system -------------------------------------------------------------------------------
/// Liveness; no key needed.
pub const HEALTH: Route = get(path::HEALTH, Text, &[]);
/// The OpenAPI document; no key needed.
pub const OPENAPI: Route = get(path::OPENAPI, Json("OpenApi"), &[]);

// --- sandboxes (control plane) ------------------------------------------------------------
/// With an `Idempotency-Key`: a retry gets the first answer; the same key with another
/// request `IDEMPOTENCY_KEY_REUSED` (422); while the first is served, `CONFLICT` (409).
/// The same holds for [`EXEC`], [`FORK`] and [`CREATE_VOLUME`].
pub const CREATE_SANDBOX: Route = create(
    path::SANDBOXES,
    Json("NewSandboxRequest"),
    Json("SandboxInfo"),
    &[Unauthenticated, NotFound, InvalidArgument, PaymentRequired, Conflict, IdempotencyKeyReused],
);
pub const LIST_SANDBOXES: Route = get(path::SANDBOXES, JsonList("SandboxInfo"), &[Unauthenticated, InvalidArgument]);
pub const GET_SANDBOX: Route = get(path::SANDBOX, Json("SandboxInfo"), &[Unauthenticated, NotFound]);
pub const KILL_SANDBOX: Route = delete(path::SANDBOX, &[Unauthenticated, NotFound]);
pub const SET_TIMEOUT: Route = post(
    path::SANDBOX_TIMEOUT,
    Json("SetTimeoutRequest"),
    Json("SandboxInfo"),
    &[Unauthenticated, NotFound, InvalidArgument],
);
/// Replace a running or paused sandbox's outbound policy in place.
pub const SET_NETWORK: Route = route(
    Put,
    path::SANDBOX_NETWORK,
    Json("NetworkPolicy"),
    200,
    Json("SandboxInfo"),
    &[Unauthenticated, NotFound, InvalidArgument, Conflict],
);
/// A URL to one of a sandbox's ports that works without its access token until it expires.
pub const SIGN_URL: Route = post(
    path::SANDBOX_SIGNED_URLS,
    Json("SignUrlRequest"),
    Json("SignedUrl"),
    &[Unauthenticated, NotFound, InvalidArgument],
);
pub const PAUSE: Route = post(path::SANDBOX_PAUSE, Empty, Json("SandboxInfo"), &[Unauthenticated, NotFound]);
pub const RESUME: Route =
    post(path::SANDBOX_RESUME, Empty, Json("SandboxInfo"), &[Unauthenticated, NotFound, PaymentRequired]);
/// Resumes a paused sandbox; a running one answers as it is.
pub const CONNECT: Route =
    post(path::SANDBOX_CONNECT, Empty, Json("SandboxInfo"), &[Unauthenticated, NotFound, PaymentRequired]);
pub const FORK: Route = create(
    path::SANDBOX_FORK,
    Json("ForkRequest"),
    JsonList("SandboxInfo"),
    &[Unauthenticated, NotFound, Conflict, InvalidArgument, PaymentRequired, IdempotencyKeyReused],
);
/// Buffered: a `ProcessResult`. `?stream=true`: exec frames as the command runs.
/// Without `?stream=true`, output past 16 MiB answers `OUTPUT_TOO_LARGE` (422).
pub const EXEC: Route = post(
    path::SANDBOX_EXEC,
    Json("ExecRequest"),
    Json("ProcessResult"),
    &[Unauthenticated, NotFound, InvalidArgument, OutputTooLarge, Conflict, IdempotencyKeyReused],
);
/// `?path=`: the file's bytes.
pub const READ_FILE: Route = get(path::FILES, Bytes, &[Unauthenticated, NotFound, InvalidArgument]);
/// `?path=&mode=` ([`crate::FileMode`]): the body becomes the file, replaced atomically.
pub const WRITE_FILE: Route =
    route(Put, path::FILES, Bytes, 200, Json("WriteResult"), &[Unauthenticated, NotFound, InvalidArgument]);
/// `?path=`: a file, or a directory recursively.
pub const REMOVE_FILE: Route = delete(path::FILES, &[Unauthenticated, NotFound, InvalidArgument]);
/// `?path=`: a directory's entries, sorted by name.
pub const LIST_DIR: Route = get(path::FILES_LIST, JsonList("FileEntry"), &[Unauthenticated, NotFound, InvalidArgument]);
/// `?path=`: a directory and its parents.
pub const MAKE_DIR: Route =
    route(Post, path::FILES_MKDIR, Empty, 204, Empty, &[Unauthenticated, NotFound, InvalidArgument]);
/// `?path=`: what `lstat` says of it (a link is described, with its target).
pub const FILE_INFO: Route = get(path::FILES_INFO, Json("FileInfo"), &[Unauthenticated, NotFound, InvalidArgument]);
/// `?path=`: whether anything (a link included) is there.
pub const FILE_EXISTS: Route =
    get(path::FILES_EXISTS, Json("FileExists"), &[Unauthenticated, NotFound, InvalidArgument]);
/// `?path=&to=`: `rename(2)`; answers what is at `to` now.
pub const RENAME_FILE: Route =
    post(path::FILES_RENAME, Empty, Json("FileInfo"), &[Unauthenticated, NotFound, InvalidArgument]);
/// `?path=&recursive=`: a directory's changes (`FsEvent`s) as they happen, until the
/// client closes it; the answer starts once the watch is in place. Ends at a pause.
pub const WATCH_DIR: Route = get(path::FILES_WATCH, Ndjson("FsEvent"), &[Unauthenticated, NotFound, InvalidArgument]);
/// `?path=`: a directory's tree as a tar archive (links as links).
pub const READ_ARCHIVE: Route = get(path::FILES_ARCHIVE, Bytes, &[Unauthenticated, NotFound, InvalidArgument]);
/// `?path=`: the body (a tar archive) unpacked into the directory, which is created; an
/// entry that would land outside it (absolute, `..`, through a link) is refused.
pub const WRITE_ARCHIVE: Route =
    route(Put, path::FILES_ARCHIVE, Bytes, 200, Json("ArchiveResult"), &[Unauthenticated, NotFound, InvalidArgument]);

// --- background processes, terminals, ports (see [`crate::processes`]) ----------------------
/// What every process route can answer besides success (409: its stdin is closed, it has
/// no terminal, or too many run).
const PROCESS_ERRORS: &[ErrorCode] = &[Unauthenticated, NotFound, InvalidArgument, Conflict];
/// Starts a process that outlives the request: `Started`, output, `Exit` as it runs.
/// Closing the response leaves the process running.
pub const START_PROCESS: Route = post(path::PROCESSES, Json("StartProcessRequest"), Frames, PROCESS_ERRORS);
pub const LIST_PROCESSES: Route = get(path::PROCESSES, JsonList("ProcessInfo"), &[Unauthenticated, NotFound]);
/// Reattach: the output kept (the newest 1 MiB), then live output, then `Exit`.
pub const PROCESS_OUTPUT: Route = get(path::PROCESS_OUTPUT, Frames, PROCESS_ERRORS);
/// The body goes to the process's stdin (its terminal's keyboard, for a PTY).
pub const PROCESS_STDIN: Route = route(Post, path::PROCESS_STDIN, Bytes, 204, Empty, PROCESS_ERRORS);
/// Ends the process's stdin (a PTY gets `^D`).
pub const CLOSE_PROCESS_STDIN: Route = delete(path::PROCESS_STDIN, PROCESS_ERRORS);
/// A signal to the process's group (default `SIGKILL`); an ended process: nothing to do.
pub const SIGNAL_PROCESS: Route = route(Post, path::PROCESS_SIGNAL, Json("SignalRequest"), 204, Empty, PROCESS_ERRORS);
/// A new size for a PTY process's terminal.
pub const RESIZE_PROCESS: Route = route(Post, path::PROCESS_RESIZE, Json("PtySize"), 204, Empty, PROCESS_ERRORS);
/// The TCP ports something listens on in the sandbox (the platform's own left out); a
/// paused sandbox answers 409 `CONFLICT`, as every in-guest route.
pub const LIST_PORTS: Route = get(path::PORTS, JsonList("ListeningPort"), &[Unauthenticated, NotFound, Conflict]);
/// `?timeoutMs=` (default 60 s, at most 10 min): answers once something listens on the
/// TCP port in the sandbox (any address), 408 `TIMED_OUT` when nothing did in time.
pub const WAIT_FOR_PORT: Route =
    route(Get, path::PORT_WAIT, Empty, 204, Empty, &[Unauthenticated, NotFound, InvalidArgument, TimedOut]);
/// A WebSocket (`Upgrade: websocket`, subprotocol [`crate::processes::PTY_PROTOCOL`]): a
/// terminal in the sandbox (see [`crate::processes::PtyClientMessage`]). The key may come
/// as a subprotocol (browsers cannot set headers on a WebSocket).
pub const PTY: Route =
    route(Get, path::PTY, Empty, 101, Empty, &[Unauthenticated, NotFound, InvalidArgument, Conflict]);

// --- code execution (the `interpreter` template's code service) ---------------------------
/// What every code route can answer besides success.
const CODE_ERRORS: &[ErrorCode] = &[Unauthenticated, NotFound, InvalidArgument, CodeServiceUnavailable];
/// Runs code in a context: `CodeEvent`s as the code produces output, ending with `end`.
pub const RUN_CODE: Route = post(path::CODE, Json("RunCodeRequest"), Ndjson("CodeEvent"), CODE_ERRORS);
pub const LIST_CODE_CONTEXTS: Route = get(path::CODE_CONTEXTS, JsonList("CodeContext"), CODE_ERRORS);
pub const CREATE_CODE_CONTEXT: Route =
    create(path::CODE_CONTEXTS, Json("CreateCodeContextRequest"), Json("CodeContext"), CODE_ERRORS);
/// Ends the context's interpreter; its state is gone.
pub const REMOVE_CODE_CONTEXT: Route = delete(path::CODE_CONTEXT, CODE_ERRORS);
/// A new interpreter for the context (same id, state cleared, counter from 0).
pub const RESTART_CODE_CONTEXT: Route = post(path::CODE_CONTEXT_RESTART, Empty, Json("CodeContext"), CODE_ERRORS);

// --- tenancy ------------------------------------------------------------------------------
pub const LIST_WORKSPACES: Route = get(path::WORKSPACES, JsonList("Workspace"), &[Unauthenticated]);
pub const CREATE_WORKSPACE: Route = create(
    path::WORKSPACES,
    Json("CreateWorkspaceRequest"),
    Json("Workspace"),
    &[Unauthenticated, Forbidden, Conflict, InvalidArgument],
);
/// By id, slug or name.
pub const FIND_WORKSPACE: Route = get(path::WORKSPACE, Json("Workspace"), &[Unauthenticated, NotFound, Conflict]);
/// Sets the workspace's volume quota. Unscoped keys only.
pub const UPDATE_WORKSPACE: Route = route(
    Patch,
    path::WORKSPACE,
    Json("UpdateWorkspaceRequest"),
    200,
    Json("Workspace"),
    &[Unauthenticated, AccountScopeRequired, NotFound, Conflict, InvalidArgument],
);
/// `?force=true` deletes what it holds too.
pub const DELETE_WORKSPACE: Route = delete(path::WORKSPACE, &[Unauthenticated, NotFound, Conflict, InvalidArgument]);
pub const LIST_PROJECTS: Route =
    get(path::PROJECTS, JsonList("Project"), &[Unauthenticated, NotFound, InvalidArgument]);
pub const CREATE_PROJECT: Route = create(
    path::PROJECTS,
    Json("CreateProjectRequest"),
    Json("Project"),
    &[Unauthenticated, NotFound, Conflict, InvalidArgument],
);
/// By id, slug or name.
pub const GET_PROJECT: Route = get(path::PROJECT, Json("Project"), &[Unauthenticated, NotFound, Conflict]);
pub const RENAME_PROJECT: Route = route(
    Patch,
    path::PROJECT,
    Json("UpdateProjectRequest"),
    200,
    Json("Project"),
    &[Unauthenticated, NotFound, Conflict, InvalidArgument],
);
pub const DELETE_PROJECT: Route = delete(path::PROJECT, &[Unauthenticated, NotFound, Conflict]);
pub const LIST_API_KEYS: Route = get(path::API_KEYS, JsonList("ApiKey"), &[Unauthenticated]);
/// The answer holds the key itself, shown this once.
pub const CREATE_API_KEY: Route = create(
    path::API_KEYS,
    Json("CreateApiKeyRequest"),
    Json("CreatedApiKey"),
    &[Unauthenticated, Forbidden, NotFound, InvalidArgument],
);
pub const DELETE_API_KEY: Route = delete(path::API_KEY, &[Unauthenticated, NotFound, Conflict]);
pub const WHOAMI: Route = get(path::WHOAMI, Json("WhoAmI"), &[Unauthenticated]);
pub const ACCOUNT: Route = get(path::ACCOUNT, Json("Account"), &[Unauthenticated, AccountScopeRequired]);
pub const LIST_REGIONS: Route = get(path::REGIONS, JsonList("Region"), &[Unauthenticated]);

// --- billing and usage --------------------------------------------------------------------
pub const BALANCE: Route = get(path::BALANCE, Json("Balance"), &[Unauthenticated, AccountScopeRequired]);
/// `?limit=&cursor=&includeUsage=`, newest first.
pub const TRANSACTIONS: Route =
    get(path::TRANSACTIONS, Json("TransactionPage"), &[Unauthenticated, AccountScopeRequired, InvalidArgument]);
/// `?granularity=month|day&periods=N`.
pub const SUMMARY: Route =
    get(path::SUMMARY, Json("BillingSummary"), &[Unauthenticated, AccountScopeRequired, InvalidArgument]);
pub const LIVE: Route = get(path::LIVE, Json("LiveBilling"), &[Unauthenticated, AccountScopeRequired]);
/// `?ids=a,b,…` (at most [`crate::MAX_COST_IDS`]): what each sandbox has cost so far, for
/// every key (a scoped one gets its own sandboxes'; ids it does not reach are left out).
pub const SANDBOX_COSTS: Route = get(path::SANDBOX_COSTS, JsonList("SandboxCost"), &[Unauthenticated, InvalidArgument]);
/// `?workspaceId=&projectId=&from=&to=`, within the key's scope.
pub const METRICS: Route = get(path::METRICS, Json("Metrics"), &[Unauthenticated, NotFound, InvalidArgument]);

// --- volumes ------------------------------------------------------------------------------
pub const CREATE_VOLUME: Route = create(
    path::VOLUMES,
    Json("CreateVolumeRequest"),
    Json("Volume"),
    &[Unauthenticated, NotFound, Conflict, InvalidArgument, PaymentRequired, QuotaExceeded, IdempotencyKeyReused],
);
/// `?project=` or `?projectId=` for one project.
pub const LIST_VOLUMES: Route = get(path::VOLUMES, JsonList("Volume"), &[Unauthenticated, NotFound, InvalidArgument]);
pub const GET_VOLUME: Route = get(path::VOLUME, Json("Volume"), &[Unauthenticated, NotFound, InvalidArgument]);
pub const DELETE_VOLUME: Route = delete(path::VOLUME, &[Unauthenticated, NotFound, Conflict, InvalidArgument]);

// --- templates ----------------------------------------------------------------------------
// Templates belong to a workspace: `workspace` (id, slug or name) or `project` (its
// workspace) in the query (in the body of a push); a key that reaches one workspace may
// leave both out. A name outside the key's workspaces answers 404.

/// Which of the given content hashes this workspace has not uploaded yet.
pub const MISSING_TEMPLATE_BLOBS: Route = post(
    path::TEMPLATE_BLOBS_MISSING,
    Json("MissingBlobsRequest"),
    Json("MissingBlobs"),
    &[Unauthenticated, NotFound, Conflict, InvalidArgument],
);
/// The body is one file of a pushed directory; its SHA-256 must be the path's.
pub const UPLOAD_TEMPLATE_BLOB: Route =
    route(Put, path::TEMPLATE_BLOB, Bytes, 204, Empty, &[Unauthenticated, NotFound, Conflict, InvalidArgument]);
/// Starts a build (in the background) of a recipe over the uploaded directory.
pub const PUSH_TEMPLATE: Route = route(
    Post,
    path::TEMPLATES,
    Json("PushTemplateRequest"),
    202,
    Json("TemplateBuildInfo"),
    &[Unauthenticated, NotFound, Conflict, InvalidArgument],
);
/// Built-ins and the templates of the key's workspaces.
pub const LIST_TEMPLATES: Route =
    get(path::TEMPLATES, JsonList("TemplateInfo"), &[Unauthenticated, NotFound, Conflict, InvalidArgument]);
pub const GET_TEMPLATE: Route =
    get(path::TEMPLATE, Json("TemplateInfo"), &[Unauthenticated, NotFound, Conflict, InvalidArgument]);
/// Refused while sandboxes use it (409) and for built-ins (403).
pub const DELETE_TEMPLATE: Route =
    delete(path::TEMPLATE, &[Unauthenticated, Forbidden, NotFound, Conflict, InvalidArgument]);
pub const GET_TEMPLATE_BUILD: Route =
    get(path::TEMPLATE_BUILD, Json("TemplateBuildInfo"), &[Unauthenticated, NotFound, Conflict, InvalidArgument]);
/// The build's events from the first, following it until `done`.
pub const TEMPLATE_BUILD_EVENTS: Route =
    get(path::TEMPLATE_BUILD_EVENTS, Ndjson("BuildEvent"), &[Unauthenticated, NotFound, Conflict, InvalidArgument]);
/// Cancels a queued or running build (a finished one answers 409).
pub const CANCEL_TEMPLATE_BUILD: Route =
    delete(path::TEMPLATE_BUILD, &[Unauthenticated, NotFound, Conflict, InvalidArgument]);

// --- services (see [`crate::services`]) --------------------------------------------------
// A service belongs to a project; a name outside the key's scope answers 404.

/// A new service (409 when the name is taken) and its first version, built and rolled
/// out in the background: the answer shows the version `building`.
pub const CREATE_SERVICE: Route = route(
    Post,
    path::SERVICES,
    Json("CreateServiceRequest"),
    202,
    Json("ServiceInfo"),
    &[Unauthenticated, NotFound, Conflict, InvalidArgument, PaymentRequired],
);
/// `?project=` or `?projectId=` for one project.
pub const LIST_SERVICES: Route =
    get(path::SERVICES, JsonList("ServiceInfo"), &[Unauthenticated, NotFound, InvalidArgument]);
pub const GET_SERVICE: Route = get(path::SERVICE, Json("ServiceInfo"), &[Unauthenticated, NotFound]);
/// A new version (409 while another is building or starting).
pub const DEPLOY_SERVICE: Route = route(
    Post,
    path::SERVICE_VERSIONS,
    Json("DeployServiceRequest"),
    202,
    Json("ServiceInfo"),
    &[Unauthenticated, NotFound, Conflict, InvalidArgument, PaymentRequired],
);
/// Back to an earlier version (its layer is kept): its instances start, pass health,
/// take the traffic, and the current ones drain.
pub const ROLLBACK_SERVICE: Route = post(
    path::SERVICE_ROLLBACK,
    Json("RollbackRequest"),
    Json("ServiceInfo"),
    &[Unauthenticated, NotFound, Conflict, InvalidArgument],
);
/// `lizard down`: every instance stopped, every version's layer deleted, the name freed.
pub const DELETE_SERVICE: Route = delete(path::SERVICE, &[Unauthenticated, NotFound, Conflict]);
/// `?tail=N` (bytes per instance, default 64 KiB); `?follow=true` keeps the stream open
/// and sends new output as it comes.
pub const SERVICE_LOGS: Route =
    get(path::SERVICE_LOGS, Ndjson("ServiceLogLine"), &[Unauthenticated, NotFound, InvalidArgument]);

// --- many machines (see [`crate::cluster`]) -----------------------------------------------
// Node → server: a join token (join) or the node's credential (the rest) as the bearer.
/// A node joins with a join token; answers its id and credential.
pub const CLUSTER_JOIN: Route =
    post(path::CLUSTER_JOIN, Json("JoinRequest"), Json("JoinResponse"), &[Unauthenticated, InvalidArgument]);
pub const CLUSTER_HEARTBEAT: Route = post(
    path::CLUSTER_HEARTBEAT,
    Json("NodeReport"),
    Json("HeartbeatResponse"),
    &[Unauthenticated, NotFound, InvalidArgument],
);
pub const CLUSTER_EVENTS: Route = route(
    Post,
    path::CLUSTER_EVENTS,
    JsonList("SandboxEnded"),
    204,
    Empty,
    &[Unauthenticated, NotFound, InvalidArgument],
);
pub const CLUSTER_HALTS: Route = route(
    Post,
    path::CLUSTER_HALTS,
    JsonList("SandboxHalt"),
    204,
    Empty,
    &[Unauthenticated, NotFound, InvalidArgument],
);
// Operator (an unscoped key of the owner account; others answer 403).
pub const LIST_NODES: Route = get(path::NODES, JsonList("NodeInfo"), &[Unauthenticated, Forbidden]);
pub const GET_NODE: Route = get(path::NODE, Json("NodeInfo"), &[Unauthenticated, Forbidden, NotFound]);
/// No new sandboxes on it; what runs or is paused there stays until it ends.
pub const DRAIN_NODE: Route = post(path::NODE_DRAIN, Empty, Json("NodeInfo"), &[Unauthenticated, Forbidden, NotFound]);
pub const UNDRAIN_NODE: Route =
    post(path::NODE_UNDRAIN, Empty, Json("NodeInfo"), &[Unauthenticated, Forbidden, NotFound, Conflict]);
/// Forget a node with nothing on it: its credential is refused from then on.
pub const REMOVE_NODE: Route = delete(path::NODE, &[Unauthenticated, Forbidden, NotFound, Conflict]);
pub const CREATE_NODE_TOKEN: Route = create(
    path::NODE_TOKENS,
    Json("CreateNodeTokenRequest"),
    Json("NodeToken"),
    &[Unauthenticated, Forbidden, InvalidArgument],
);
pub const LIST_NODE_TOKENS: Route = get(path::NODE_TOKENS, JsonList("NodeToken"), &[Unauthenticated, Forbidden]);
pub const REVOKE_NODE_TOKEN: Route = delete(path::NODE_TOKEN, &[Unauthenticated, Forbidden, NotFound]);

/// Every route of the control plane (`lizard server`), as its OpenAPI document lists them.
pub const SERVER: &[Route] = &[
    HEALTH,
    OPENAPI,
    CREATE_SANDBOX,
    LIST_SANDBOXES,
    GET_SANDBOX,
    KILL_SANDBOX,
    SET_TIMEOUT,
    SET_NETWORK,
    SIGN_URL,
    PAUSE,
    RESUME,
    CONNECT,
    FORK,
    EXEC,
    READ_FILE,
    WRITE_FILE,
    REMOVE_FILE,
    LIST_DIR,
    MAKE_DIR,
    FILE_INFO,
    FILE_EXISTS,
    RENAME_FILE,
    WATCH_DIR,
    READ_ARCHIVE,
    WRITE_ARCHIVE,
    START_PROCESS,
    LIST_PROCESSES,
    PROCESS_OUTPUT,
    PROCESS_STDIN,
    CLOSE_PROCESS_STDIN,
    SIGNAL_PROCESS,
    RESIZE_PROCESS,
    LIST_PORTS,
    WAIT_FOR_PORT,
    PTY,
    RUN_CODE,
    LIST_CODE_CONTEXTS,
    CREATE_CODE_CONTEXT,
    REMOVE_CODE_CONTEXT,
    RESTART_CODE_CONTEXT,
    LIST_WORKSPACES,
    CREATE_WORKSPACE,
    FIND_WORKSPACE,
    UPDATE_WORKSPACE,
    DELETE_WORKSPACE,
    LIST_PROJECTS,
    CREATE_PROJECT,
    GET_PROJECT,
    RENAME_PROJECT,
    DELETE_PROJECT,
    LIST_API_KEYS,
    CREATE_API_KEY,
    DELETE_API_KEY,
    WHOAMI,
    ACCOUNT,
    LIST_REGIONS,
    BALANCE,
    TRANSACTIONS,
    SUMMARY,
    LIVE,
    SANDBOX_COSTS,
    METRICS,
    CREATE_VOLUME,
    LIST_VOLUMES,
    GET_VOLUME,
    DELETE_VOLUME,
    MISSING_TEMPLATE_BLOBS,
    UPLOAD_TEMPLATE_BLOB,
    PUSH_TEMPLATE,
    LIST_TEMPLATES,
    GET_TEMPLATE,
    DELETE_TEMPLATE,
    GET_TEMPLATE_BUILD,
    TEMPLATE_BUILD_EVENTS,
    CANCEL_TEMPLATE_BUILD,
    CREATE_SERVICE,
    LIST_SERVICES,
    GET_SERVICE,
    DEPLOY_SERVICE,
    ROLLBACK_SERVICE,
    DELETE_SERVICE,
    SERVICE_LOGS,
    CLUSTER_JOIN,
    CLUSTER_HEARTBEAT,
    CLUSTER_EVENTS,
    CLUSTER_HALTS,
    LIST_NODES,
    GET_NODE,
    DRAIN_NODE,
    UNDRAIN_NODE,
    REMOVE_NODE,
    CREATE_NODE_TOKEN,
    LIST_NODE_TOKENS,
    REVOKE_NODE_TOKEN,
];

/// The node's own API: the sandbox routes without tenancy (so without keys, projects or
/// timeouts, and with what a VM can answer), and what only the control plane asks of a
/// node (volumes, template builds, port tunnels: [`node::NODE_ONLY`]).
///
/// Local mode serves it on a Unix socket readable only by its owner; a node agent (`lizard
/// node join`) on TCP, where every route but [`node::HEALTH`] needs `Authorization: Bearer
/// <node credential>` (401 `UNAUTHENTICATED` without it: a transport check, so the table
/// does not list it).
pub mod node {
    use super::*;

    /// What every node sandbox route can answer besides success.
    const VM_ERRORS: &[ErrorCode] = &[NotFound, InvalidArgument, Conflict, BootFailed, Unavailable];

    pub const HEALTH: Route = super::HEALTH;
    /// Takes a [`crate::CreateSandboxRequest`] (no project; a volume by id on this node).
    pub const CREATE_SANDBOX: Route =
        Route { request: Json("CreateSandboxRequest"), errors: VM_ERRORS, ..super::CREATE_SANDBOX };
    pub const LIST_SANDBOXES: Route = Route { errors: &[], ..super::LIST_SANDBOXES };
    pub const GET_SANDBOX: Route = Route { errors: &[NotFound], ..super::GET_SANDBOX };
    pub const KILL_SANDBOX: Route = Route { errors: VM_ERRORS, ..super::KILL_SANDBOX };
    pub const SET_NETWORK: Route = Route { errors: VM_ERRORS, ..super::SET_NETWORK };
    pub const PAUSE: Route = Route { errors: VM_ERRORS, ..super::PAUSE };
    pub const RESUME: Route = Route { errors: VM_ERRORS, ..super::RESUME };
    pub const CONNECT: Route = Route { errors: VM_ERRORS, ..super::CONNECT };
    pub const FORK: Route = Route { errors: VM_ERRORS, ..super::FORK };
    pub const EXEC: Route = Route { errors: VM_ERRORS, ..super::EXEC };
    pub const READ_FILE: Route = Route { errors: VM_ERRORS, ..super::READ_FILE };
    pub const WRITE_FILE: Route = Route { errors: VM_ERRORS, ..super::WRITE_FILE };
    pub const REMOVE_FILE: Route = Route { errors: VM_ERRORS, ..super::REMOVE_FILE };
    pub const LIST_DIR: Route = Route { errors: VM_ERRORS, ..super::LIST_DIR };
    pub const MAKE_DIR: Route = Route { errors: VM_ERRORS, ..super::MAKE_DIR };
    pub const FILE_INFO: Route = Route { errors: VM_ERRORS, ..super::FILE_INFO };
    pub const RENAME_FILE: Route = Route { errors: VM_ERRORS, ..super::RENAME_FILE };
    pub const WATCH_DIR: Route = Route { errors: VM_ERRORS, ..super::WATCH_DIR };
    pub const READ_ARCHIVE: Route = Route { errors: VM_ERRORS, ..super::READ_ARCHIVE };
    pub const WRITE_ARCHIVE: Route = Route { errors: VM_ERRORS, ..super::WRITE_ARCHIVE };
    pub const START_PROCESS: Route = Route { errors: VM_ERRORS, ..super::START_PROCESS };
    pub const LIST_PROCESSES: Route = Route { errors: VM_ERRORS, ..super::LIST_PROCESSES };
    pub const PROCESS_OUTPUT: Route = Route { errors: VM_ERRORS, ..super::PROCESS_OUTPUT };
    pub const PROCESS_STDIN: Route = Route { errors: VM_ERRORS, ..super::PROCESS_STDIN };
    pub const CLOSE_PROCESS_STDIN: Route = Route { errors: VM_ERRORS, ..super::CLOSE_PROCESS_STDIN };
    pub const SIGNAL_PROCESS: Route = Route { errors: VM_ERRORS, ..super::SIGNAL_PROCESS };
    pub const RESIZE_PROCESS: Route = Route { errors: VM_ERRORS, ..super::RESIZE_PROCESS };
    pub const LIST_PORTS: Route = Route { errors: VM_ERRORS, ..super::LIST_PORTS };
    /// 408 `TIMED_OUT` too.
    pub const WAIT_FOR_PORT: Route = Route {
        errors: &[NotFound, InvalidArgument, Conflict, BootFailed, Unavailable, TimedOut],
        ..super::WAIT_FOR_PORT
    };

    /// Makes a volume's disk ([`crate::node_api::NodeVolumeRequest`]).
    pub const CREATE_VOLUME: Route =
        route(Put, path::NODE_VOLUME, Json("NodeVolumeRequest"), 204, Empty, &[InvalidArgument, Conflict, Unavailable]);
    /// Refused (409) while a sandbox holds it.
    pub const DELETE_VOLUME: Route = delete(path::NODE_VOLUME, &[NotFound, Conflict, Unavailable]);
    pub const VOLUME_HOLDER: Route = get(path::NODE_VOLUME_HOLDER, Json("VolumeHolder"), &[]);
    /// A build: see [`crate::node_api`] for the body; the answer streams as the build
    /// runs, and closing the connection cancels the build.
    pub const BUILD_TEMPLATE: Route =
        post(path::NODE_BUILDS, Bytes, Ndjson("NodeBuildLine"), &[InvalidArgument, Unavailable]);
    pub const BUILTIN_TEMPLATES: Route = get(path::NODE_BUILTIN_TEMPLATES, JsonList("BuiltinTemplateInfo"), &[]);
    /// Refused (409) while a sandbox uses it.
    pub const DELETE_TEMPLATE: Route = delete(path::NODE_TEMPLATE, &[InvalidArgument, NotFound, Conflict]);
    /// `Connection: upgrade`, `Upgrade: lizard-tunnel`: after 101, the connection carries
    /// raw bytes to and from the guest's port (on the guest's loopback).
    pub const CONNECT_PORT: Route = route(Get, path::NODE_PORT, Empty, 101, Bytes, VM_ERRORS);
    /// Save a running sandbox as a snapshot ([`crate::node_api::NodeSandboxSnapshot`]); a
    /// create naming it in `snapshot` starts from it.
    pub const SNAPSHOT_SANDBOX: Route =
        create(path::NODE_SANDBOX_SNAPSHOTS, Empty, Json("NodeSandboxSnapshot"), VM_ERRORS);
    /// Sandboxes started from the snapshot keep what they need.
    pub const DELETE_SNAPSHOT: Route = delete(path::NODE_SNAPSHOT, &[NotFound]);

    /// The routes a node serves that the control plane does not.
    pub const NODE_ONLY: &[Route] = &[
        CREATE_VOLUME,
        DELETE_VOLUME,
        VOLUME_HOLDER,
        BUILD_TEMPLATE,
        BUILTIN_TEMPLATES,
        DELETE_TEMPLATE,
        CONNECT_PORT,
        SNAPSHOT_SANDBOX,
        DELETE_SNAPSHOT,
    ];

    /// The `Upgrade` protocol of [`CONNECT_PORT`].
    pub const TUNNEL_PROTOCOL: &str = "lizard-tunnel";

    /// Every route the node serves.
    pub const ALL: &[Route] = &[
        HEALTH,
        CREATE_SANDBOX,
        LIST_SANDBOXES,
        GET_SANDBOX,
        KILL_SANDBOX,
        SET_NETWORK,
        PAUSE,
        RESUME,
        CONNECT,
        FORK,
        EXEC,
        READ_FILE,
        WRITE_FILE,
        REMOVE_FILE,
        LIST_DIR,
        MAKE_DIR,
        FILE_INFO,
        RENAME_FILE,
        WATCH_DIR,
        READ_ARCHIVE,
        WRITE_ARCHIVE,
        START_PROCESS,
        LIST_PROCESSES,
        PROCESS_OUTPUT,
        PROCESS_STDIN,
        CLOSE_PROCESS_STDIN,
        SIGNAL_PROCESS,
        RESIZE_PROCESS,
        LIST_PORTS,
        WAIT_FOR_PORT,
        CREATE_VOLUME,
        DELETE_VOLUME,
        VOLUME_HOLDER,
        BUILD_TEMPLATE,
        BUILTIN_TEMPLATES,
        DELETE_TEMPLATE,
        CONNECT_PORT,
        SNAPSHOT_SANDBOX,
        DELETE_SNAPSHOT,
    ];
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn uri_fills_and_encodes_parameters_in_order() {
        assert_eq!(GET_SANDBOX.uri(&["sbx_1"]), "/v1/sandboxes/sbx_1");
        assert_eq!(GET_VOLUME.uri(&["a b/c"]), "/v1/volumes/a%20b%2Fc");
        assert_eq!(LIST_SANDBOXES.uri(&[]), "/v1/sandboxes");
        assert_eq!(LIST_DIR.uri(&["x"]), "/v1/sandboxes/x/files/list");
        assert_eq!(READ_FILE.params().collect::<Vec<_>>(), ["id"]);
        assert_eq!(GET_VOLUME.params().collect::<Vec<_>>(), ["nameOrId"]);
    }

    #[test]
    fn query_parameters_follow_the_path_encoded() {
        let mut uri = GET_VOLUME.uri(&["a?b"]);
        push_query(&mut uri, "q", "1 & 2");
        push_query(&mut uri, "n", "3");
        assert_eq!(uri, "/v1/volumes/a%3Fb?q=1%20%26%202&n=3");
    }

    #[test]
    #[should_panic(expected = "too few path arguments")]
    fn uri_refuses_missing_arguments() {
        GET_SANDBOX.uri(&[]);
    }

    #[test]
    #[should_panic(expected = "too many path arguments")]
    fn uri_refuses_extra_arguments() {
        LIST_SANDBOXES.uri(&["x"]);
    }

    #[test]
    fn each_method_and_path_is_described_once() {
        for table in [SERVER, node::ALL] {
            let mut seen = HashSet::new();
            for r in table {
                assert!(seen.insert((r.method, r.path)), "{} {} twice", r.method.as_str(), r.path);
                assert!(r.path.starts_with('/') && ((200..300).contains(&r.status) || r.status == 101), "{r:?}");
            }
        }
    }

    #[test]
    fn the_node_serves_a_subset_of_the_server_routes() {
        let server: HashSet<_> = SERVER.iter().map(|r| (r.method, r.path, r.status)).collect();
        for r in node::ALL.iter().filter(|r| !node::NODE_ONLY.contains(r)) {
            assert!(server.contains(&(r.method, r.path, r.status)), "{r:?}");
            assert!(!r.errors.contains(&Unauthenticated), "the node has no keys: {r:?}");
        }
        for r in node::NODE_ONLY {
            assert!(node::ALL.contains(r), "{r:?}");
            assert!(r.path.starts_with("/v1/node/"), "node-only routes live apart: {r:?}");
            assert!(!SERVER.iter().any(|s| s.path == r.path), "{r:?}");
        }
    }
}

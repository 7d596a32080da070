//! The OpenAPI document, generated from the code: the handlers' `#[utoipa::path]`
//! attributes (collected by [`utoipa_axum`] as routes are registered) and the schemas
//! derived on [`lizard_api`]'s types. Served at `GET /openapi.json`.
//!
//! The error body `{code, message}` is [`lizard_api::ApiError`] itself, with its
//! [`lizard_api::ErrorCode`]: one definition for the wire and the document.

use std::collections::BTreeMap;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Content, Ref, RefOr, Response, ResponseBuilder};
use utoipa::{Modify, OpenApi};

/// Name of the security scheme every authenticated route lists.
pub const SECURITY_SCHEME: &str = "apiKey";

/// Name of the security scheme of the routes nodes call (a join token or the node's
/// credential as the bearer token).
pub const NODE_SECURITY_SCHEME: &str = "nodeBearer";

fn error_response(description: &str) -> RefOr<Response> {
    ResponseBuilder::new()
        .description(description)
        .content("application/json", Content::new(Some(Ref::from_schema_name("ApiError"))))
        .build()
        .into()
}

macro_rules! error_responses {
    ($($(#[$doc:meta])* $name:ident => $status:literal, $desc:literal;)*) => {$(
        $(#[$doc])*
        pub struct $name;
        impl utoipa::IntoResponses for $name {
            fn responses() -> BTreeMap<String, RefOr<Response>> {
                BTreeMap::from([($status.to_string(), error_response($desc))])
            }
        }
    )*};
}

error_responses! {
    /// 401: no key, or not a valid one.
    Unauthenticated => "401", "UNAUTHENTICATED: missing, unknown or revoked X-API-Key";
    /// 403 for scope violations.
    Forbidden => "403", "FORBIDDEN: the key's scope does not allow this";
    /// 403 on account-wide routes.
    AccountScopeRequired => "403", "ACCOUNT_SCOPE_REQUIRED: account-wide route; needs an unscoped key";
    /// 404, also for what lies outside the key's scope.
    NotFound => "404", "NOT_FOUND: does not exist, or is outside the key's scope";
    /// 409.
    Conflict => "409", "CONFLICT: duplicate name, not empty, or ambiguous name";
    /// 422.
    InvalidArgument => "422", "INVALID_ARGUMENT: malformed body, unknown field or bad value";
    /// 402: no credits left.
    PaymentRequired => "402", "PAYMENT_REQUIRED: the account's balance is zero or below";
    /// 502 from the code routes.
    CodeServiceUnavailable => "502", "CODE_SERVICE_UNAVAILABLE: the sandbox runs no code service (use the interpreter template), or it stopped answering";
    /// 408 from a port wait.
    TimedOut => "408", "TIMED_OUT: nothing listened on the port within timeoutMs";
    /// 403 from a volume create.
    QuotaExceeded => "403", "QUOTA_EXCEEDED: the account's or the workspace's volume quota has no room for it";
}

struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            SECURITY_SCHEME,
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "X-API-Key",
                "An API key (lz_…). Unscoped keys reach the whole account; scoped keys only their workspaces and projects.",
            ))),
        );
        components.add_security_scheme(
            NODE_SECURITY_SCHEME,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "Node → server: a join token (lzn_…) to join, then the node's credential from the join answer.",
                    ))
                    .build(),
            ),
        );
    }
}

/// Document 429 `RATE_LIMITED` on every operation that takes a key: the front door
/// ([`crate::front_door`]) can answer it before any handler. Run on the finished document
/// (paths are added as routes are registered, after [`ApiDoc`]'s modifiers).
pub fn add_rate_limited(doc: &mut utoipa::openapi::OpenApi) {
    for item in doc.paths.paths.values_mut() {
        let ops = [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.patch];
        for op in ops.into_iter().flatten() {
            if op.security.as_ref().is_some_and(|s| !s.is_empty()) {
                op.responses.responses.entry("429".into()).or_insert_with(|| {
                    error_response(
                        "RATE_LIMITED: this key's request rate or requests in flight; retry after Retry-After",
                    )
                });
            }
        }
    }
}

/// The document's frame; paths are added as routes are registered.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Lizard API",
        description = "Self-hosted microVM sandboxes for AI agents: control plane. JSON is camelCase; every error is `{code, message}`."
    ),
    components(schemas(lizard_api::ApiError, lizard_api::ErrorCode)),
    modifiers(&Security),
    tags(
        (name = "workspaces", description = "Isolation units of an account"),
        (name = "projects", description = "What sandboxes and volumes live in and are billed to"),
        (name = "api-keys", description = "Scoped and unscoped API keys"),
        (name = "account", description = "Identity and account"),
        (name = "regions", description = "Where sandboxes can run"),
        (name = "volumes", description = "Disks that outlive sandboxes, mounted at /workspace"),
        (name = "processes", description = "Background processes, terminals (PTYs, also as a WebSocket) and waiting for a port, inside a sandbox"),
        (name = "code", description = "Stateful code execution in the interpreter template: run code, code contexts"),
        (name = "templates", description = "Templates pushed as code (a recipe and a directory), built inside microVMs, and their builds"),
        (name = "billing", description = "The account's balance, ledger and spend (unscoped keys only)"),
        (name = "metrics", description = "Usage per workspace and project, within the key's scope"),
        (name = "nodes", description = "Many machines: the nodes (operator only: an unscoped key of the owner account) and join tokens"),
        (name = "cluster", description = "What node agents call: join, heartbeat, sandbox-ended events"),
        (name = "system", description = "Health and this document")
    )
)]
pub struct ApiDoc;

#[cfg(test)]
mod tests {
    use super::*;
    use lizard_api::ErrorCode;

    /// Every code `lizard_api` has, by an exhaustive match: adding a code there fails
    /// to compile here until the schema lists it too.
    fn all_codes() -> Vec<ErrorCode> {
        use ErrorCode::*;
        let all = vec![
            InvalidArgument,
            Unauthenticated,
            Forbidden,
            NotFound,
            Conflict,
            BootFailed,
            PortClosed,
            Unavailable,
            Internal,
            AccountScopeRequired,
            RateLimited,
            PaymentRequired,
            CodeServiceUnavailable,
            OutputTooLarge,
            IdempotencyKeyReused,
            TimedOut,
            QuotaExceeded,
        ];
        for c in &all {
            match c {
                InvalidArgument
                | Unauthenticated
                | Forbidden
                | NotFound
                | Conflict
                | BootFailed
                | PortClosed
                | Unavailable
                | Internal
                | AccountScopeRequired
                | RateLimited
                | PaymentRequired
                | CodeServiceUnavailable
                | OutputTooLarge
                | IdempotencyKeyReused
                | TimedOut
                | QuotaExceeded => {}
            }
        }
        all
    }

    #[test]
    fn error_schema_matches_api_error_codes() {
        let schema = serde_json::to_value(<ErrorCode as utoipa::PartialSchema>::schema()).unwrap();
        let listed: Vec<String> = serde_json::from_value(schema["enum"].clone()).expect("the schema is a string enum");
        let actual: Vec<String> =
            all_codes().into_iter().map(|c| serde_json::to_value(c).unwrap().as_str().unwrap().to_string()).collect();
        assert_eq!(listed, actual);
    }

    #[test]
    fn document_lists_every_route_with_schemas_and_errors() {
        let doc = crate::openapi_document(crate::api::routes::<crate::ServerState>());
        let v = serde_json::to_value(&doc).unwrap();
        let expected: &[(&str, &[&str])] = &[
            ("/health", &["get"]),
            ("/openapi.json", &["get"]),
            ("/v1/workspaces", &["get", "post"]),
            ("/v1/workspaces/{id}", &["get", "delete"]),
            ("/v1/projects", &["get", "post"]),
            ("/v1/projects/{id}", &["get", "patch", "delete"]),
            ("/v1/api-keys", &["get", "post"]),
            ("/v1/api-keys/{id}", &["delete"]),
            ("/v1/whoami", &["get"]),
            ("/v1/account", &["get"]),
            ("/v1/regions", &["get"]),
            ("/v1/billing/balance", &["get"]),
            ("/v1/billing/transactions", &["get"]),
            ("/v1/billing/summary", &["get"]),
            ("/v1/billing/live", &["get"]),
            ("/v1/billing/sandboxes", &["get"]),
            ("/v1/metrics", &["get"]),
        ];
        let paths = v["paths"].as_object().unwrap();
        let mut listed: Vec<&str> = paths.keys().map(String::as_str).collect();
        listed.sort();
        let mut want: Vec<&str> = expected.iter().map(|e| e.0).collect();
        want.sort();
        assert_eq!(listed, want);
        for (path, methods) in expected {
            for m in *methods {
                let op = &paths[*path][*m];
                assert!(op.is_object(), "{m} {path} missing");
                let responses = op["responses"].as_object().unwrap();
                assert!(responses.keys().any(|c| c.starts_with('2')), "{m} {path}: no success response");
                if !path.starts_with("/v1/") {
                    continue;
                }
                assert_eq!(op["security"][0][SECURITY_SCHEME], serde_json::json!([]), "{m} {path}: no security");
                let unauth = &responses["401"]["content"]["application/json"]["schema"]["$ref"];
                assert_eq!(unauth, "#/components/schemas/ApiError", "{m} {path}");
                if ["post", "patch"].contains(m) {
                    let body = &op["requestBody"]["content"]["application/json"]["schema"]["$ref"];
                    assert!(
                        body.as_str().is_some_and(|r| r.starts_with("#/components/schemas/")),
                        "{m} {path}: {body}"
                    );
                    assert!(responses.contains_key("422"), "{m} {path}: no 422");
                }
            }
        }
        let schemas = v["components"]["schemas"].as_object().unwrap();
        for s in [
            "ApiError",
            "ErrorCode",
            "Workspace",
            "CreateWorkspaceRequest",
            "Project",
            "CreateProjectRequest",
            "UpdateProjectRequest",
            "UpdateWorkspaceRequest",
            "ApiKey",
            "CreateApiKeyRequest",
            "CreatedApiKey",
            "WhoAmI",
            "Account",
            "Region",
            "Balance",
            "TransactionPage",
            "BillingSummary",
            "LiveBilling",
            "Metrics",
        ] {
            assert!(schemas.contains_key(s), "schema {s} missing");
        }
        assert_eq!(v["components"]["securitySchemes"][SECURITY_SCHEME]["name"], "X-API-Key");
        // camelCase on the wire, and the schema says so.
        assert!(schemas["Project"]["properties"]["workspaceId"].is_object());
    }
}

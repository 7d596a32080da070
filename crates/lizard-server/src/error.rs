//! Errors as the API answers them: always `{code, message}` ([`lizard_api::ApiError`]) with
//! the code's HTTP status, never axum's plain-text rejections.
//!
//! Internal failures (a database error) are logged here with their cause and answered
//! with a generic message: the cause may name files or SQL that a client has no business
//! seeing.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use lizard_api::ids::NameError;
use lizard_api::{ApiError, ErrorCode};
use lizard_store::StoreError;
use serde::de::DeserializeOwned;

/// An error answer. Build one with the constructors, or `?` a [`StoreError`].
#[derive(Debug)]
pub struct AppError(pub ApiError);

impl AppError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        AppError(ApiError::new(code, message))
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidArgument, message)
    }
    pub fn unauthenticated(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Unauthenticated, message)
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Forbidden, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, message)
    }
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Conflict, message)
    }
    pub fn account_scope_required() -> Self {
        Self::new(
            ErrorCode::AccountScopeRequired,
            "this endpoint is account-wide and needs an unscoped API key; this key is scoped to workspaces or projects",
        )
    }
    /// Log `cause` and answer 500 without it, naming the request id under which the
    /// operator's log has it.
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        tracing::error!(%cause, "internal error");
        Self::new(ErrorCode::Internal, internal_message())
    }
    pub fn code(&self) -> ErrorCode {
        self.0.code
    }
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for AppError {}

/// What a client is told of an internal failure: nothing of its cause, and the request
/// id to quote to the operator.
fn internal_message() -> String {
    match crate::request_id::current() {
        Some(id) => format!("internal error (request id {id}; the operator's log has the cause)"),
        None => "internal error".into(),
    }
}

impl From<ApiError> for AppError {
    /// A node's answer. Its internal failures were logged by the node with their cause
    /// (inside this request's span); the client gets the safe message and the request id.
    fn from(e: ApiError) -> Self {
        if e.code == ErrorCode::Internal {
            return AppError::new(ErrorCode::Internal, internal_message());
        }
        AppError(e)
    }
}

impl From<StoreError> for AppError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(what) => AppError::not_found(format!("{what} not found")),
            StoreError::Conflict(m) | StoreError::NotEmpty(m) => AppError::conflict(m),
            StoreError::OverQuota(m) => AppError::new(ErrorCode::QuotaExceeded, m),
            StoreError::Unavailable(cause) => {
                tracing::error!(%cause, "the database is unavailable");
                AppError::new(ErrorCode::Unavailable, "the database is unavailable; retry shortly")
            }
            e @ (StoreError::SchemaTooNew { .. } | StoreError::UnknownValue { .. } | StoreError::Backend(_)) => {
                AppError::internal(e)
            }
        }
    }
}

impl From<NameError> for AppError {
    fn from(e: NameError) -> Self {
        AppError::invalid(e.to_string())
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.0.code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(self.0)).into_response()
    }
}

pub type ApiResult<T> = std::result::Result<T, AppError>;

/// A JSON request body whose every failure (syntax, missing field, unknown field, wrong
/// type) answers 422 `INVALID_ARGUMENT` with serde's explanation. The body is parsed
/// whatever the `Content-Type`: clients that forget the header still get a useful answer.
pub struct ApiJson<T>(pub T);

/// How long a JSON body may take to arrive, when the front door sets it (a client that
/// trickles its body would otherwise hold its connection and handler forever).
#[derive(Debug, Clone, Copy)]
pub struct BodyReadTimeout(pub std::time::Duration);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = AppError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let limit = req.extensions().get::<BodyReadTimeout>().map(|t| t.0);
        let read = axum::body::Bytes::from_request(req, state);
        let read = match limit {
            Some(limit) => tokio::time::timeout(limit, read)
                .await
                .map_err(|_| AppError::invalid(format!("the request body did not arrive within {limit:?}")))?,
            None => read.await,
        };
        let bytes = read.map_err(|e| AppError::invalid(format!("could not read request body: {e}")))?;
        serde_json::from_slice(&bytes).map(ApiJson).map_err(|e| AppError::invalid(format!("invalid request body: {e}")))
    }
}

/// Query parameters with the same 422 answer as [`ApiJson`].
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| ApiQuery(q.0))
            .map_err(|e: QueryRejection| AppError::invalid(format!("invalid query: {}", e.body_text())))
    }
}

/// Path parameters with a `{code, message}` answer.
pub struct ApiPath<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiPath<T> {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| ApiPath(p.0))
            .map_err(|e: PathRejection| AppError::invalid(format!("invalid path: {}", e.body_text())))
    }
}

/// Answer for routes that do not exist.
pub async fn no_route(method: axum::http::Method, uri: axum::http::Uri) -> AppError {
    AppError::not_found(format!("no route for {method} {}", uri.path()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_errors_map_to_codes() {
        assert_eq!(AppError::from(StoreError::NotFound("project p".into())).code(), ErrorCode::NotFound);
        assert_eq!(AppError::from(StoreError::Conflict("dup".into())).code(), ErrorCode::Conflict);
        assert_eq!(AppError::from(StoreError::NotEmpty("busy".into())).code(), ErrorCode::Conflict);
        let internal = AppError::from(StoreError::Backend("disk on fire at /secret/path".into()));
        assert_eq!(internal.code(), ErrorCode::Internal);
        assert!(!internal.0.message.contains("/secret"), "causes are logged, not answered");
        let down = AppError::from(StoreError::Unavailable("connect 10.0.0.9:5432: refused".into()));
        assert_eq!(down.code(), ErrorCode::Unavailable);
        assert!(!down.0.message.contains("10.0.0.9"), "{}", down.0.message);
        assert_eq!(AppError::account_scope_required().code().status(), 403);
    }
}

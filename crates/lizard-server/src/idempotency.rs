//! `Idempotency-Key` on the calls a client must be able to retry without doing the work
//! twice: create sandbox, exec, fork, create volume ([`ROUTES`]), and the faces' own
//! ([`crate::state::Face::idempotent_paths`]: E2B's create and fork).
//!
//! The first request with a key claims (API key, route, idempotency key) in the store
//! with a hash of its path, query and body, is served, and its answer (status and body)
//! is stored; a retry with the same key and the same request gets that answer again
//! (`Idempotency-Replayed: true`) without running anything. The same key with another
//! request answers 422 `IDEMPOTENCY_KEY_REUSED`; while the first is still being served,
//! 409 `CONFLICT` with `Retry-After: 1`. Entries are kept [`RETENTION`].
//!
//! The request is served in a task of its own, so a client that goes away still leaves
//! its answer for its retry. Every answer the handler gives is kept, failures included
//! (a 503 from an exec whose agent channel dropped may come after the command ran: its
//! retry must not run it again); a new attempt takes a new key. An answer that cannot be
//! replayed (a streamed exec, or one larger than [`MAX_STORED_ANSWER`]) is recorded as
//! given: a retry gets 409 saying so. Requests refused before their handler (bad key,
//! rate limit) claim nothing. Kept answers are sealed under the caller's API key
//! ([`sealed`]): the store alone shows none of them.

mod sealed;

use crate::auth::{self, Principal};
use crate::error::{AppError, BodyReadTimeout};
use crate::state::ServerState;
use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use lizard_api::ids;
use lizard_api::{routes, ErrorCode};
use lizard_store::idempotency::{IdempotencyEntry, IdempotencyId, StoredAnswer};
use sha2::{Digest, Sha256};
use std::time::Duration;

/// The request header.
pub const HEADER: &str = "idempotency-key";
/// Set on a replayed answer.
pub const REPLAYED_HEADER: &str = "idempotency-replayed";
/// How long an answer is kept for retries.
pub const RETENTION: Duration = Duration::from_secs(24 * 60 * 60);
/// Longest idempotency key.
pub const MAX_KEY_LEN: usize = 255;
/// Largest answer kept for replay.
pub const MAX_STORED_ANSWER: usize = 32 * 1024 * 1024;
/// Largest request body hashed (the API's body limit).
const MAX_REQUEST_BODY: usize = 2 * 1024 * 1024;
/// Marks a recorded answer that cannot be replayed.
const NOT_KEPT: &str = "application/vnd.lizard.not-kept";

/// The routes that honour the header.
pub const ROUTES: [routes::Route; 4] = [routes::CREATE_SANDBOX, routes::EXEC, routes::FORK, routes::CREATE_VOLUME];

/// The middleware (see the module doc): requests on other routes, without the header
/// or without a valid key pass untouched.
pub async fn layer(State(state): State<ServerState>, req: Request, next: Next) -> Response {
    let Some(route) = idempotent_route(&req, &state.faces) else { return next.run(req).await };
    let Some(key) = req.headers().get(HEADER) else { return next.run(req).await };
    let Some(principal) = req.extensions().get::<Principal>().cloned() else { return next.run(req).await };
    // The key the principal was found by: it seals the kept answer.
    let Some(api_key) = auth::presented_key(req.headers()) else { return next.run(req).await };
    let idem_key = match key.to_str().ok().filter(|k| valid_key(k)) {
        Some(k) => k.to_owned(),
        None => {
            return AppError::invalid(format!("{HEADER} must be 1..={MAX_KEY_LEN} visible ASCII characters"))
                .into_response()
        }
    };
    let limit = req.extensions().get::<BodyReadTimeout>().map_or(Duration::from_secs(60), |t| t.0);
    let (parts, body) = req.into_parts();
    let body = match tokio::time::timeout(limit, axum::body::to_bytes(body, MAX_REQUEST_BODY)).await {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => return AppError::invalid(format!("could not read request body: {e}")).into_response(),
        Err(_) => {
            return AppError::invalid(format!("the request body did not arrive within {limit:?}")).into_response()
        }
    };
    let hash = request_hash(parts.uri.path(), parts.uri.query(), &body);
    let id = IdempotencyId { key_id: principal.key_id, route, idem_key };
    let answer_key = sealed::AnswerKey::derive(&api_key, &id);
    let now = ids::now_ms();
    let retention = i64::try_from(RETENTION.as_millis()).unwrap_or(i64::MAX);
    match state.store.claim_idempotent(&id, &hash, now, now.saturating_sub(retention)).await {
        Err(e) => return AppError::from(e).into_response(),
        Ok(Some(entry)) => return answer_existing(entry, &hash, &answer_key),
        Ok(None) => {}
    }
    let req = Request::from_parts(parts, Body::from(body));
    let (store, claimed) = (state.store.clone(), id.clone());
    let work = async move {
        let response = next.run(req).await;
        let (response, mut answer) = keep(response).await;
        answer.body = answer_key.seal(&answer.body);
        if let Err(e) = store.finish_idempotent(&id, &answer).await {
            tracing::error!(route = %id.route, "cannot record an idempotent answer: {e}");
        }
        response
    };
    let work = crate::request_id::scope(crate::request_id::current(), work);
    let work = tracing::Instrument::instrument(work, tracing::Span::current());
    match tokio::spawn(work).await {
        Ok(response) => response,
        Err(e) => {
            // Its handler panicked: nothing to replay, and a retry may try again.
            if let Err(e) = state.store.release_idempotent(&claimed).await {
                tracing::error!(route = %claimed.route, "cannot release an idempotency claim: {e}");
            }
            AppError::internal(format!("an idempotent request's task failed: {e}")).into_response()
        }
    }
}

/// `"POST /v1/sandboxes"` when `req` is one of [`ROUTES`] or a face's
/// ([`crate::state::Face::idempotent_paths`]).
fn idempotent_route(req: &Request, faces: &crate::state::Faces) -> Option<String> {
    if req.method() != Method::POST {
        return None;
    }
    let path = req.extensions().get::<MatchedPath>()?.as_str();
    ROUTES.iter().map(|r| r.path).chain(faces.idempotent_paths()).find(|p| *p == path).map(|p| format!("POST {p}"))
}

fn valid_key(key: &str) -> bool {
    (1..=MAX_KEY_LEN).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_graphic())
}

fn request_hash(path: &str, query: Option<&str>, body: &[u8]) -> Vec<u8> {
    let mut h = Sha256::new();
    h.update(path.as_bytes());
    h.update(b"?");
    h.update(query.unwrap_or_default().as_bytes());
    h.update(b"\n");
    h.update(body);
    h.finalize().to_vec()
}

/// The answer to a retry.
fn answer_existing(entry: IdempotencyEntry, hash: &[u8], key: &sealed::AnswerKey) -> Response {
    let reused = || {
        AppError::new(
            ErrorCode::IdempotencyKeyReused,
            "this Idempotency-Key was used with another request; use a new key for a new request",
        )
        .into_response()
    };
    match entry {
        IdempotencyEntry::InProgress { request_hash } if request_hash == hash => {
            // Retry-After tells clients this conflict passes (the SDKs wait and retry).
            let mut response =
                AppError::conflict("a request with this Idempotency-Key is still being served; retry later")
                    .into_response();
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            response
        }
        IdempotencyEntry::Done { request_hash, mut answer } if request_hash == hash => match key.open(answer.body) {
            Ok(body) => {
                answer.body = body;
                replay(answer)
            }
            Err(e) => AppError::internal(e.to_string()).into_response(),
        },
        _ => reused(),
    }
}

fn replay(answer: StoredAnswer) -> Response {
    if answer.content_type.as_deref() == Some(NOT_KEPT) {
        return AppError::conflict(format!(
            "this request ran already (status {}); its answer was streamed or too large to keep",
            answer.status
        ))
        .into_response();
    }
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::OK);
    let mut response = (status, answer.body).into_response();
    if let Some(ct) = answer.content_type.and_then(|c| HeaderValue::from_str(&c).ok()) {
        response.headers_mut().insert(header::CONTENT_TYPE, ct);
    }
    response.headers_mut().insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    response
}

/// The response to send now, and what to keep of it.
async fn keep(response: Response) -> (Response, StoredAnswer) {
    let status = response.status();
    let content_type = response.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let json = content_type.as_deref().is_some_and(|c| c.starts_with("application/json"));
    let not_kept = StoredAnswer { status: status.as_u16(), content_type: Some(NOT_KEPT.into()), body: Vec::new() };
    if !json && status != StatusCode::NO_CONTENT {
        // A stream (exec output): sent as it comes, not kept.
        return (response, not_kept);
    }
    let (parts, body) = response.into_parts();
    // JSON answers are built in memory already: collecting them holds nothing new.
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!("an idempotent answer's body failed: {e}");
            return (Response::from_parts(parts, Body::empty()), not_kept);
        }
    };
    let answer = if bytes.len() <= MAX_STORED_ANSWER {
        StoredAnswer { status: status.as_u16(), content_type, body: bytes.to_vec() }
    } else {
        not_kept
    };
    (Response::from_parts(parts, Body::from(bytes)), answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_hashes() {
        assert!(valid_key("create-1f3a"));
        assert!(!valid_key(""));
        assert!(!valid_key("has space"));
        assert!(!valid_key(&"k".repeat(MAX_KEY_LEN + 1)));
        let a = request_hash("/v1/sandboxes/s/exec", None, b"{}");
        assert_eq!(a, request_hash("/v1/sandboxes/s/exec", None, b"{}"));
        assert_ne!(a, request_hash("/v1/sandboxes/t/exec", None, b"{}"), "another sandbox");
        assert_ne!(a, request_hash("/v1/sandboxes/s/exec", Some("stream=true"), b"{}"), "another form");
        assert_ne!(a, request_hash("/v1/sandboxes/s/exec", None, b"{\"cmd\":1}"), "another body");
    }

    #[test]
    fn a_retry_gets_the_first_answer_and_another_request_is_refused() {
        let id = IdempotencyId { key_id: "k".into(), route: "POST /v1/sandboxes".into(), idem_key: "c-1".into() };
        let key = sealed::AnswerKey::derive("lz_caller", &id);
        let body = key.seal(br#"{"accessToken":"lzt_x"}"#);
        let answer = StoredAnswer { status: 201, content_type: Some("application/json".into()), body };
        let done = IdempotencyEntry::Done { request_hash: b"h".to_vec(), answer };
        let r = answer_existing(done.clone(), b"h", &key);
        assert_eq!((r.status(), r.headers().get(REPLAYED_HEADER).is_some()), (StatusCode::CREATED, true));
        assert_eq!(answer_existing(done.clone(), b"other", &key).status(), StatusCode::UNPROCESSABLE_ENTITY);
        let stranger = sealed::AnswerKey::derive("lz_stranger", &id);
        assert_eq!(answer_existing(done, b"h", &stranger).status(), StatusCode::INTERNAL_SERVER_ERROR);
        let running = IdempotencyEntry::InProgress { request_hash: b"h".to_vec() };
        assert_eq!(answer_existing(running, b"h", &key).status(), StatusCode::CONFLICT);
    }
}

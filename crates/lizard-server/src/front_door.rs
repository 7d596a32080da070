//! The front door every API request passes, before its handler:
//!
//! 1. it gets a request id (`X-Request-Id` on the answer) and a log span carrying it, so
//!    an internal error's log line (with its cause) and the answer (without it) meet;
//! 2. it is counted in the metrics by its route's template, method and status
//!    ([`crate::telemetry`]), never by its raw path;
//! 3. a request with a valid key is counted against that key ([`crate::guard`]); past its
//!    rate or its requests in flight it answers 429 `RATE_LIMITED` with `Retry-After`.
//!    The key's [`Principal`] is handed to the handler, which does not look it up again.
//!
//! 4. a request with a key the store does not hold is answered 401 by its handler
//!    ([`auth::KeyRefused`]) without a store read: the [`crate::key_index`] knows every
//!    key's hash, so no flood of bad keys costs the store or refuses anyone else.
//!
//! Requests without a key pass untouched: their handler answers 401.

use crate::auth::{self, Principal};
use crate::error::{AppError, BodyReadTimeout};
use crate::guard::Refusal;
use crate::key_index::Verdict;
use crate::request_id;
use crate::state::ServerState;
use axum::extract::{MatchedPath, Request, State};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use lizard_api::ErrorCode;
use std::time::{Duration, Instant};
use tracing::Instrument;

/// The middleware (see the module doc).
pub async fn front_door(State(state): State<ServerState>, mut req: Request, next: Next) -> Response {
    let id = request_id::new();
    let span = tracing::info_span!("request", id = %id, method = %req.method(), path = %req.uri().path());
    let header = HeaderValue::from_str(&id).ok();
    let started = Instant::now();
    let route = req.extensions().get::<MatchedPath>().map(|m| m.as_str().to_owned());
    let method = req.method().clone();
    let telemetry = state.telemetry.clone();
    let work = async move {
        req.extensions_mut().insert(BodyReadTimeout(state.config.traffic.body_read));
        let mut permit = None;
        if let Some(key) = auth::presented_key(req.headers()) {
            match state.key_index.check(state.store.as_ref(), &key).await {
                // No such key: the handler answers 401 without a lookup.
                Ok(Verdict::Refuse) => {
                    req.extensions_mut().insert(auth::KeyRefused);
                }
                Ok(Verdict::Check) => match auth::authenticate(state.store.as_ref(), &key).await {
                    Ok(principal) => {
                        match state.guard.admit(&principal.key_id) {
                            Ok(p) => permit = Some(p),
                            Err(refusal) => return refused(&principal, refusal),
                        }
                        req.extensions_mut().insert::<Principal>(principal);
                    }
                    Err(e) if e.code() == ErrorCode::Unauthenticated => {
                        state.key_index.refused(&key);
                        req.extensions_mut().insert(auth::KeyRefused);
                    }
                    // The store did not answer: the handler's own lookup reports it.
                    Err(_) => {}
                },
                // Reading new keys failed: the handler's own lookup reports it.
                Err(e) => tracing::warn!("reading new API keys failed: {e}"),
            }
        }
        let response = next.run(req).await;
        drop(permit);
        if response.status().is_server_error() {
            tracing::warn!(status = response.status().as_u16(), "answered with a server error");
        }
        response
    };
    let mut response = request_id::scope(Some(id), work.instrument(span)).await;
    if let Some(h) = header {
        response.headers_mut().insert(request_id::HEADER, h);
    }
    telemetry.request(route.as_deref(), &method, response.status().as_u16(), started.elapsed());
    response
}

fn refused(principal: &Principal, refusal: Refusal) -> Response {
    let (wait, why) = match refusal {
        Refusal::Rate(wait) => (wait, "this API key sends requests faster than its rate limit"),
        Refusal::Concurrency => (Duration::from_secs(1), "this API key has too many requests in flight"),
    };
    tracing::debug!(key = %principal.key_id, "{why}");
    too_many(wait, why)
}

/// 429 `RATE_LIMITED`, with `Retry-After` in whole seconds (at least 1).
fn too_many(wait: Duration, why: &str) -> Response {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    let mut response = AppError::new(ErrorCode::RateLimited, format!("{why}; retry after {secs} s")).into_response();
    response.headers_mut().insert(axum::http::header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
    response
}

//! The id of the request being served (`X-Request-Id`), carried through everything its
//! handler awaits (and through the tasks an operation runs in), so that an internal
//! error's answer names it and the operator's log line with the cause has it too.

use std::future::Future;

tokio::task_local! {
    static REQUEST_ID: String;
}

/// The response header that carries the id.
pub const HEADER: &str = "x-request-id";

/// A new request id.
pub fn new() -> String {
    lizard_api::ids::new_id("req")
}

/// The id of the request this task serves, if it serves one.
pub fn current() -> Option<String> {
    REQUEST_ID.try_with(Clone::clone).ok()
}

/// Run `work` as part of request `id` (`None`: of no request).
pub async fn scope<F: Future>(id: Option<String>, work: F) -> F::Output {
    match id {
        Some(id) => REQUEST_ID.scope(id, work).await,
        None => work.await,
    }
}

//! E2B's code interpreter (`e2b-code-interpreter`, `@e2b/code-interpreter`) as Lizard
//! serves it: the requests its SDKs send to port 49999 through the sandbox URL, answered
//! from the guest's one code service ([`lizard_server::ops::code`], the same `run_code` as
//! Lizard's API) in the add-on's shapes. Nothing of the kernel protocol is here: only
//! the translation.
//!
//! - `POST /execute` `{code, context_id?, language?, env_vars?}` → NDJSON lines:
//!   `stdout`/`stderr` `{text, timestamp}`, `result` with the MIME bundle flattened into
//!   its fields (`text`, `html`, `markdown`, `svg`, `png`, `jpeg`, `pdf`, `latex`, `json`,
//!   `javascript`, other types under `extra`) and `is_main_result`, `error` `{name, value,
//!   traceback}`, then `number_of_executions` `{execution_count}` and `end_of_execution`;
//! - `GET|POST /contexts`, `DELETE /contexts/{id}`, `POST /contexts/{id}/restart`;
//! - `GET /health`.
//!
//! Languages: `python`, `javascript` (also `js`), `typescript` (also `ts`), `r` and `bash`;
//! any other is refused (404, as the add-on's own server answers a language it has no
//! context for) by name. The add-on sends no execution timeout (its client bounds the
//! wait): the code service's default, 300 s, holds.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use lizard_api::code::{CodeContext, CodeEvent, CodeLanguage, CreateCodeContextRequest, RunCodeRequest};
use lizard_server::error::AppError;
use lizard_server::ops::code;
use lizard_server::ops::sandboxes::LiveSandbox;
use lizard_server::state::AppState;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// Largest request body read (the code service's own bound on code, and some).
const MAX_BODY: usize = lizard_api::code::MAX_CODE_BYTES + 64 * 1024;

/// `POST /execute`.
#[derive(Debug, Default, Deserialize)]
struct Execute {
    code: String,
    #[serde(default)]
    context_id: Option<String>,
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    env_vars: Option<BTreeMap<String, String>>,
}

/// `POST /contexts`.
#[derive(Debug, Default, Deserialize)]
struct NewContext {
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    cwd: Option<String>,
}

/// A context as the add-on reads it.
#[derive(Debug, Serialize)]
struct Context {
    id: String,
    language: &'static str,
    cwd: String,
}

fn context(c: CodeContext) -> Context {
    Context { id: c.id, language: language_name(c.language), cwd: c.cwd }
}

fn language_name(language: CodeLanguage) -> &'static str {
    match language {
        CodeLanguage::Python => "python",
        CodeLanguage::Javascript => "javascript",
        CodeLanguage::Typescript => "typescript",
        CodeLanguage::R => "r",
        CodeLanguage::Bash => "bash",
    }
}

/// The add-on's language name as Lizard's, or the error naming it.
fn language(name: &str) -> Result<CodeLanguage, (StatusCode, String)> {
    match name.to_ascii_lowercase().as_str() {
        "python" | "python3" => Ok(CodeLanguage::Python),
        "javascript" | "js" => Ok(CodeLanguage::Javascript),
        "typescript" | "ts" => Ok(CodeLanguage::Typescript),
        "r" => Ok(CodeLanguage::R),
        "bash" | "sh" => Ok(CodeLanguage::Bash),
        // 404, as the add-on's own server answers a language it has no context for: both
        // SDKs show a 404's body (the JS one shows no other error's).
        other => Err((
            StatusCode::NOT_FOUND,
            format!("language {other:?} is not served: python, javascript, typescript, r and bash are"),
        )),
    }
}

/// One line of `/execute`'s answer for one of Lizard's code events (two for the end).
fn lines(event: CodeEvent) -> Vec<Value> {
    let now = || lizard_api::ids::now_ms().saturating_mul(1_000_000);
    match event {
        CodeEvent::Stdout { text } => vec![json!({"type": "stdout", "text": text, "timestamp": now()})],
        CodeEvent::Stderr { text } => vec![json!({"type": "stderr", "text": text, "timestamp": now()})],
        CodeEvent::Result { data, is_main_result } => vec![result(data, is_main_result)],
        CodeEvent::Error { name, value, traceback } => {
            vec![json!({"type": "error", "name": name, "value": value, "traceback": traceback})]
        }
        CodeEvent::End { execution_count } => {
            let mut out = Vec::new();
            if let Some(n) = execution_count {
                out.push(json!({"type": "number_of_executions", "execution_count": n}));
            }
            out.push(json!({"type": "end_of_execution"}));
            out
        }
    }
}

/// A MIME bundle flattened into the add-on's result fields.
fn result(data: BTreeMap<String, Value>, is_main_result: bool) -> Value {
    let mut out = Map::new();
    out.insert("type".into(), "result".into());
    let mut extra = Map::new();
    for (mime, value) in data {
        let field = match mime.as_str() {
            "text/plain" => "text",
            "text/html" => "html",
            "text/markdown" => "markdown",
            "image/svg+xml" => "svg",
            "image/png" => "png",
            "image/jpeg" => "jpeg",
            "application/pdf" => "pdf",
            "text/latex" => "latex",
            "application/json" => "json",
            "application/javascript" => "javascript",
            // What the figure shows, as data (the interpreter's lizard_charts.py).
            "application/vnd.lizard.chart+json" => "chart",
            _ => {
                extra.insert(mime, value);
                continue;
            }
        };
        out.insert(field.into(), value);
    }
    if !extra.is_empty() {
        out.insert("extra".into(), Value::Object(extra));
    }
    out.insert("is_main_result".into(), is_main_result.into());
    Value::Object(out)
}

fn failure(e: AppError) -> (StatusCode, String) {
    let status = StatusCode::from_u16(e.0.code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, e.0.message)
}

async fn body<T: serde::de::DeserializeOwned + Default>(
    req: Request,
    empty_ok: bool,
) -> Result<T, (StatusCode, String)> {
    let bytes = axum::body::to_bytes(req.into_body(), MAX_BODY)
        .await
        .map_err(|e| (StatusCode::BAD_REQUEST, format!("the request body: {e}")))?;
    if bytes.is_empty() && empty_ok {
        return Ok(T::default());
    }
    serde_json::from_slice(&bytes).map_err(|e| (StatusCode::BAD_REQUEST, format!("the request body: {e}")))
}

/// Answer one request for the code interpreter's port of `sandbox`.
pub async fn serve(state: &AppState, sandbox: &LiveSandbox, req: Request) -> Response {
    match route(state, sandbox, req).await {
        Ok(response) => response,
        // The add-on shows a failed call's status and body as they come.
        Err((status, message)) => (status, axum::Json(json!({"name": "Error", "value": message}))).into_response(),
    }
}

async fn route(state: &AppState, sandbox: &LiveSandbox, req: Request) -> Result<Response, (StatusCode, String)> {
    let path = req.uri().path().trim_end_matches('/').to_owned();
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    match (req.method().clone(), parts.as_slice()) {
        (Method::GET, ["health"]) => Ok((StatusCode::OK, "OK").into_response()),
        (Method::POST, ["execute"]) => execute(state, sandbox, body(req, false).await?).await,
        (Method::GET, ["contexts"]) => {
            let all = code::contexts(sandbox).await.map_err(failure)?;
            Ok(axum::Json(all.into_iter().map(context).collect::<Vec<_>>()).into_response())
        }
        (Method::POST, ["contexts"]) => {
            let new: NewContext = body(req, true).await?;
            let language = new.language.as_deref().map(language).transpose()?;
            let made = code::create_context(sandbox, &CreateCodeContextRequest { language, cwd: new.cwd })
                .await
                .map_err(failure)?;
            Ok(axum::Json(context(made)).into_response())
        }
        (Method::DELETE, ["contexts", id]) => {
            code::remove_context(sandbox, id).await.map_err(failure)?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        (Method::POST, ["contexts", id, "restart"]) => {
            code::restart_context(sandbox, id).await.map_err(failure)?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        _ => Err((StatusCode::NOT_FOUND, format!("no code interpreter route {} {path}", req.method()))),
    }
}

async fn execute(state: &AppState, sandbox: &LiveSandbox, ask: Execute) -> Result<Response, (StatusCode, String)> {
    // The add-on names a context or a language, not both; a context's own language holds.
    let language = match (&ask.context_id, ask.language.as_deref()) {
        (None, Some(name)) => Some(language(name)?),
        _ => None,
    };
    let run = RunCodeRequest {
        code: ask.code,
        language,
        context_id: ask.context_id,
        envs: ask.env_vars.unwrap_or_default(),
        timeout_ms: None,
    };
    let events = code::run(&state.server.guest_buffers, sandbox, run).await.map_err(failure)?;
    let body = events.flat_map(|event| {
        futures_util::stream::iter(lines(event).into_iter().map(|line| {
            let mut bytes = serde_json::to_vec(&line).unwrap_or_default();
            bytes.push(b'\n');
            Ok::<_, std::io::Error>(bytes)
        }))
    });
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(body)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_flattens_into_the_addons_fields() {
        let data = BTreeMap::from([
            ("text/plain".to_owned(), json!("<Figure>")),
            ("image/png".to_owned(), json!("iVBOR")),
            ("application/vnd.custom+json".to_owned(), json!({"a": 1})),
            ("application/vnd.lizard.chart+json".to_owned(), json!({"type": "line", "elements": []})),
        ]);
        let v = result(data, true);
        assert_eq!(v["chart"]["type"], "line");
        assert_eq!(v["type"], "result");
        assert_eq!((v["text"].as_str(), v["png"].as_str()), (Some("<Figure>"), Some("iVBOR")));
        assert_eq!(v["extra"]["application/vnd.custom+json"]["a"], 1);
        assert_eq!(v["is_main_result"], true);
        assert!(v.get("html").is_none());
    }

    #[test]
    fn the_end_reports_the_count_then_ends_and_text_carries_a_timestamp() {
        let end = lines(CodeEvent::End { execution_count: Some(3) });
        assert_eq!(end[0], json!({"type": "number_of_executions", "execution_count": 3}));
        assert_eq!(end[1]["type"], "end_of_execution");
        let out = lines(CodeEvent::Stdout { text: "hi\n".into() });
        assert!(out[0]["timestamp"].as_i64().is_some_and(|t| t > 1_600_000_000_000_000_000));
        assert_eq!(language("TS"), Ok(CodeLanguage::Typescript));
        assert_eq!(language("r"), Ok(CodeLanguage::R));
        assert!(language("JS").is_ok());
        let (status, message) = language("cobol").unwrap_err();
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(message.contains("\"cobol\"") && message.contains("typescript, r and bash"), "{message}");
    }
}

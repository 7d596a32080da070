//! Stateful code execution (`run_code` / `runCode`) and code contexts.
//!
//! The `interpreter` template runs a code service in the guest (its
//! `templates/interpreter/code_server.py`) on guest loopback, port [`CODE_SERVICE_PORT`];
//! the control plane reaches it through the node's tunnel, never through a sandbox URL
//! (the proxy refuses every port of [`RESERVED_GUEST_PORTS`]). An execution answers one
//! [`CodeEvent`] per line (NDJSON) as the code produces output, ending with
//! [`CodeEvent::End`]. Errors raised by the code are events, not HTTP errors.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The guest port of the `interpreter` template's code service (guest loopback only).
pub const CODE_SERVICE_PORT: u16 = 49999;

/// The guest port where the agent forwards the guest's own API calls
/// (`lizard_agent_proto::routes::FORWARD_GUEST_ADDR`).
pub const FORWARD_GUEST_PORT: u16 = 49171;

/// Guest ports the platform uses for itself: never reachable through a sandbox URL.
pub const RESERVED_GUEST_PORTS: &[u16] = &[CODE_SERVICE_PORT, FORWARD_GUEST_PORT];

/// Whether `port` is one of [`RESERVED_GUEST_PORTS`].
pub fn is_reserved_guest_port(port: u16) -> bool {
    RESERVED_GUEST_PORTS.contains(&port)
}

/// Timeout of an execution that names none.
pub const DEFAULT_CODE_TIMEOUT_MS: u64 = 300_000;
/// Longest `timeoutMs` one execution may ask for.
pub const MAX_CODE_TIMEOUT_MS: u64 = 3_600_000;
/// Largest `code` one execution may carry, in bytes.
pub const MAX_CODE_BYTES: usize = 4 * 1024 * 1024;

/// The language of a code context.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum CodeLanguage {
    /// An IPython kernel (Jupyter protocol): MIME-bundle results, matplotlib figures as PNG.
    #[default]
    Python,
    /// A Node.js process; the last expression's value is the result.
    Javascript,
    /// The JavaScript context with each cell's type annotations stripped first (Node.js's
    /// own stripper: erasable syntax only, so an `enum` is refused by name).
    Typescript,
    /// An R process (Debian's R): each top-level value printed as R prints it, plots as
    /// PNG results.
    R,
    /// A bash process; a non-zero status of the cell is an error.
    Bash,
}

/// `POST /v1/sandboxes/{id}/code`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunCodeRequest {
    pub code: String,
    /// The language's default context (created at first use). Default `python`. Not
    /// together with `contextId`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<CodeLanguage>,
    /// A context made by `POST …/code/contexts`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_id: Option<String>,
    /// Environment for this execution only.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub envs: BTreeMap<String, String>,
    /// After this long the execution is interrupted (the context keeps its state) and
    /// ends with a `TimeoutError` error event. Default 300 000, at most 3 600 000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// Why a code request is refused (422 `INVALID_ARGUMENT`, with this message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodeRequestError {
    /// give a language or a contextId, not both
    #[error("give a language or a contextId, not both")]
    LanguageAndContext,
    /// The code is over [`MAX_CODE_BYTES`].
    #[error("code is {0} bytes, over the limit of {MAX_CODE_BYTES}")]
    CodeTooLarge(usize),
    /// `timeoutMs` out of range.
    #[error("timeoutMs must be 1..={MAX_CODE_TIMEOUT_MS}, got {0}")]
    Timeout(u64),
    /// A context id the service could not have made.
    #[error("invalid contextId {0:?}: 1 to 64 of [A-Za-z0-9_-]")]
    ContextId(String),
    /// An env name a process cannot have.
    #[error("invalid env name {0:?}: letters, digits and _, not starting with a digit")]
    EnvName(String),
    /// A relative `cwd`.
    #[error("cwd must be an absolute path, got {0:?}")]
    Cwd(String),
}

/// Whether `id` has the shape of a context id (it goes into the code service's path).
pub fn check_context_id(id: &str) -> Result<(), CodeRequestError> {
    let ok =
        !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(CodeRequestError::ContextId(id.to_owned()))
    }
}

impl RunCodeRequest {
    /// Check what the code service would refuse, so the caller gets the answer without a
    /// round trip into the guest.
    pub fn validate(&self) -> Result<(), CodeRequestError> {
        if self.language.is_some() && self.context_id.is_some() {
            return Err(CodeRequestError::LanguageAndContext);
        }
        if self.code.len() > MAX_CODE_BYTES {
            return Err(CodeRequestError::CodeTooLarge(self.code.len()));
        }
        if let Some(ms) = self.timeout_ms {
            if ms == 0 || ms > MAX_CODE_TIMEOUT_MS {
                return Err(CodeRequestError::Timeout(ms));
            }
        }
        if let Some(id) = &self.context_id {
            check_context_id(id)?;
        }
        for name in self.envs.keys() {
            let mut bytes = name.bytes();
            let first_ok = bytes.next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
            if !first_ok || !bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(CodeRequestError::EnvName(name.clone()));
            }
        }
        Ok(())
    }

    /// The timeout this execution runs under.
    pub fn timeout_ms(&self) -> u64 {
        self.timeout_ms.unwrap_or(DEFAULT_CODE_TIMEOUT_MS)
    }
}

/// One line of an execution's output stream (NDJSON), in the order the code produced it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum CodeEvent {
    /// Text the code wrote to its standard output.
    Stdout { text: String },
    /// Text the code wrote to its standard error.
    Stderr { text: String },
    /// A value the code displayed: its MIME bundle (`text/plain`, `text/html`, `image/png`
    /// as base64, `application/json` as JSON, …). `isMainResult`: the cell's own value
    /// (its last expression), as opposed to a `display()` or a figure.
    #[serde(rename_all = "camelCase")]
    Result {
        #[cfg_attr(feature = "openapi", schema(value_type = Object))]
        data: BTreeMap<String, serde_json::Value>,
        #[serde(default)]
        is_main_result: bool,
    },
    /// The code raised (or the execution timed out, `TimeoutError`; or its interpreter
    /// died, `DeadKernelError`, and the next execution starts a new one).
    Error { name: String, value: String, traceback: String },
    /// The execution ended; always the last line.
    #[serde(rename_all = "camelCase")]
    End {
        /// The context's execution counter after this execution.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        execution_count: Option<u64>,
    },
}

/// `POST /v1/sandboxes/{id}/code/contexts`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateCodeContextRequest {
    /// Default `python`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<CodeLanguage>,
    /// Working directory of the context's interpreter (absolute; must exist). Default: the
    /// template's working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

impl CreateCodeContextRequest {
    pub fn validate(&self) -> Result<(), CodeRequestError> {
        match &self.cwd {
            Some(cwd) if !cwd.starts_with('/') => Err(CodeRequestError::Cwd(cwd.clone())),
            _ => Ok(()),
        }
    }
}

/// A code context: one interpreter whose state persists between executions.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CodeContext {
    pub id: String,
    pub language: CodeLanguage,
    pub cwd: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_tagged_camel_case_lines() {
        let e = CodeEvent::End { execution_count: Some(3) };
        assert_eq!(serde_json::to_string(&e).unwrap(), r#"{"type":"end","executionCount":3}"#);
        let r: CodeEvent =
            serde_json::from_str(r#"{"type":"result","data":{"text/plain":"42"},"isMainResult":true}"#).unwrap();
        assert!(matches!(r, CodeEvent::Result { is_main_result: true, ref data } if data["text/plain"] == "42"));
        let err: CodeEvent =
            serde_json::from_str(r#"{"type":"error","name":"ZeroDivisionError","value":"x","traceback":"t"}"#).unwrap();
        assert!(matches!(err, CodeEvent::Error { ref name, .. } if name == "ZeroDivisionError"));
        assert!(serde_json::from_str::<CodeEvent>(r#"{"type":"exit"}"#).is_err());
    }

    #[test]
    fn requests_are_checked_before_they_reach_the_guest() {
        let ok = RunCodeRequest { code: "x = 41".into(), ..Default::default() };
        assert_eq!(ok.validate(), Ok(()));
        assert_eq!(ok.timeout_ms(), DEFAULT_CODE_TIMEOUT_MS);
        let both = RunCodeRequest { language: Some(CodeLanguage::Bash), context_id: Some("abc".into()), ..ok.clone() };
        assert_eq!(both.validate(), Err(CodeRequestError::LanguageAndContext));
        for ms in [0, MAX_CODE_TIMEOUT_MS + 1] {
            let r = RunCodeRequest { timeout_ms: Some(ms), ..ok.clone() };
            assert_eq!(r.validate(), Err(CodeRequestError::Timeout(ms)));
        }
        for id in ["", "../x", "a/b", &"a".repeat(65)] {
            let r = RunCodeRequest { context_id: Some(id.into()), ..ok.clone() };
            assert!(matches!(r.validate(), Err(CodeRequestError::ContextId(_))), "{id:?}");
        }
        for name in ["1A", "A-B", "", "A B"] {
            let r = RunCodeRequest { envs: BTreeMap::from([(name.into(), "v".into())]), ..ok.clone() };
            assert!(matches!(r.validate(), Err(CodeRequestError::EnvName(_))), "{name:?}");
        }
        let big = RunCodeRequest { code: "x".repeat(MAX_CODE_BYTES + 1), ..ok.clone() };
        assert!(matches!(big.validate(), Err(CodeRequestError::CodeTooLarge(_))));
        let lang: Result<RunCodeRequest, _> = serde_json::from_str(r#"{"code":"1","language":"ruby"}"#);
        assert!(lang.unwrap_err().to_string().contains("python"), "serde names the languages");
        assert!(serde_json::from_str::<RunCodeRequest>(r#"{"code":"1","extra":1}"#).is_err());
        let ctx = CreateCodeContextRequest { cwd: Some("tmp".into()), ..Default::default() };
        assert_eq!(ctx.validate(), Err(CodeRequestError::Cwd("tmp".into())));
    }

    #[test]
    fn reserved_ports_are_the_platform_ones() {
        assert!(is_reserved_guest_port(CODE_SERVICE_PORT));
        assert!(is_reserved_guest_port(FORWARD_GUEST_PORT));
        assert!(!is_reserved_guest_port(3000));
        assert!(lizard_agent_proto::routes::FORWARD_GUEST_ADDR.ends_with(&format!(":{FORWARD_GUEST_PORT}")));
    }
}

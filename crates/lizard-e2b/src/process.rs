//! envd's `process.Process` messages (proto3 JSON).

use base64::Engine;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What to run.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ProcessConfig {
    pub cmd: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub envs: BTreeMap<String, String>,
    #[serde(default)]
    pub cwd: Option<String>,
}

/// A terminal's size.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
pub struct Size {
    #[serde(default)]
    pub cols: u32,
    #[serde(default)]
    pub rows: u32,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
pub struct Pty {
    #[serde(default)]
    pub size: Size,
}

/// `Start`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct StartRequest {
    pub process: ProcessConfig,
    #[serde(default)]
    pub pty: Option<Pty>,
    #[serde(default)]
    pub tag: Option<String>,
    /// Whether the process's stdin stays open for input (else it reads end-of-file).
    #[serde(default)]
    pub stdin: Option<bool>,
}

/// Which process a call is about: by pid or by the tag it was started with.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum Selector {
    Pid(u32),
    Tag(String),
}

/// `{"process": selector}`: `Connect`, `CloseStdin`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Selected {
    pub process: Selector,
}

/// Input for a process: to its stdin, or typed at its terminal.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum Input {
    Stdin(#[serde(with = "b64")] Vec<u8>),
    Pty(#[serde(with = "b64")] Vec<u8>),
}

/// `SendInput`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct SendInputRequest {
    pub process: Selector,
    pub input: Input,
}

/// One message of a `StreamInput` request stream: which process first, then its input.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum StreamInputEvent {
    Start { process: Selector },
    Data { input: Input },
    Keepalive {},
}

/// `SendSignal`: `SIGNAL_SIGKILL` or `SIGNAL_SIGTERM`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct SendSignalRequest {
    pub process: Selector,
    pub signal: String,
}

/// `Update`: a terminal's new size.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct UpdateRequest {
    pub process: Selector,
    #[serde(default)]
    pub pty: Option<Pty>,
}

/// One process of `List`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ProcessInfo {
    pub config: ProcessConfig,
    pub pid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// `List`'s answer.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ListResponse {
    pub processes: Vec<ProcessInfo>,
}

/// One message of a `Start` or `Connect` stream: `{"event": …}`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct EventMessage {
    pub event: Event,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum Event {
    Start { pid: u32 },
    Data(Data),
    End(End),
    Keepalive {},
}

/// Output, base64 on the wire.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum Data {
    Stdout(#[serde(with = "b64")] Vec<u8>),
    Stderr(#[serde(with = "b64")] Vec<u8>),
    Pty(#[serde(with = "b64")] Vec<u8>),
}

/// How a process ended.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct End {
    pub exit_code: i32,
    pub exited: bool,
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl EventMessage {
    pub fn start(pid: u32) -> EventMessage {
        EventMessage { event: Event::Start { pid } }
    }
    pub fn data(data: Data) -> EventMessage {
        EventMessage { event: Event::Data(data) }
    }
    /// The end of a process: by its exit code, or by the signal that killed it.
    pub fn end(exit_code: Option<i32>, signal: Option<i32>) -> EventMessage {
        let (exit_code, status) = match (exit_code, signal) {
            (Some(code), _) => (code, format!("exit status {code}")),
            (None, Some(sig)) => (-1, format!("signal: {}", signal_name(sig))),
            (None, None) => (-1, "unknown".to_owned()),
        };
        EventMessage { event: Event::End(End { exit_code, exited: true, status, error: None }) }
    }
    pub fn keepalive() -> EventMessage {
        EventMessage { event: Event::Keepalive {} }
    }
}

/// What Go's `os.ProcessState` calls a signal (envd reports statuses in its words).
fn signal_name(signal: i32) -> String {
    match signal {
        9 => "killed".into(),
        15 => "terminated".into(),
        2 => "interrupt".into(),
        other => format!("signal {other}"),
    }
}

mod b64 {
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        STANDARD.decode(text.as_bytes()).map_err(serde::de::Error::custom)
    }
}

/// Base64 as proto3 JSON writes `bytes`.
pub fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_take_proto3_json_form() {
        let out = serde_json::to_string(&EventMessage::data(Data::Stdout(b"hi\n".to_vec()))).unwrap();
        assert_eq!(out, r#"{"event":{"data":{"stdout":"aGkK"}}}"#);
        assert_eq!(serde_json::to_string(&EventMessage::start(7)).unwrap(), r#"{"event":{"start":{"pid":7}}}"#);
        let end = serde_json::to_value(EventMessage::end(Some(3), None)).unwrap();
        assert_eq!(end["event"]["end"]["exitCode"], 3);
        assert_eq!(end["event"]["end"]["status"], "exit status 3");
        let killed = serde_json::to_value(EventMessage::end(None, Some(9))).unwrap();
        assert_eq!(killed["event"]["end"]["status"], "signal: killed");
        assert_eq!(serde_json::to_string(&EventMessage::keepalive()).unwrap(), r#"{"event":{"keepalive":{}}}"#);
    }

    #[test]
    fn requests_read_as_the_sdks_send_them() {
        let start: StartRequest = serde_json::from_str(
            r#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{"A":"1"}},"stdin":false}"#,
        )
        .unwrap();
        assert_eq!(start.process.args, ["-l", "-c", "echo hi"]);
        assert_eq!(start.stdin, Some(false));
        let input: SendInputRequest =
            serde_json::from_str(r#"{"process":{"pid":12},"input":{"stdin":"aGkK"}}"#).unwrap();
        assert_eq!((input.process, input.input), (Selector::Pid(12), Input::Stdin(b"hi\n".to_vec())));
        let data: StreamInputEvent = serde_json::from_str(r#"{"data":{"input":{"stdin":"aGkK"}}}"#).unwrap();
        assert_eq!(data, StreamInputEvent::Data { input: Input::Stdin(b"hi\n".to_vec()) });
        let start: StreamInputEvent = serde_json::from_str(r#"{"start":{"process":{"pid":3}}}"#).unwrap();
        assert_eq!(start, StreamInputEvent::Start { process: Selector::Pid(3) });
        let by_tag: Selected = serde_json::from_str(r#"{"process":{"tag":"web"}}"#).unwrap();
        assert_eq!(by_tag.process, Selector::Tag("web".into()));
    }
}

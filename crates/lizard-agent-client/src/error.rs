//! What can go wrong talking to an agent.

use lizard_agent_proto::handshake::HandshakeError;
use lizard_agent_proto::types::AgentError;

/// A failed agent call.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The handshake failed (wrong secret: [`HandshakeError::Denied`]).
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    /// Local I/O failed, e.g. the stream given as a file's body.
    #[error("i/o: {0}")]
    Io(std::io::Error),
    /// HTTP/2 failed on a connection that is still up (a reset stream, say).
    #[error("http/2: {0}")]
    Http(hyper::Error),
    /// The agent answered something this client does not understand.
    #[error("agent protocol: {0}")]
    Protocol(String),
    /// The agent refused or failed the operation; `.0.code` says why.
    #[error("agent: {0}")]
    Agent(AgentError),
    /// The channel to the agent is gone (the VM exited or the connection was dropped).
    #[error("the channel to the agent is closed")]
    Closed,
}

impl From<std::io::Error> for ClientError {
    fn from(e: std::io::Error) -> Self {
        ClientError::Io(e)
    }
}

impl From<AgentError> for ClientError {
    fn from(e: AgentError) -> Self {
        ClientError::Agent(e)
    }
}

impl ClientError {
    /// The agent's error code, when the agent itself answered with an error.
    pub fn code(&self) -> Option<lizard_agent_proto::types::ErrorCode> {
        match self {
            ClientError::Agent(e) => Some(e.code),
            _ => None,
        }
    }
}

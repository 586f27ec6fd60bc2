//! The client's one error type.

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with an error (bad input, not found, ...), or the
    /// cluster stayed unreachable for the whole retry window.
    // Not `#[from]`: that would make the status its own source, and
    // `{:#}` would print the message twice.
    #[error("{}", .0.message())]
    Status(tonic::Status),
    #[error("invalid server address {0}")]
    InvalidAddress(String),
    #[error("{0}")]
    Timeout(String),
}

impl From<tonic::Status> for ClientError {
    fn from(s: tonic::Status) -> Self {
        ClientError::Status(s)
    }
}

impl ClientError {
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            ClientError::Status(s) => Some(s.code()),
            _ => None,
        }
    }
}

pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// Failures that mean "the cluster is changing, try again": a node down, a
/// leader moving, a connection cut. Anything else is the server's verdict.
pub(crate) fn retryable(s: &tonic::Status) -> bool {
    use tonic::Code;
    !matches!(
        s.code(),
        Code::InvalidArgument
            | Code::NotFound
            | Code::AlreadyExists
            | Code::FailedPrecondition
            | Code::ResourceExhausted
            | Code::PermissionDenied
            | Code::Unauthenticated
            | Code::OutOfRange
            | Code::Unimplemented
    )
}

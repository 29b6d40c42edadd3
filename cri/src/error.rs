//! The one error type of the CRI client: gRPC status codes folded into the
//! few cases the node role reacts to differently, each naming the CRI method.

use std::time::Duration;

/// gRPC status code, re-exported so callers need not depend on tonic.
pub use tonic::Code;

/// A gRPC code as grpc-go names it (`codes.Code.String()`: `Canceled`,
/// not tonic's `Cancelled`), for messages that must read as kubelet's.
pub fn go_code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

/// A gRPC error as grpc-go prints one (`rpc error: code = X desc = Y`),
/// which is what kubelet puts in its messages and events.
pub fn go_status_text(s: &tonic::Status) -> String {
    format!(
        "rpc error: code = {} desc = {}",
        go_code_name(s.code()),
        s.message()
    )
}

/// What went wrong with a CRI call.
///
/// Every variant names the CRI method (`"RunPodSandbox"`, `"ExecSync"`, ...)
/// so a log line says which call failed. The split follows what kubelet acts
/// on: `NotFound` (the object is gone: treat as removed), `Unavailable` (the
/// runtime is down or restarting: retry later), `DeadlineExceeded` (the call
/// outlived its deadline: for ExecSync this is a probe timeout),
/// `Unimplemented` (the runtime does not offer the method: e.g. containerd
/// 1.6 and `GetContainerEvents`, so the PLEG falls back to relisting).
#[derive(Debug, Clone, thiserror::Error)]
pub enum CriError {
    /// The sandbox, container or image does not exist.
    #[error("CRI {method}: not found: {message}")]
    NotFound {
        /// CRI method name.
        method: &'static str,
        /// The runtime's message.
        message: String,
    },
    /// The runtime cannot be reached (socket missing, connection refused or
    /// reset, runtime restarting).
    #[error("CRI {method}: runtime unavailable: {message}")]
    Unavailable {
        /// CRI method name.
        method: &'static str,
        /// The runtime's or the transport's message.
        message: String,
    },
    /// The call did not finish before its deadline (ours or the runtime's).
    #[error("CRI {method}: deadline exceeded: {message}")]
    DeadlineExceeded {
        /// CRI method name.
        method: &'static str,
        /// What timed out.
        message: String,
    },
    /// The runtime does not implement this method.
    #[error("CRI {method}: not implemented by the runtime: {message}")]
    Unimplemented {
        /// CRI method name.
        method: &'static str,
        /// The runtime's message.
        message: String,
    },
    /// The runtime rejected the request's content.
    #[error("CRI {method}: invalid argument: {message}")]
    InvalidArgument {
        /// CRI method name.
        method: &'static str,
        /// The runtime's message.
        message: String,
    },
    /// The object (e.g. a sandbox or container name) already exists.
    #[error("CRI {method}: already exists: {message}")]
    AlreadyExists {
        /// CRI method name.
        method: &'static str,
        /// The runtime's message.
        message: String,
    },
    /// Any other gRPC status (Unknown, Internal, FailedPrecondition, ...).
    #[error("CRI {method}: {code:?}: {message}")]
    Other {
        /// CRI method name.
        method: &'static str,
        /// The gRPC status code.
        code: Code,
        /// The runtime's message.
        message: String,
    },
    /// The runtime answered, but without a field the CRI contract requires.
    #[error("CRI {method}: reply lacks required field `{field}`")]
    MissingField {
        /// CRI method name.
        method: &'static str,
        /// The field that was absent.
        field: &'static str,
    },
    /// The endpoint string is not a usable `unix://` address.
    #[error("invalid CRI endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint {
        /// What was given.
        endpoint: String,
        /// Why it is not usable.
        reason: &'static str,
    },
}

impl CriError {
    /// Maps a gRPC status returned by `method` to the error enum.
    pub fn from_status(method: &'static str, status: &tonic::Status) -> Self {
        let message = status_message(status);
        if status.code() == Code::Cancelled && is_local_timeout(status) {
            // tonic enforces the grpc-timeout we set and reports it as
            // Cancelled; it is our deadline passing.
            return CriError::DeadlineExceeded { method, message };
        }
        match status.code() {
            Code::NotFound => CriError::NotFound { method, message },
            Code::Unavailable => CriError::Unavailable { method, message },
            Code::DeadlineExceeded => CriError::DeadlineExceeded { method, message },
            Code::Unimplemented => CriError::Unimplemented { method, message },
            Code::InvalidArgument => CriError::InvalidArgument { method, message },
            Code::AlreadyExists => CriError::AlreadyExists { method, message },
            code => CriError::Other {
                method,
                code,
                message,
            },
        }
    }

    /// The error for a call that outlived our own deadline.
    pub(crate) fn deadline(method: &'static str, after: Duration) -> Self {
        CriError::DeadlineExceeded {
            method,
            message: format!("no answer within {after:?}"),
        }
    }

    /// The CRI method whose call failed (empty for [`CriError::InvalidEndpoint`]).
    pub fn method(&self) -> &'static str {
        match self {
            CriError::NotFound { method, .. }
            | CriError::Unavailable { method, .. }
            | CriError::DeadlineExceeded { method, .. }
            | CriError::Unimplemented { method, .. }
            | CriError::InvalidArgument { method, .. }
            | CriError::AlreadyExists { method, .. }
            | CriError::Other { method, .. }
            | CriError::MissingField { method, .. } => method,
            CriError::InvalidEndpoint { .. } => "",
        }
    }

    /// The gRPC code this error stands for (`None` for errors made on our side
    /// that have no gRPC meaning: a missing reply field, a bad endpoint).
    pub fn code(&self) -> Option<Code> {
        match self {
            CriError::NotFound { .. } => Some(Code::NotFound),
            CriError::Unavailable { .. } => Some(Code::Unavailable),
            CriError::DeadlineExceeded { .. } => Some(Code::DeadlineExceeded),
            CriError::Unimplemented { .. } => Some(Code::Unimplemented),
            CriError::InvalidArgument { .. } => Some(Code::InvalidArgument),
            CriError::AlreadyExists { .. } => Some(Code::AlreadyExists),
            CriError::Other { code, .. } => Some(*code),
            CriError::MissingField { .. } | CriError::InvalidEndpoint { .. } => None,
        }
    }

    /// The runtime's message (or ours, for errors made here).
    pub fn message(&self) -> String {
        match self {
            CriError::NotFound { message, .. }
            | CriError::Unavailable { message, .. }
            | CriError::DeadlineExceeded { message, .. }
            | CriError::Unimplemented { message, .. }
            | CriError::InvalidArgument { message, .. }
            | CriError::AlreadyExists { message, .. }
            | CriError::Other { message, .. } => message.clone(),
            other => other.to_string(),
        }
    }

    /// The error as a Go gRPC client prints it (`rpc error: code = NotFound
    /// desc = ...`), what kubelet shows for a failed streaming call.
    pub fn grpc_text(&self) -> String {
        match self.code() {
            Some(code) => format!("rpc error: code = {code:?} desc = {}", self.message()),
            None => self.to_string(),
        }
    }

    /// True for [`CriError::NotFound`].
    pub fn is_not_found(&self) -> bool {
        matches!(self, CriError::NotFound { .. })
    }

    /// True for [`CriError::Unimplemented`].
    pub fn is_unimplemented(&self) -> bool {
        matches!(self, CriError::Unimplemented { .. })
    }

    /// True for [`CriError::DeadlineExceeded`].
    pub fn is_deadline_exceeded(&self) -> bool {
        matches!(self, CriError::DeadlineExceeded { .. })
    }

    /// True for [`CriError::Unavailable`].
    pub fn is_unavailable(&self) -> bool {
        matches!(self, CriError::Unavailable { .. })
    }
}

/// Whether tonic's own deadline enforcement produced this status.
fn is_local_timeout(status: &tonic::Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(err) = source {
        if err.is::<tonic::TimeoutExpired>() {
            return true;
        }
        source = err.source();
    }
    status.message() == "Timeout expired"
}

/// The status message, completed with the transport error underneath when
/// tonic reports a connection failure (its own message is then terse).
fn status_message(status: &tonic::Status) -> String {
    let mut message = status.message().to_string();
    let mut source = std::error::Error::source(status);
    while let Some(err) = source {
        let text = err.to_string();
        if !text.is_empty() && !message.contains(&text) {
            if !message.is_empty() {
                message.push_str(": ");
            }
            message.push_str(&text);
        }
        source = err.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_map_to_variants_with_method_in_message() {
        let cases = [
            (Code::NotFound, "not found"),
            (Code::Unavailable, "runtime unavailable"),
            (Code::DeadlineExceeded, "deadline exceeded"),
            (Code::Unimplemented, "not implemented"),
            (Code::InvalidArgument, "invalid argument"),
            (Code::AlreadyExists, "already exists"),
            (Code::Internal, "Internal"),
            (Code::Unknown, "Unknown"),
        ];
        for (code, words) in cases {
            let err = CriError::from_status("ContainerStatus", &tonic::Status::new(code, "boom"));
            assert_eq!(err.code(), Some(code));
            assert_eq!(err.method(), "ContainerStatus");
            let text = err.to_string();
            assert!(text.contains("ContainerStatus"), "{text}");
            assert!(text.contains(words), "{text}");
            assert!(text.contains("boom"), "{text}");
        }
    }

    #[test]
    fn tonic_timeout_is_a_deadline() {
        let err = CriError::from_status("Version", &tonic::Status::cancelled("Timeout expired"));
        assert!(err.is_deadline_exceeded(), "{err}");
        let err = CriError::from_status("Version", &tonic::Status::cancelled("client went away"));
        assert_eq!(err.code(), Some(Code::Cancelled));
    }

    #[test]
    fn predicates() {
        let nf = CriError::from_status("X", &tonic::Status::not_found("a"));
        assert!(nf.is_not_found() && !nf.is_unavailable());
        let un = CriError::from_status("X", &tonic::Status::unimplemented("a"));
        assert!(un.is_unimplemented());
        let dl = CriError::deadline("X", Duration::from_secs(1));
        assert!(dl.is_deadline_exceeded());
        assert!(dl.to_string().contains("1s"));
    }
}

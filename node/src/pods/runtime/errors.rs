//! Why a sync step failed, in kubelet's words: the short reason shown as a
//! container's `waiting.reason` (`ErrImagePull`, `CrashLoopBackOff`, ...)
//! and the longer message shown as `waiting.message`.

use std::fmt;

use keelson_cri::CriError;

/// `ErrImagePull`.
pub const ERR_IMAGE_PULL: &str = "ErrImagePull";
/// `ImagePullBackOff`.
pub const IMAGE_PULL_BACK_OFF: &str = "ImagePullBackOff";
/// `ErrImageNeverPull`.
pub const ERR_IMAGE_NEVER_PULL: &str = "ErrImageNeverPull";
/// `InvalidImageName`.
pub const INVALID_IMAGE_NAME: &str = "InvalidImageName";
/// `ImageInspectError`.
pub const IMAGE_INSPECT_ERROR: &str = "ImageInspectError";
/// `RegistryUnavailable`.
pub const REGISTRY_UNAVAILABLE: &str = "RegistryUnavailable";
/// `CreateContainerConfigError`.
pub const CREATE_CONTAINER_CONFIG_ERROR: &str = "CreateContainerConfigError";
/// `CreateContainerError`.
pub const CREATE_CONTAINER_ERROR: &str = "CreateContainerError";
/// `RunContainerError`.
pub const RUN_CONTAINER_ERROR: &str = "RunContainerError";
/// `PostStartHookError`.
pub const POST_START_HOOK_ERROR: &str = "PostStartHookError";
/// `CrashLoopBackOff`.
pub const CRASH_LOOP_BACK_OFF: &str = "CrashLoopBackOff";
/// `KillContainerError`.
pub const KILL_CONTAINER_ERROR: &str = "KillContainerError";
/// `RemoveContainerError`.
pub const REMOVE_CONTAINER_ERROR: &str = "RemoveContainerError";
/// `CreatePodSandboxError`.
pub const CREATE_POD_SANDBOX_ERROR: &str = "CreatePodSandboxError";
/// `ConfigPodSandboxError`.
pub const CONFIG_POD_SANDBOX_ERROR: &str = "ConfigPodSandboxError";
/// `KillPodSandboxError`.
pub const KILL_POD_SANDBOX_ERROR: &str = "KillPodSandboxError";
/// `ErrResizePodInPlace`.
pub const RESIZE_POD_IN_PLACE_ERROR: &str = "ResizePodInPlaceError";

/// A failed step: reason and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepError {
    /// kubelet's short reason.
    pub reason: &'static str,
    /// The message.
    pub message: String,
}

impl StepError {
    /// Builds one; `message` is a text or a typed error's Display.
    pub fn new(reason: &'static str, message: impl fmt::Display) -> Self {
        StepError {
            reason,
            message: message.to_string(),
        }
    }
}

impl fmt::Display for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.reason, self.message)
    }
}

impl std::error::Error for StepError {}

/// A failed CRI call, shown as Go's gRPC client prints it ([`grpc_text`]).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", grpc_text(.0))]
pub struct GrpcError(pub CriError);

/// A CRI error as Go's gRPC client prints it
/// (`rpc error: code = NotFound desc = ...`), which is what kubelet puts in
/// messages and events.
pub fn grpc_text(e: &CriError) -> String {
    match e.code() {
        Some(code) => format!(
            "rpc error: code = {} desc = {}",
            code_name(code),
            cri_message(e)
        ),
        None => e.to_string(),
    }
}

/// The runtime's own message of a CRI error (what `status.Message()` gives).
pub fn cri_message(e: &CriError) -> String {
    match e {
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

fn code_name(code: keelson_cri::Code) -> &'static str {
    keelson_cri::go_code_name(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_grpc_error_text() {
        let e = CriError::NotFound {
            method: "PullImage",
            message: "failed to resolve".into(),
        };
        assert_eq!(
            grpc_text(&e),
            "rpc error: code = NotFound desc = failed to resolve"
        );
        assert_eq!(cri_message(&e), "failed to resolve");
    }
}

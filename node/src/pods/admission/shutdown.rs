//! The graceful node shutdown manager's admit handler (kubelet's
//! `managerImpl.Admit`, pkg/kubelet/nodeshutdown/nodeshutdown_manager_linux.go):
//! while the node shuts down, every new pod is refused.

use super::{Verdict, rejection};
use crate::status::ShuttingDown;

/// `NodeShutdownNotAdmittedReason`.
pub const REASON: &str = "NodeShutdown";
/// `nodeShutdownNotAdmittedMessage`.
pub const MESSAGE: &str = "Pod was rejected as the node is shutting down.";

/// Refuses every pod while `flag` says the node is shutting down.
pub fn admit(flag: &ShuttingDown) -> Verdict {
    if flag.is_shutting_down() {
        return Err(rejection(REASON, MESSAGE.to_string()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_only_while_shutting_down() {
        let flag = ShuttingDown::default();
        assert!(admit(&flag).is_ok());
        flag.set(true);
        let r = admit(&flag).expect_err("refused");
        assert_eq!((r.reason.as_str(), r.message.as_str()), (REASON, MESSAGE));
        flag.set(false);
        assert!(admit(&flag).is_ok());
    }
}

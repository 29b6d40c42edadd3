//! What the fake runtime was asked (the call log) and the trouble a test
//! asked it to cause (latency, failures) per CRI method.

use std::collections::HashMap;
use std::time::Duration;

use tonic::{Code, Status};

/// One call the fake runtime received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// CRI method name, e.g. `"RunPodSandbox"`.
    pub method: &'static str,
    /// What the call was about: a sandbox/container id, an image reference,
    /// a pod or container name, or empty.
    pub subject: String,
    /// When it came, on the fake's clock (ns since the epoch).
    pub at: i64,
}

#[derive(Debug)]
struct Failure {
    remaining: u32,
    code: Code,
    message: String,
}

#[derive(Debug, Default)]
pub(crate) struct Faults {
    calls: Vec<Call>,
    latency: HashMap<String, Duration>,
    failures: HashMap<String, Failure>,
}

impl Faults {
    /// Logs a call and returns (latency to apply, failure to return).
    pub(crate) fn on_call(
        &mut self,
        method: &'static str,
        subject: String,
        at: i64,
    ) -> (Duration, Option<Status>) {
        self.calls.push(Call {
            method,
            subject,
            at,
        });
        let latency = self
            .latency
            .get(method)
            .or_else(|| self.latency.get("*"))
            .copied()
            .unwrap_or_default();
        let mut failure = None;
        for key in [method, "*"] {
            if let Some(f) = self.failures.get_mut(key)
                && f.remaining > 0
            {
                f.remaining -= 1;
                failure = Some(Status::new(f.code, f.message.clone()));
                break;
            }
        }
        (latency, failure)
    }

    pub(crate) fn set_latency(&mut self, method: &str, latency: Duration) {
        if latency.is_zero() {
            self.latency.remove(method);
        } else {
            self.latency.insert(method.to_string(), latency);
        }
    }

    pub(crate) fn fail_next(&mut self, method: &str, times: u32, code: Code, message: &str) {
        self.failures.insert(
            method.to_string(),
            Failure {
                remaining: times,
                code,
                message: message.to_string(),
            },
        );
    }

    pub(crate) fn calls(&self) -> Vec<Call> {
        self.calls.clone()
    }

    pub(crate) fn clear_calls(&mut self) {
        self.calls.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_count_down_and_latency_applies_per_method() {
        let mut f = Faults::default();
        f.fail_next("Version", 2, Code::Unavailable, "down");
        f.set_latency("Status", Duration::from_millis(5));
        let (l, e) = f.on_call("Version", String::new(), 0);
        assert_eq!(l, Duration::ZERO);
        assert_eq!(e.map(|s| s.code()), Some(Code::Unavailable));
        assert!(f.on_call("Version", String::new(), 0).1.is_some());
        assert!(f.on_call("Version", String::new(), 0).1.is_none());
        assert_eq!(
            f.on_call("Status", String::new(), 0).0,
            Duration::from_millis(5)
        );
        assert_eq!(f.calls().len(), 4);
        f.clear_calls();
        assert!(f.calls().is_empty());
    }

    #[test]
    fn wildcard_applies_to_every_method() {
        let mut f = Faults::default();
        f.fail_next("*", 1, Code::Internal, "x");
        assert!(f.on_call("ListContainers", String::new(), 0).1.is_some());
        assert!(f.on_call("ListContainers", String::new(), 0).1.is_none());
    }
}

//! The conformance tests that cannot run on this machine, for either agent,
//! each with its reason. Only what the environment lacks belongs here (no
//! registry, no image that can be built from what is here, no cloud): a
//! test that fails because an agent behaves differently is a bug to fix,
//! never an entry of this list. `scripts/conformance` leaves them out of
//! both runs and docs/conformance.md prints the reason beside each.

/// A test left out of every run.
#[derive(Debug, Clone, Copy)]
pub struct EnvironmentSkip {
    /// The test's full name, exactly as the suite prints it.
    pub name: &'static str,
    /// Why it cannot run here.
    pub reason: &'static str,
}

const SKIPS: &[EnvironmentSkip] = &[
    EnvironmentSkip {
        name: "[sig-api-machinery] Aggregator Should be able to support the 1.17 Sample API Server using the current Aggregator [LinuxOnly] [Conformance]",
        reason: "needs the sample-apiserver image (registry.k8s.io/e2e-test-images/sample-apiserver:1.29.2): no registry is reachable and its binary is not among the shared binaries, so it cannot be built here",
    },
    EnvironmentSkip {
        name: "[sig-node] ImageVolume should succeed with pod and pull policy of Always [LinuxOnly] [MinimumKubeletVersion:1.35] [Conformance]",
        reason: "pulls its image volume with pull policy Always from a registry, and none is reachable here",
    },
];

/// Every environment skip.
pub fn environment_skips() -> &'static [EnvironmentSkip] {
    SKIPS
}

/// The reason `name` is skipped here, if it is.
pub fn reason(name: &str) -> Option<&'static str> {
    SKIPS.iter().find(|s| s.name == name).map(|s| s.reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_skip_names_a_conformance_test_and_says_why() {
        for s in environment_skips() {
            assert!(s.name.ends_with("[Conformance]"), "{}", s.name);
            assert!(s.reason.len() > 20, "{}: reason too short", s.name);
            assert_eq!(reason(s.name), Some(s.reason));
        }
        assert_eq!(reason("[sig-node] not a test"), None);
    }
}

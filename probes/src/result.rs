//! What one probe run says ([`ProbeResult`]), what the manager keeps per
//! container ([`ProbeState`]) and which probe it was ([`ProbeKind`]).

use std::fmt;

/// The outcome of running a probe handler once, with the message upstream
/// would put in the container's `Unhealthy` / `ProbeWarning` event.
///
/// Messages follow kubelet's `pkg/probe/*` wording so they can go into events
/// verbatim, e.g. `HTTP probe failed with statuscode: 500`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeResult {
    /// The check passed.
    Success,
    /// The check passed, with something worth a `ProbeWarning` event (an
    /// HTTP probe stopped at a redirect to another host, for example).
    Warning(String),
    /// The check failed; counts toward `failureThreshold`.
    Failure(String),
    /// The prober could not run the check at all (a named port that does not
    /// exist, a runtime error from exec). Upstream calls this "probe errored":
    /// it is reported in an `Unhealthy` event and otherwise thrown away — it
    /// counts toward neither threshold.
    Unknown(String),
}

impl ProbeResult {
    /// The lower-case word upstream uses for this result in messages
    /// (`success`, `warning`, `failure`, `unknown`).
    pub fn word(&self) -> &'static str {
        match self {
            ProbeResult::Success => "success",
            ProbeResult::Warning(_) => "warning",
            ProbeResult::Failure(_) => "failure",
            ProbeResult::Unknown(_) => "unknown",
        }
    }

    /// True for [`ProbeResult::Success`] and [`ProbeResult::Warning`].
    pub fn is_success(&self) -> bool {
        matches!(self, ProbeResult::Success | ProbeResult::Warning(_))
    }
}

/// The result a probe has for a container, as cached by the manager (upstream
/// `results.Result`). This is what the pod worker reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProbeState {
    /// Not decided yet (a startup probe that has not reached a threshold).
    Unknown,
    /// The probe passed (`successThreshold` consecutive successes).
    Success,
    /// The probe failed (`failureThreshold` consecutive failures).
    Failure,
}

impl fmt::Display for ProbeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProbeState::Unknown => "UNKNOWN",
            ProbeState::Success => "Success",
            ProbeState::Failure => "Failure",
        })
    }
}

/// Which of a container's three probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProbeKind {
    /// `livenessProbe`: failure means the container is killed and restarted.
    Liveness,
    /// `readinessProbe`: decides the container's `ready` flag.
    Readiness,
    /// `startupProbe`: holds liveness and readiness off until it passes.
    Startup,
}

impl ProbeKind {
    /// All kinds, in upstream's iteration order.
    pub const ALL: [ProbeKind; 3] = [
        ProbeKind::Liveness,
        ProbeKind::Readiness,
        ProbeKind::Startup,
    ];

    /// Upstream's name (`Liveness`, `Readiness`, `Startup`), used in event
    /// messages and as the `probe_type` metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeKind::Liveness => "Liveness",
            ProbeKind::Readiness => "Readiness",
            ProbeKind::Startup => "Startup",
        }
    }

    /// The value a probe has before it has run: readiness starts failed (not
    /// ready until proven ready), liveness starts successful (never kill over
    /// a probe that has not run), startup starts unknown.
    pub fn initial_state(self) -> ProbeState {
        match self {
            ProbeKind::Readiness => ProbeState::Failure,
            ProbeKind::Liveness => ProbeState::Success,
            ProbeKind::Startup => ProbeState::Unknown,
        }
    }
}

impl fmt::Display for ProbeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_use_upstream_names_and_initial_values() {
        assert_eq!(ProbeKind::Liveness.to_string(), "Liveness");
        assert_eq!(ProbeKind::Readiness.to_string(), "Readiness");
        assert_eq!(ProbeKind::Startup.to_string(), "Startup");
        assert_eq!(ProbeKind::Readiness.initial_state(), ProbeState::Failure);
        assert_eq!(ProbeKind::Liveness.initial_state(), ProbeState::Success);
        assert_eq!(ProbeKind::Startup.initial_state(), ProbeState::Unknown);
    }

    #[test]
    fn warning_counts_as_success() {
        assert!(ProbeResult::Warning("w".into()).is_success());
        assert!(!ProbeResult::Failure("f".into()).is_success());
        assert!(!ProbeResult::Unknown("u".into()).is_success());
        assert_eq!(ProbeResult::Unknown("u".into()).word(), "unknown");
    }
}

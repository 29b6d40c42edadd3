//! Named health checks behind `/healthz` (liveness) and `/readyz`
//! (readiness), answered the way Kubernetes components answer: `ok`, or with
//! `?verbose` one `[+]name ok` / `[-]name failed: reason` line per check.
//!
//! Each role registers its own checks; a check is a flag the role sets, or
//! a function evaluated on every request (for freshness checks such as
//! "last proxy sync younger than 2×syncPeriod").

use std::sync::{Arc, RwLock};

/// Which endpoint a check belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    /// `/healthz` and `/livez`: failing means "restart me".
    Liveness,
    /// `/readyz`: failing means "not ready to serve yet".
    Readiness,
}

/// Why a check fails: the reason shown after `[-]<name> failed: ` in
/// verbose output and in `/healthz/<name>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CheckFailed(pub String);

type CheckFn = Arc<dyn Fn() -> Result<(), CheckFailed> + Send + Sync>;

struct Check {
    name: String,
    kind: ProbeKind,
    f: CheckFn,
}

/// The registry of checks; cheap to clone.
#[derive(Clone, Default)]
pub struct Health {
    checks: Arc<RwLock<Vec<Check>>>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health").finish_non_exhaustive()
    }
}

/// A check whose state the owner sets.
#[derive(Clone, Debug)]
pub struct HealthFlag {
    state: Arc<RwLock<Result<(), CheckFailed>>>,
}

impl HealthFlag {
    /// Marks the check as passing.
    pub fn set_ok(&self) {
        if let Ok(mut s) = self.state.write() {
            *s = Ok(());
        }
    }

    /// Marks the check as failing with a reason shown in verbose output.
    pub fn set_failed(&self, reason: impl Into<String>) {
        if let Ok(mut s) = self.state.write() {
            *s = Err(CheckFailed(reason.into()));
        }
    }

    /// Current state.
    pub fn get(&self) -> Result<(), CheckFailed> {
        self.state
            .read()
            .map(|s| s.clone())
            .unwrap_or_else(|_| Err(CheckFailed("health state poisoned".to_string())))
    }
}

impl Health {
    /// A new, empty registry (the implicit `ping` check always passes).
    pub fn new() -> Self {
        Health::default()
    }

    /// Registers a check evaluated on every request.
    pub fn register_fn<F, E>(&self, name: &str, kind: ProbeKind, f: F)
    where
        F: Fn() -> Result<(), E> + Send + Sync + 'static,
        E: std::fmt::Display,
    {
        if let Ok(mut c) = self.checks.write() {
            c.retain(|c| !(c.name == name && c.kind == kind));
            c.push(Check {
                name: name.to_string(),
                kind,
                f: Arc::new(move || f().map_err(|e| CheckFailed(e.to_string()))),
            });
        }
    }

    /// Registers a flag check, initially failing with `initial` (or passing when `None`).
    pub fn register_flag(&self, name: &str, kind: ProbeKind, initial: Option<&str>) -> HealthFlag {
        let flag = HealthFlag {
            state: Arc::new(RwLock::new(match initial {
                Some(r) => Err(CheckFailed(r.to_string())),
                None => Ok(()),
            })),
        };
        let f = flag.clone();
        self.register_fn(name, kind, move || f.get());
        flag
    }

    /// Evaluates every check of a kind: `(name, result)` in registration order,
    /// `ping` first.
    pub fn evaluate(&self, kind: ProbeKind) -> Vec<(String, Result<(), CheckFailed>)> {
        let mut out = vec![("ping".to_string(), Ok(()))];
        if let Ok(checks) = self.checks.read() {
            for c in checks.iter().filter(|c| c.kind == kind) {
                out.push((c.name.clone(), (c.f)()));
            }
        }
        out
    }

    /// Renders the answer: (all passed, body). `verbose` lists every check;
    /// `exclude` skips checks by name, as `?exclude=` does upstream.
    pub fn render(&self, kind: ProbeKind, verbose: bool, exclude: &[String]) -> (bool, String) {
        let results: Vec<_> = self
            .evaluate(kind)
            .into_iter()
            .filter(|(n, _)| !exclude.contains(n))
            .collect();
        let ok = results.iter().all(|(_, r)| r.is_ok());
        let endpoint = match kind {
            ProbeKind::Liveness => "healthz",
            ProbeKind::Readiness => "readyz",
        };
        if ok && !verbose {
            return (true, "ok".to_string());
        }
        let mut body = String::new();
        for (name, r) in &results {
            match r {
                Ok(()) => body.push_str(&format!("[+]{name} ok\n")),
                Err(e) => body.push_str(&format!("[-]{name} failed: {e}\n")),
            }
        }
        if ok {
            body.push_str(&format!("{endpoint} check passed\n"));
        } else {
            body.push_str(&format!("{endpoint} check failed\n"));
        }
        (ok, body)
    }

    /// The result of one named check, for `/healthz/<name>`.
    pub fn single(&self, kind: ProbeKind, name: &str) -> Option<Result<(), CheckFailed>> {
        self.evaluate(kind)
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, r)| r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_drive_the_answer() {
        let h = Health::new();
        let f = h.register_flag("syncloop", ProbeKind::Liveness, Some("not started"));
        let (ok, body) = h.render(ProbeKind::Liveness, false, &[]);
        assert!(!ok);
        assert!(body.contains("[-]syncloop failed: not started"), "{body}");
        f.set_ok();
        assert_eq!(
            h.render(ProbeKind::Liveness, false, &[]),
            (true, "ok".to_string())
        );
        let (_, verbose) = h.render(ProbeKind::Liveness, true, &[]);
        assert!(
            verbose.contains("[+]ping ok") && verbose.contains("[+]syncloop ok"),
            "{verbose}"
        );
        // readiness is separate
        assert!(h.render(ProbeKind::Readiness, false, &[]).0);
    }

    #[test]
    fn exclude_skips_a_failing_check() {
        let h = Health::new();
        h.register_fn("bad", ProbeKind::Readiness, || Err("nope".to_string()));
        assert!(!h.render(ProbeKind::Readiness, false, &[]).0);
        assert!(
            h.render(ProbeKind::Readiness, false, &["bad".to_string()])
                .0
        );
        assert_eq!(
            h.single(ProbeKind::Readiness, "bad"),
            Some(Err(CheckFailed("nope".to_string())))
        );
    }
}

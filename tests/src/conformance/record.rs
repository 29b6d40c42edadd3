//! The record of one conformance run: every `[Conformance]` test of the
//! suite with its outcome on that run's agents, written as JSON so two
//! runs (keelson and the baseline) make one table.

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::suite::{SpecReport, SuiteOutcome};
use super::{ConformanceError, Options, skips};
use crate::upstream::Agents;

/// What happened to one test.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "camelCase")]
pub enum Outcome {
    /// It ran and passed.
    Passed {
        /// Its duration.
        seconds: f64,
    },
    /// It ran and failed (also: panicked, timed out, interrupted).
    Failed {
        /// Its duration.
        seconds: f64,
        /// ginkgo's state when not `failed`.
        state: String,
        /// The start of the failure message.
        message: String,
    },
    /// It did not run.
    NotRun {
        /// Why.
        reason: String,
    },
}

/// One test of a run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TestRecord {
    /// Full name, as `e2e.test --list-conformance-tests` prints its codename.
    pub name: String,
    /// `sig-node`, `sig-network`, ...
    pub sig: String,
    /// What happened.
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// One run of the suite.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRecord {
    /// `keelson` or `kubelet`.
    pub agent: String,
    /// The agents in words.
    pub agents: String,
    /// The keelson commit checked out when the run started.
    pub commit: String,
    /// When it ended (RFC 3339).
    pub date: String,
    /// Nodes of the cluster.
    pub nodes: usize,
    /// ginkgo's `--procs`.
    pub parallel: usize,
    /// The run's `--focus` expressions.
    pub focus: Vec<String>,
    /// The run's `--skip` expressions.
    pub skip: Vec<String>,
    /// Bringing the cluster up (images, control plane, nodes Ready).
    pub setup_seconds: f64,
    /// The suite's wall time.
    pub suite_seconds: f64,
    /// What the cluster lacked (which environment skips applied).
    #[serde(default)]
    pub environment: skips::Environment,
    /// Every conformance test of the suite.
    pub tests: Vec<TestRecord>,
}

/// The key of a run's agents in file names and records.
pub fn agent_key(agents: Agents) -> &'static str {
    match agents {
        Agents::Keelson => "keelson",
        Agents::Upstream => "kubelet",
    }
}

fn agents_in_words(agents: Agents) -> &'static str {
    match agents {
        Agents::Keelson => "keelson (node and proxy roles)",
        Agents::Upstream => "kubelet + kube-proxy v1.36.2",
    }
}

impl RunRecord {
    /// The record of a run: every listed conformance test, with its
    /// outcome from `outcome` (or why it did not run).
    pub fn new(
        opts: &Options,
        commit: String,
        setup_seconds: f64,
        listed: &[SpecReport],
        outcome: &SuiteOutcome,
    ) -> RunRecord {
        let ran: HashMap<String, &SpecReport> =
            outcome.specs.iter().map(|s| (s.full_name(), s)).collect();
        let tests = listed
            .iter()
            .map(|spec| {
                let name = spec.full_name();
                let outcome = classify(&name, ran.get(&name).copied(), &outcome.environment);
                TestRecord {
                    sig: sig_of(spec),
                    name,
                    outcome,
                }
            })
            .collect();
        RunRecord {
            agent: agent_key(opts.agents).to_string(),
            agents: agents_in_words(opts.agents).to_string(),
            commit,
            date: jiff::Timestamp::now()
                .round(jiff::Unit::Second)
                .map_or_else(|_| String::new(), |t| t.to_string()),
            nodes: opts.nodes,
            parallel: opts.parallel,
            focus: opts.focus.clone(),
            skip: opts.skip.clone(),
            setup_seconds,
            suite_seconds: outcome.seconds,
            environment: outcome.environment,
            tests,
        }
    }

    /// Writes the record as JSON.
    pub fn write(&self, path: &Path) -> Result<(), ConformanceError> {
        let text = serde_json::to_string_pretty(self).map_err(|e| ConformanceError::Suite {
            context: "rendering the run record".into(),
            message: e.to_string(),
        })?;
        std::fs::write(path, text).map_err(|e| ConformanceError::Suite {
            context: format!("writing {}", path.display()),
            message: e.to_string(),
        })
    }

    /// Reads a record written by [`RunRecord::write`].
    pub fn read(path: &Path) -> Result<RunRecord, ConformanceError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConformanceError::Suite {
            context: format!("reading {}", path.display()),
            message: e.to_string(),
        })?;
        serde_json::from_str(&text).map_err(|e| ConformanceError::Suite {
            context: format!("parsing {}", path.display()),
            message: e.to_string(),
        })
    }

    /// (passed, failed, not run).
    pub fn counts(&self) -> (usize, usize, usize) {
        self.tests
            .iter()
            .fold((0, 0, 0), |(p, f, n), t| match t.outcome {
                Outcome::Passed { .. } => (p + 1, f, n),
                Outcome::Failed { .. } => (p, f + 1, n),
                Outcome::NotRun { .. } => (p, f, n + 1),
            })
    }
}

fn classify(name: &str, ran: Option<&SpecReport>, env: &skips::Environment) -> Outcome {
    if let Some(reason) = skips::reason(name, env) {
        return Outcome::NotRun {
            reason: format!("cannot run here: {reason}"),
        };
    }
    let Some(spec) = ran else {
        return Outcome::NotRun {
            reason: "absent from the run's report".into(),
        };
    };
    let seconds = spec.run_time as f64 / 1e9;
    let message = spec
        .failure
        .as_ref()
        .map(|f| first_line(&f.message))
        .unwrap_or_default();
    match spec.state.as_str() {
        "passed" => Outcome::Passed { seconds },
        "skipped" | "pending" if message.is_empty() => Outcome::NotRun {
            reason: "not selected by the run's --focus/--skip".into(),
        },
        "skipped" | "pending" => Outcome::NotRun {
            reason: format!("skipped by the test: {message}"),
        },
        state => Outcome::Failed {
            seconds,
            state: state.to_string(),
            message,
        },
    }
}

fn first_line(message: &str) -> String {
    let line = message.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let mut line = line.trim().to_string();
    if line.len() > 300 {
        let mut end = 300;
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        line.truncate(end);
        line.push('…');
    }
    line
}

/// The sig of a spec: its first container's `[sig-...]` tag.
fn sig_of(spec: &SpecReport) -> String {
    spec.container_hierarchy_texts
        .first()
        .and_then(|t| t.strip_prefix('['))
        .and_then(|t| t.split(']').next())
        .unwrap_or("unknown")
        .to_string()
}

/// The commit checked out in the working directory (`unknown` outside a
/// git tree).
pub fn git_commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENV: skips::Environment = skips::Environment {
        openapi_broken: false,
    };

    fn spec(leaf: &str, state: &str, failure: Option<&str>) -> SpecReport {
        serde_json::from_value(serde_json::json!({
            "ContainerHierarchyTexts": ["[sig-node] Pods"],
            "LeafNodeText": leaf,
            "LeafNodeType": "It",
            "LeafNodeLabels": ["Conformance"],
            "State": state,
            "RunTime": 2_500_000_000i64,
            "Failure": failure.map(|m| serde_json::json!({"Message": m})),
        }))
        .expect("spec")
    }

    #[test]
    fn outcomes_follow_ginkgo_states() {
        let passed = spec("a [Conformance]", "passed", None);
        assert_eq!(
            classify(&passed.full_name(), Some(&passed), &ENV),
            Outcome::Passed { seconds: 2.5 }
        );
        let failed = spec(
            "b [Conformance]",
            "timedout",
            Some("\nwaiting for pod\nmore"),
        );
        assert_eq!(
            classify(&failed.full_name(), Some(&failed), &ENV),
            Outcome::Failed {
                seconds: 2.5,
                state: "timedout".into(),
                message: "waiting for pod".into()
            }
        );
        let filtered = spec("c [Conformance]", "skipped", None);
        assert!(matches!(
            classify(&filtered.full_name(), Some(&filtered), &ENV),
            Outcome::NotRun { reason } if reason.contains("--focus")
        ));
        let by_test = spec(
            "d [Conformance]",
            "skipped",
            Some("Only supported for providers [gce]"),
        );
        assert!(matches!(
            classify(&by_test.full_name(), Some(&by_test), &ENV),
            Outcome::NotRun { reason } if reason == "skipped by the test: Only supported for providers [gce]"
        ));
        assert!(matches!(
            classify("[sig-node] gone", None, &ENV),
            Outcome::NotRun { .. }
        ));
        assert_eq!(sig_of(&passed), "sig-node");
    }

    #[test]
    fn an_environment_skip_wins_over_the_report() {
        let skip = skips::environment_skips(&ENV).next().expect("a skip");
        assert!(matches!(
            classify(skip.name, None, &ENV),
            Outcome::NotRun { reason } if reason.starts_with("cannot run here: ")
        ));
    }
}

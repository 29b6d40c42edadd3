//! Running `e2e.test` through the ginkgo CLI and reading its JSON report.
//!
//! The suite runs inside the control plane's network namespace, where the
//! API server is `127.0.0.1:6443` and every node and pod IP is routed, as
//! a test runner in a real cluster's network would see them. ginkgo runs
//! in a process group of its own, which is killed when the run is dropped
//! (Ctrl-C), so no `e2e.test` process outlives it.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;

use serde::Deserialize;

use super::cluster::Cluster;
use super::{ConformanceError, Options, skips};
use crate::upstream::UpstreamBins;
use crate::upstream::node::CLUSTER_DOMAIN;

/// One spec of the suite as ginkgo reports it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct SpecReport {
    /// The texts of the enclosing containers (`[sig-node] Pods`, ...).
    #[serde(default, deserialize_with = "null_as_empty")]
    pub container_hierarchy_texts: Vec<String>,
    /// The `It`'s own text (its tags such as `[Conformance]` included).
    #[serde(default)]
    pub leaf_node_text: String,
    /// `It`, `BeforeSuite`, ...
    #[serde(default)]
    pub leaf_node_type: String,
    /// The leaf's labels.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub leaf_node_labels: Vec<String>,
    /// The containers' labels.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub container_hierarchy_labels: Vec<Option<Vec<String>>>,
    /// `passed`, `failed`, `skipped`, `pending`, `panicked`, `timedout`, ...
    #[serde(default)]
    pub state: String,
    /// Nanoseconds.
    #[serde(default)]
    pub run_time: i64,
    /// Why it failed.
    #[serde(default)]
    pub failure: Option<Failure>,
}

/// A spec's failure.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Failure {
    /// The assertion's message.
    #[serde(default)]
    pub message: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SuiteReport {
    #[serde(default, deserialize_with = "null_as_empty")]
    spec_reports: Vec<SpecReport>,
}

/// Go writes an empty slice as `null`.
fn null_as_empty<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

impl SpecReport {
    /// The spec's full name, as ginkgo's focus matches it and the
    /// conformance list prints it.
    pub fn full_name(&self) -> String {
        let mut parts = self.container_hierarchy_texts.clone();
        parts.push(self.leaf_node_text.clone());
        parts.join(" ")
    }

    /// Whether it carries `label` (on itself or a container).
    pub fn has_label(&self, label: &str) -> bool {
        self.leaf_node_labels.iter().any(|l| l == label)
            || self
                .container_hierarchy_labels
                .iter()
                .flatten()
                .flatten()
                .any(|l| l == label)
    }
}

/// The outcome of a suite run.
#[derive(Debug)]
pub struct SuiteOutcome {
    /// Every `It` ginkgo reported (run or skipped).
    pub specs: Vec<SpecReport>,
    /// Wall time of the ginkgo run.
    pub seconds: f64,
    /// ginkgo's output.
    pub log: PathBuf,
    /// What the cluster lacked.
    pub environment: skips::Environment,
}

/// Every `[Conformance]` spec of this `e2e.test`, from a dry run.
pub fn list_conformance(bins: &UpstreamBins) -> Result<Vec<SpecReport>, ConformanceError> {
    let dir = tempfile::tempdir().map_err(|e| ConformanceError::Suite {
        context: "creating a temporary directory".into(),
        message: e.to_string(),
    })?;
    let report = dir.path().join("dry-run.json");
    let out = std::process::Command::new(bins.path("e2e.test"))
        .args([
            "--ginkgo.dry-run",
            "--ginkgo.no-color",
            "--ginkgo.label-filter=Conformance",
            "--provider=skeleton",
        ])
        .arg(format!("--ginkgo.json-report={}", report.display()))
        .stdin(Stdio::null())
        .output()
        .map_err(|e| ConformanceError::Suite {
            context: "starting e2e.test --ginkgo.dry-run".into(),
            message: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(ConformanceError::Suite {
            context: "e2e.test --ginkgo.dry-run".into(),
            message: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    let specs = read_report(&report)?;
    Ok(specs
        .into_iter()
        .filter(|s| s.leaf_node_type == "It" && s.has_label("Conformance"))
        .collect())
}

/// Runs the suite against `cluster` and reads ginkgo's report.
pub async fn run_suite(
    opts: &Options,
    cluster: &Cluster,
) -> Result<SuiteOutcome, ConformanceError> {
    let agent = super::record::agent_key(opts.agents);
    let out_dir = opts.out.join(format!("{agent}-ginkgo"));
    std::fs::create_dir_all(&out_dir).map_err(|e| ConformanceError::Suite {
        context: format!("creating {}", out_dir.display()),
        message: e.to_string(),
    })?;
    let report = out_dir.join("report.json");
    let _ = std::fs::remove_file(&report);
    let log = opts.out.join(format!("{agent}-e2e.log"));
    let log_file = std::fs::File::create(&log).map_err(|e| ConformanceError::Suite {
        context: format!("creating {}", log.display()),
        message: e.to_string(),
    })?;
    let log_err = log_file.try_clone().map_err(|e| ConformanceError::Suite {
        context: "cloning the log file".into(),
        message: e.to_string(),
    })?;

    let mut cmd = cluster
        .cp
        .net()
        .netns()
        .command(&opts.bins.path("ginkgo").display().to_string());
    cmd.args(ginkgo_args(opts, &cluster.environment, &out_dir))
        .arg(opts.bins.path("e2e.test"))
        .arg("--")
        .args(e2e_args(opts, &cluster.kubeconfig, &out_dir))
        .env("KUBECONFIG", &cluster.kubeconfig)
        .stdin(Stdio::null())
        .stdout(log_file)
        .stderr(log_err)
        .process_group(0);
    eprintln!(
        "conformance: running the suite ({} procs), output in {}",
        opts.parallel,
        log.display()
    );
    let started = Instant::now();
    let child =
        tokio::process::Command::from(cmd)
            .spawn()
            .map_err(|e| ConformanceError::Suite {
                context: "starting ginkgo".into(),
                message: e.to_string(),
            })?;
    let mut group = ProcessGroup(Some(child));
    let status = group.wait().await;
    let seconds = started.elapsed().as_secs_f64();
    let status = status.map_err(|e| ConformanceError::Suite {
        context: "waiting for ginkgo".into(),
        message: e.to_string(),
    })?;
    // A failing spec makes ginkgo exit non-zero: that is a result. No
    // report at all is not.
    let specs = read_report(&report).map_err(|e| ConformanceError::Suite {
        context: format!("ginkgo exited ({status}) without a usable report"),
        message: format!("{e}; see {}", log.display()),
    })?;
    if let Err(e) = cluster.check_running() {
        eprintln!("conformance: warning: a cluster process exited during the run: {e}");
    }
    Ok(SuiteOutcome {
        specs: specs
            .into_iter()
            .filter(|s| s.leaf_node_type == "It")
            .collect(),
        seconds,
        log,
        environment: cluster.environment,
    })
}

fn ginkgo_args(opts: &Options, env: &skips::Environment, out_dir: &Path) -> Vec<String> {
    let mut args = vec![
        format!("--procs={}", opts.parallel.max(1)),
        "--no-color".to_string(),
        "--timeout=10h".to_string(),
        "--label-filter=Conformance".to_string(),
        format!("--output-dir={}", out_dir.display()),
        "--json-report=report.json".to_string(),
        "--junit-report=junit.xml".to_string(),
    ];
    args.extend(opts.focus.iter().map(|f| format!("--focus={f}")));
    args.extend(opts.skip.iter().map(|s| format!("--skip={s}")));
    args.extend(skips::environment_skips(env).map(|s| format!("--skip={}", regex::escape(s.name))));
    args
}

fn e2e_args(opts: &Options, kubeconfig: &Path, out_dir: &Path) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        "--provider=skeleton".to_string(),
        format!("--kubectl-path={}", opts.kubectl.display()),
        "--minStartupPods=0".to_string(),
        format!("--dns-domain={CLUSTER_DOMAIN}"),
        format!("--report-dir={}", out_dir.display()),
        "--allowed-not-ready-nodes=0".to_string(),
    ]
}

fn read_report(path: &Path) -> Result<Vec<SpecReport>, ConformanceError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConformanceError::Suite {
        context: format!("reading {}", path.display()),
        message: e.to_string(),
    })?;
    let suites: Vec<SuiteReport> =
        serde_json::from_str(&text).map_err(|e| ConformanceError::Suite {
            context: format!("parsing {}", path.display()),
            message: e.to_string(),
        })?;
    Ok(suites.into_iter().flat_map(|s| s.spec_reports).collect())
}

/// ginkgo and its `e2e.test` processes: killed as a group when dropped
/// before they ended.
struct ProcessGroup(Option<tokio::process::Child>);

impl ProcessGroup {
    async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        let status = match self.0.as_mut() {
            Some(child) => child.wait().await,
            None => return Err(std::io::Error::other("ginkgo already reaped")),
        };
        self.0 = None;
        status
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if let Some(pid) = self.0.as_ref().and_then(tokio::process::Child::id) {
            let group = nix::unistd::Pid::from_raw(pid as i32);
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_report_names_itself_as_the_conformance_list_does() {
        let spec: SpecReport = serde_json::from_value(serde_json::json!({
            "ContainerHierarchyTexts": ["[sig-node] Container Runtime", "blackbox test"],
            "ContainerHierarchyLabels": [["sig-node"], null],
            "LeafNodeText": "should run [NodeConformance] [Conformance]",
            "LeafNodeLabels": ["NodeConformance", "Conformance"],
            "LeafNodeType": "It",
            "State": "passed",
            "RunTime": 1500000000i64,
        }))
        .expect("report");
        assert_eq!(
            spec.full_name(),
            "[sig-node] Container Runtime blackbox test should run [NodeConformance] [Conformance]"
        );
        assert!(spec.has_label("Conformance"));
        assert!(spec.has_label("sig-node"));
        assert!(!spec.has_label("Serial"));
    }
}

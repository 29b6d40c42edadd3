//! CI's slice of Kubernetes' own conformance suite: the sig-node and
//! sig-network `[Conformance]` tests that are neither `[Serial]`,
//! `[Slow]` nor `[Disruptive]`, run by `e2e.test` v1.36.2 against a
//! two-node cluster of keelson nodes (both roles) behind the real control
//! plane. Any failure fails the test. The full side-by-side run with the
//! real kubelet and kube-proxy is `scripts/conformance --agent both`
//! (docs/conformance.md).
//!
//! Needs root, `KEELSON_UPSTREAM_BIN` (the unpacked `../shared/k8s`, which
//! holds e2e.test and ginkgo) and kubectl v1.36 (scripts/install-deps).

use std::path::PathBuf;

use keelson_tests::conformance::record::Outcome;
use keelson_tests::conformance::{self, KUBECTL, Options};
use keelson_tests::images::e2e;
use keelson_tests::support::{require_root, skip};
use keelson_tests::upstream::{Agents, UpstreamBins};

const TEST: &str = "keelson_passes_the_ci_conformance_slice";

/// Tests of the slice keelson does not pass yet, each with the issue
/// that builds what it needs. They still run in `scripts/conformance`,
/// where docs/conformance.md shows them failing.
const NOT_YET: &[(&str, &str)] = &[];

#[test]
fn keelson_passes_the_ci_conformance_slice() {
    if !require_root(TEST) {
        return;
    }
    let bins = match UpstreamBins::from_env() {
        Ok(b) => b,
        Err(reason) => return skip(TEST, &reason),
    };
    if !std::path::Path::new(KUBECTL).is_file() {
        return skip(
            TEST,
            &format!("{KUBECTL} is missing (scripts/install-deps installs it)"),
        );
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let mut skip_expressions: Vec<String> = ["\\[Serial\\]", "\\[Slow\\]", "\\[Disruptive\\]"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    skip_expressions.extend(NOT_YET.iter().map(|(expr, _)| expr.to_string()));
    let opts = Options {
        agents: Agents::Keelson,
        nodes: 2,
        parallel: 6,
        focus: vec!["\\[sig-node\\]".into(), "\\[sig-network\\]".into()],
        skip: skip_expressions,
        out: target.join("conformance-ci"),
        bins,
        image_files: e2e::image_files_tarball(),
        kubectl: PathBuf::from(KUBECTL),
    };
    let runtime = tokio::runtime::Runtime::new().expect("tokio");
    let record = runtime
        .block_on(conformance::run(&opts))
        .expect("the conformance run (cluster or suite) failed to run");

    // Every test the slice selects ran and passed, or was skipped by the
    // suite itself (a provider or feature it does not find) or here
    // (tests/src/conformance/skips.rs).
    let matches = |exprs: &[String], name: &str| {
        exprs
            .iter()
            .any(|e| regex::Regex::new(e).is_ok_and(|r| r.is_match(name)))
    };
    let mut passed = 0;
    let mut problems = Vec::new();
    for t in &record.tests {
        if !matches(&opts.focus, &t.name) || matches(&opts.skip, &t.name) {
            continue;
        }
        match &t.outcome {
            Outcome::Passed { .. } => passed += 1,
            Outcome::NotRun { reason }
                if reason.starts_with("skipped by the test")
                    || reason.starts_with("cannot run here") => {}
            Outcome::NotRun { reason } => {
                problems.push(format!("not run: {}\n    {reason}", t.name))
            }
            Outcome::Failed { state, message, .. } => {
                problems.push(format!("{state}: {}\n    {message}", t.name))
            }
        }
    }
    eprintln!(
        "conformance slice: {passed} passed, {} problems in {:.0} s (set-up {:.0} s); ginkgo's output and the agents' logs are in {}",
        problems.len(),
        record.suite_seconds,
        record.setup_seconds,
        opts.out.display()
    );
    assert!(
        problems.is_empty(),
        "{} conformance tests of the slice did not pass on keelson (logs in {}):\n{}",
        problems.len(),
        opts.out.display(),
        problems.join("\n")
    );
    assert!(passed > 0, "no test of the slice ran");
}

//! Small utilities shared by every test tier: waiting on a condition with a
//! deadline (never sleep-and-hope), and the root check of system tests.

use std::future::Future;
use std::time::Duration;

/// Error returned when a condition did not hold before its deadline.
#[derive(Debug, thiserror::Error)]
#[error("timed out after {waited:?} waiting for {what}; last observation: {last}")]
pub struct WaitTimeout {
    /// What was awaited, in words.
    pub what: String,
    /// How long we waited.
    pub waited: Duration,
    /// The last thing the probe reported (its `Err` text).
    pub last: String,
}

/// Polls `probe` every `interval` until it returns `Ok(value)` or `timeout`
/// passes. The probe's `Err` text is kept and reported on timeout so a
/// failing test says what it last saw.
pub async fn wait_for<T, F, Fut>(
    what: &str,
    timeout: Duration,
    interval: Duration,
    mut probe: F,
) -> Result<T, WaitTimeout>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let start = tokio::time::Instant::now();
    loop {
        let last = match probe().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if start.elapsed() >= timeout {
            return Err(WaitTimeout {
                what: what.to_string(),
                waited: start.elapsed(),
                last,
            });
        }
        tokio::time::sleep(interval).await;
    }
}

/// How the test harness counted a skipped test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CountedAs {
    /// A libtest `#[test]` that returned early: libtest says "ok".
    Passed,
    /// A case the upstream tier's runner reported as `ignored`.
    Ignored,
}

impl CountedAs {
    fn word(self) -> &'static str {
        match self {
            CountedAs::Passed => "passed",
            CountedAs::Ignored => "ignored",
        }
    }
}

/// Records that `test` cannot run on this machine, and why.
///
/// A test that cannot run here returns early after calling this; it is
/// never counted as a pass. The reason is printed and, when
/// `KEELSON_SKIP_LOG` names a file, appended to it ([`record_skip`]).
/// `scripts/test` reads that file for its summary: skipped tests are named
/// and taken out of the passed count.
pub fn skip(test: &str, reason: &str) {
    record_skip(test, reason, CountedAs::Passed);
}

/// Appends `test<TAB>reason<TAB>passed|ignored` to `$KEELSON_SKIP_LOG`
/// (one `O_APPEND` write, so concurrent tests do not interleave) and
/// prints the skip.
pub fn record_skip(test: &str, reason: &str, counted: CountedAs) {
    let reason = reason.replace(['\n', '\t'], " ");
    eprintln!("SKIPPED {test}: {reason}");
    let Some(path) = std::env::var_os("KEELSON_SKIP_LOG") else {
        return;
    };
    let line = format!("{test}\t{reason}\t{}\n", counted.word());
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
    if let Err(e) = written {
        // The summary would count this test as passed: say so loudly.
        panic!(
            "{test} must be skipped ({reason}) but the skip log {} cannot be written: {e}",
            std::path::Path::new(&path).display()
        );
    }
}

/// The name libtest gives the test function `name` of the module
/// `module_path` (pass `module_path!()`): that path without the crate's
/// own name, e.g. `system_cri_containerd::killed_run_child` in the system
/// tier's binary. A test that runs another test of its own binary in a
/// child process (`--exact`) names it with this.
pub fn libtest_name(module_path: &str, name: &str) -> String {
    match module_path.split_once("::") {
        Some((_, module)) => format!("{module}::{name}"),
        None => name.to_string(),
    }
}

/// The repository's root directory (the tests crate lives in it).
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives in the repository")
        .to_path_buf()
}

/// System tests need root (network namespaces, nftables, containerd). They
/// fail loudly when not root, unless `KEELSON_SKIP_SYSTEM_TESTS=1` is set, in
/// which case the skip is recorded ([`skip`]) and the caller returns early.
///
/// Returns `true` when the test should run.
pub fn require_root(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var("KEELSON_SKIP_SYSTEM_TESTS").as_deref() == Ok("1") {
        skip(test, "not root and KEELSON_SKIP_SYSTEM_TESTS=1");
        return false;
    }
    panic!("{test} is a system test and needs root (set KEELSON_SKIP_SYSTEM_TESTS=1 to skip)");
}

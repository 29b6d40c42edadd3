//! Where the real Kubernetes binaries are: `KEELSON_UPSTREAM_BIN`, a
//! directory holding `kube-apiserver`, `kube-controller-manager`,
//! `kubelet`, `kube-proxy` and `crictl` (`../shared/k8s/unpack DIR` writes
//! them), plus etcd from Debian's `etcd-server` package on `PATH`.

use std::path::{Path, PathBuf};

/// The environment variable naming the binaries' directory.
pub const BIN_ENV: &str = "KEELSON_UPSTREAM_BIN";

/// The binaries the tier runs from [`BIN_ENV`].
pub const BINARIES: [&str; 5] = [
    "kube-apiserver",
    "kube-controller-manager",
    "kubelet",
    "kube-proxy",
    "crictl",
];

/// The real binaries, all present and executable.
#[derive(Debug, Clone)]
pub struct UpstreamBins {
    dir: PathBuf,
    etcd: PathBuf,
}

impl UpstreamBins {
    /// Reads [`BIN_ENV`] and checks every binary, etcd included; the error
    /// says what is missing (the reason a test is skipped).
    pub fn from_env() -> Result<UpstreamBins, String> {
        let dir = std::env::var_os(BIN_ENV)
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .ok_or_else(|| {
                format!("{BIN_ENV} is not set (no real Kubernetes binaries on this machine)")
            })?;
        Self::in_dir(&dir)
    }

    /// The binaries in `dir` (and etcd on `PATH`).
    pub fn in_dir(dir: &Path) -> Result<UpstreamBins, String> {
        let missing: Vec<&str> = BINARIES
            .iter()
            .copied()
            .filter(|b| !is_executable(&dir.join(b)))
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "{} lacks {} ({BIN_ENV})",
                dir.display(),
                missing.join(", ")
            ));
        }
        let etcd = find_on_path("etcd").ok_or_else(|| {
            "etcd is not installed (Debian package etcd-server; scripts/install-deps installs it)"
                .to_string()
        })?;
        Ok(UpstreamBins {
            dir: dir.to_path_buf(),
            etcd,
        })
    }

    /// Path of one of [`BINARIES`].
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The etcd binary.
    pub fn etcd(&self) -> &Path {
        &self.etcd
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")])
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

/// The binaries when the upstream tier can run here (root, binaries,
/// etcd); otherwise the skip is recorded for `test` (named in
/// `scripts/test`'s summary) and `None` returned.
pub fn upstream_or_skip(test: &str) -> Option<UpstreamBins> {
    match can_run() {
        Ok(b) => Some(b),
        Err(reason) => {
            crate::support::skip(test, &reason);
            None
        }
    }
}

/// Whether the tier can run here, and if not why.
pub fn can_run() -> Result<UpstreamBins, String> {
    if !nix::unistd::geteuid().is_root() {
        return Err("the upstream tier needs root (network namespaces, containerd)".into());
    }
    UpstreamBins::from_env()
}

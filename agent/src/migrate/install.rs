//! keelson's own `packaging/install.sh`, carried in the binary with the
//! files it installs (unit, default configuration, install guide) and run
//! from a private temporary copy, so the migration installs and uninstalls
//! exactly as an operator's `install.sh` does — including its refusal to
//! enable keelson while kubelet is enabled. `DESTDIR` is the host's root
//! (when it is not `/`), `SYSTEMCTL` the host's systemctl.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::MigrateError;
use super::host::Host;

const INSTALL_SH: &str = include_str!("../../../packaging/install.sh");
const UNIT: &str = include_str!("../../../packaging/keelson.service");
const CONFIG: &str = include_str!("../../../packaging/config.yaml");
const GUIDE: &str = include_str!("../../../docs/install.md");

/// A private copy of the repository's layout install.sh expects
/// (`packaging/`, `docs/`), removed when dropped.
struct Staged(PathBuf);

impl Staged {
    fn new() -> Result<Staged, MigrateError> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let dir =
            std::env::temp_dir().join(format!("keelson-install-{}-{nanos}", std::process::id()));
        let put = |rel: &str, text: &str, mode: u32| -> Result<(), MigrateError> {
            let p = dir.join(rel);
            if let Some(d) = p.parent() {
                std::fs::create_dir_all(d).map_err(|e| MigrateError::io(d, e))?;
            }
            std::fs::write(&p, text).map_err(|e| MigrateError::io(&p, e))?;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))
                .map_err(|e| MigrateError::io(&p, e))
        };
        let staged = Staged(dir.clone());
        put("packaging/install.sh", INSTALL_SH, 0o755)?;
        put("packaging/keelson.service", UNIT, 0o644)?;
        put("packaging/config.yaml", CONFIG, 0o644)?;
        put("docs/install.md", GUIDE, 0o644)?;
        Ok(staged)
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `install.sh <args>` for `host`; its output goes to ours.
pub fn run(host: &Host, args: &[&str]) -> Result<(), MigrateError> {
    let staged = Staged::new()?;
    let mut cmd = Command::new("bash");
    cmd.arg(staged.0.join("packaging/install.sh"))
        .args(args)
        .env("SYSTEMCTL", host.systemctl_command())
        .stdin(std::process::Stdio::null());
    if host.is_real_root() {
        cmd.env_remove("DESTDIR");
    } else {
        cmd.env("DESTDIR", host.root());
    }
    let status = cmd.status().map_err(|e| MigrateError::Install {
        args: args.join(" "),
        reason: format!("running bash: {e}"),
    })?;
    if status.success() {
        Ok(())
    } else {
        Err(MigrateError::Install {
            args: args.join(" "),
            reason: status.to_string(),
        })
    }
}

/// `install.sh install --binary BIN --enable --now [--proxy-kubeconfig F]`.
pub fn install(
    host: &Host,
    binary: &Path,
    proxy_kubeconfig: Option<&Path>,
) -> Result<(), MigrateError> {
    let bin = binary.display().to_string();
    let mut args = vec!["install", "--binary", &bin, "--enable", "--now"];
    let kc = proxy_kubeconfig.map(|p| p.display().to_string());
    if let Some(kc) = &kc {
        args.extend(["--proxy-kubeconfig", kc]);
    }
    run(host, &args)
}

/// `install.sh uninstall`: stops and disables keelson, removes its Service
/// rules (on a real root) and the files install put there.
pub fn uninstall(host: &Host) -> Result<(), MigrateError> {
    run(host, &["uninstall"])
}

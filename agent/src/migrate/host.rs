//! The machine `keelson migrate` changes, behind one narrow type: every host
//! path is taken below a root directory (`--root`, `/` on a real node) and
//! systemd is reached through a systemctl command (`--systemctl`, or
//! `$KEELSON_SYSTEMCTL`), so the whole migration runs against a fake node
//! layout and a recording systemctl in tests, as `packaging/install.sh` does
//! with `DESTDIR` and `SYSTEMCTL`.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::MigrateError;

/// Environment variable naming the systemctl command (tests' double).
pub const SYSTEMCTL_ENV: &str = "KEELSON_SYSTEMCTL";

/// A node's file system root and its systemctl.
#[derive(Debug, Clone)]
pub struct Host {
    root: PathBuf,
    systemctl: String,
}

/// What systemctl says of a unit, as its `is-enabled` and `is-active`
/// print them (`enabled`, `disabled`, `static`, `masked`, `not-found`;
/// `active`, `inactive`, `failed`, ...).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UnitState {
    /// `systemctl is-enabled`'s word.
    pub enabled: String,
    /// `systemctl is-active`'s word.
    pub active: String,
}

impl UnitState {
    /// Whether the unit starts at boot.
    pub fn is_enabled(&self) -> bool {
        matches!(
            self.enabled.as_str(),
            "enabled" | "enabled-runtime" | "alias"
        )
    }

    /// Whether the unit runs (or is starting).
    pub fn is_active(&self) -> bool {
        matches!(
            self.active.as_str(),
            "active" | "activating" | "reloading" | "refreshing"
        )
    }

    /// Whether systemd knows the unit at all.
    pub fn exists(&self) -> bool {
        !self.enabled.is_empty() && self.enabled != "not-found"
    }
}

impl std::fmt::Display for UnitState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}, {}", self.enabled, self.active)
    }
}

impl Host {
    /// A host rooted at `root` using `systemctl` (a command line split on
    /// whitespace).
    pub fn new(root: impl Into<PathBuf>, systemctl: impl Into<String>) -> Host {
        Host {
            root: root.into(),
            systemctl: systemctl.into(),
        }
    }

    /// The root directory (`/` on a real node).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether this is the machine's own root.
    pub fn is_real_root(&self) -> bool {
        self.root == Path::new("/")
    }

    /// The systemctl command line.
    pub fn systemctl_command(&self) -> &str {
        &self.systemctl
    }

    /// `host_path` (absolute, as on the node) below the root.
    pub fn path(&self, host_path: impl AsRef<Path>) -> PathBuf {
        let p = host_path.as_ref();
        match p.strip_prefix("/") {
            Ok(rel) => self.root.join(rel),
            Err(_) => self.root.join(p),
        }
    }

    /// Reads a host file; `None` when it does not exist.
    pub fn read_optional(&self, host_path: &Path) -> Result<Option<Vec<u8>>, MigrateError> {
        match std::fs::read(self.path(host_path)) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(MigrateError::io(host_path, e)),
        }
    }

    /// Writes a host file through a temporary file and a rename, with `mode`.
    pub fn write(&self, host_path: &Path, bytes: &[u8], mode: u32) -> Result<(), MigrateError> {
        write_atomically(&self.path(host_path), bytes, mode)
            .map_err(|e| MigrateError::io(host_path, e))
    }

    fn systemctl(&self, args: &[&str]) -> Result<std::process::Output, MigrateError> {
        let mut words = self.systemctl.split_whitespace();
        let Some(program) = words.next() else {
            return Err(MigrateError::Systemctl {
                args: args.join(" "),
                reason: "no systemctl command".into(),
            });
        };
        Command::new(program)
            .args(words)
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| MigrateError::Systemctl {
                args: args.join(" "),
                reason: format!("running {program}: {e}"),
            })
    }

    /// The unit's enabled and active state.
    pub fn unit_state(&self, unit: &str) -> Result<UnitState, MigrateError> {
        let word = |args: &[&str]| -> Result<String, MigrateError> {
            let out = self.systemctl(args)?;
            // Both commands print their answer on stdout and exit non-zero
            // for anything but enabled/active; an empty answer (a unit
            // file that does not exist, on older systemd) is not-found.
            let w = String::from_utf8_lossy(&out.stdout).trim().to_string();
            Ok(if w.is_empty() {
                "not-found".to_string()
            } else {
                w
            })
        };
        let enabled = word(&["is-enabled", unit])?;
        let active = word(&["is-active", unit])?;
        Ok(UnitState { enabled, active })
    }

    /// Runs `systemctl <args>`; a non-zero exit is an error.
    pub fn run_systemctl(&self, args: &[&str]) -> Result<(), MigrateError> {
        let out = self.systemctl(args)?;
        if out.status.success() {
            Ok(())
        } else {
            Err(MigrateError::Systemctl {
                args: args.join(" "),
                reason: format!(
                    "{}: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            })
        }
    }
}

/// Writes `path` through `path.keelson-tmp` and a rename.
pub fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut tmp = path.as_os_str().to_os_string();
    tmp.push(".keelson-tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, bytes)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_taken_below_the_root() {
        let h = Host::new("/tmp/fake", "systemctl");
        assert_eq!(
            h.path("/etc/kubernetes/kubelet.conf"),
            PathBuf::from("/tmp/fake/etc/kubernetes/kubelet.conf")
        );
        assert!(!h.is_real_root());
        let real = Host::new("/", "systemctl");
        assert_eq!(real.path("/etc/x"), PathBuf::from("/etc/x"));
        assert!(real.is_real_root());
    }

    #[test]
    fn unit_words() {
        let s = UnitState {
            enabled: "enabled".into(),
            active: "active".into(),
        };
        assert!(s.is_enabled() && s.is_active() && s.exists());
        let s = UnitState {
            enabled: "not-found".into(),
            active: "inactive".into(),
        };
        assert!(!s.is_enabled() && !s.is_active() && !s.exists());
    }
}

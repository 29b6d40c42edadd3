//! Kubernetes' own device plugin test driver (`sample-device-plugin` from
//! `KEELSON_UPSTREAM_BIN`, `test/images/sample-device-plugin`) run as a
//! process beside a node agent.
//!
//! The driver advertises `example.com/resource` with two devices, `Dev-1`
//! and `Dev-2`; its Allocate creates the empty file `/tmp/<id>` and answers
//! a mount of it at the same path in the container. It dials kubelet's
//! well-known paths (`/var/lib/kubelet/device-plugins/...`, compiled in),
//! so it runs in a private mount namespace (`unshare --mount`) where a
//! tmpfs over `/var/lib` holds `/var/lib/kubelet/device-plugins` and
//! `/var/lib/kubelet/plugins_registry`, bind mounts of the agent's
//! directories: nothing of the host's `/var/lib` is changed. Its socket
//! goes to `PLUGIN_SOCK_DIR=/var/lib/kubelet/device-plugins` and it
//! registers through `device-plugins/kubelet.sock`; when the agent
//! re-creates that socket (a restart), the driver restarts its server and
//! registers again.
//!
//! The agent's device plugin directory: keelson's is
//! `<rootDir>/device-plugins`; kubelet v1.36's is always
//! `/var/lib/kubelet/device-plugins`, whatever its `--root-dir`
//! (`devicemanager.NewManagerImpl` uses `pluginapi.KubeletSocket`).
//!
//! The files `/tmp/Dev-1` and `/tmp/Dev-2` it creates are on the host's
//! `/tmp` (the runtime bind-mounts them from there): [`SampleDevicePlugin`]
//! removes those that did not exist before it started, on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The resource the driver advertises.
pub const RESOURCE: &str = "example.com/resource";
/// Its devices.
pub const DEVICES: [&str; 2] = ["Dev-1", "Dev-2"];

/// The driver's binary in `KEELSON_UPSTREAM_BIN`, if there.
pub fn binary() -> Result<PathBuf, String> {
    let dir = std::env::var_os(crate::upstream::bins::BIN_ENV)
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| {
            format!(
                "{} is not set (no sample-device-plugin on this machine)",
                crate::upstream::bins::BIN_ENV
            )
        })?;
    let bin = dir.join("sample-device-plugin");
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!("{} is missing", bin.display()))
    }
}

/// A running driver; stopped (SIGTERM, then SIGKILL) on drop.
#[derive(Debug)]
pub struct SampleDevicePlugin {
    child: Option<Child>,
    log: PathBuf,
    /// Device files that were not on the host before (removed on drop).
    created: Vec<PathBuf>,
}

impl SampleDevicePlugin {
    /// Starts the driver for the agent whose device plugin directory is
    /// `device_dir` and plugin registry `registry_dir`, logging to `log`.
    pub fn start(
        bin: &Path,
        device_dir: &Path,
        registry_dir: &Path,
        log: &Path,
    ) -> Result<SampleDevicePlugin, String> {
        let created = DEVICES
            .iter()
            .map(|d| Path::new("/tmp").join(d))
            .filter(|p| !p.exists())
            .collect();
        let out = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        // The agent's directories are bound onto a staging dir of the
        // test's first: the tmpfs over /var/lib hides them when they are
        // under it (kubelet's /var/lib/kubelet/device-plugins).
        let stage = log
            .parent()
            .unwrap_or(Path::new("/nonexistent"))
            .join("sample-device-plugin-mnt");
        for d in ["devices", "registry"] {
            std::fs::create_dir_all(stage.join(d))
                .map_err(|e| format!("{}: {e}", stage.display()))?;
        }
        let script = r#"set -e
mount --bind "$AGENT_DEVICES" "$STAGE/devices"
mount --bind "$AGENT_REGISTRY" "$STAGE/registry"
mount -t tmpfs keelson-test /var/lib
mkdir -p /var/lib/kubelet/device-plugins /var/lib/kubelet/plugins_registry
mount --bind "$STAGE/devices" /var/lib/kubelet/device-plugins
mount --bind "$STAGE/registry" /var/lib/kubelet/plugins_registry
exec "$PLUGIN_BIN""#;
        let child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", script])
            .env("AGENT_DEVICES", device_dir)
            .env("AGENT_REGISTRY", registry_dir)
            .env("STAGE", &stage)
            .env("PLUGIN_BIN", bin)
            .env("PLUGIN_SOCK_DIR", "/var/lib/kubelet/device-plugins")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("starting sample-device-plugin: {e}"))?;
        Ok(SampleDevicePlugin {
            child: Some(child),
            log: log.to_path_buf(),
            created,
        })
    }

    /// The driver's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// True while the process runs.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// SIGTERM (the driver removes its socket and exits), SIGKILL after
    /// `grace`.
    pub fn stop(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(pid) = i32::try_from(child.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let deadline = std::time::Instant::now() + grace;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for SampleDevicePlugin {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
        for p in &self.created {
            let _ = std::fs::remove_file(p).or_else(|_| std::fs::remove_dir(p));
        }
    }
}

//! csi-driver-host-path (`hostpathplugin` from `KEELSON_UPSTREAM_BIN`, a
//! real CSI driver) and `csi-node-driver-registrar` run as processes beside
//! a node agent, as the driver's DaemonSet runs them: the driver serves
//! CSI on a socket in a short directory of its own, the registrar puts
//! `<driver>-reg.sock` into the agent's `<root>/plugins_registry` and
//! answers the agent's GetInfo with the driver's socket.
//!
//! Both run in the host's mount namespace, as the DaemonSet's privileged
//! containers do with `Bidirectional` propagation: the driver's bind
//! mounts (from its state directory onto the pod's volume directory) must
//! be seen by the agent and the container runtime. Every mount it makes is
//! below the node's test directory, and is gone once the agent tore the
//! pod down (NodeUnpublishVolume).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::upstream::daemon::Daemon;

/// The driver's name.
pub const DRIVER: &str = "hostpath.csi.k8s.io";

/// `hostpathplugin` and `csi-node-driver-registrar` in
/// `KEELSON_UPSTREAM_BIN`, if there.
pub fn binaries() -> Result<(PathBuf, PathBuf), String> {
    let dir = std::env::var_os(crate::upstream::bins::BIN_ENV)
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| {
            format!(
                "{} is not set (no CSI driver on this machine)",
                crate::upstream::bins::BIN_ENV
            )
        })?;
    let plugin = dir.join("hostpathplugin");
    let registrar = dir.join("csi-node-driver-registrar");
    for b in [&plugin, &registrar] {
        if !b.is_file() {
            return Err(format!("{} is missing", b.display()));
        }
    }
    Ok((plugin, registrar))
}

/// The driver and its registrar; both stopped on drop (the registrar
/// first, which removes its registration socket: the agent deregisters the
/// driver).
pub struct HostPathDriver {
    registrar: Option<Daemon>,
    plugin: Option<Daemon>,
    state_dir: PathBuf,
    socket_dir: tempfile::TempDir,
}

impl std::fmt::Debug for HostPathDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostPathDriver")
            .field("state_dir", &self.state_dir)
            .finish_non_exhaustive()
    }
}

impl HostPathDriver {
    /// Starts the driver for node `node_id` (its state in `dir/csi-data`,
    /// logs in `dir`) and the registrar into `registry_dir`.
    pub fn start(
        plugin_bin: &Path,
        registrar_bin: &Path,
        node_id: &str,
        dir: &Path,
        registry_dir: &Path,
    ) -> Result<HostPathDriver, String> {
        // A unix socket path has at most 107 bytes: a short directory.
        let socket_dir = tempfile::Builder::new()
            .prefix("keelson-csi-")
            .tempdir_in("/tmp")
            .map_err(|e| format!("creating the socket directory: {e}"))?;
        let socket = socket_dir.path().join("csi.sock");
        let state_dir = dir.join("csi-data");
        std::fs::create_dir_all(&state_dir).map_err(|e| format!("{}: {e}", state_dir.display()))?;
        let mut cmd = Command::new(plugin_bin);
        cmd.arg(format!("--endpoint=unix://{}", socket.display()))
            .arg(format!("--nodeid={node_id}"))
            .arg(format!("--drivername={DRIVER}"))
            .arg(format!("--statedir={}", state_dir.display()))
            .arg("--v=5");
        let plugin = Daemon::spawn("hostpathplugin", cmd, &dir.join("hostpathplugin.log"))
            .map_err(|e| e.to_string())?;
        let mut cmd = Command::new(registrar_bin);
        cmd.arg(format!("--csi-address={}", socket.display()))
            .arg(format!("--kubelet-registration-path={}", socket.display()))
            .arg(format!(
                "--plugin-registration-path={}",
                registry_dir.display()
            ))
            .arg("--v=5");
        let registrar = Daemon::spawn(
            "csi-node-driver-registrar",
            cmd,
            &dir.join("csi-node-driver-registrar.log"),
        )
        .map_err(|e| e.to_string())?;
        Ok(HostPathDriver {
            registrar: Some(registrar),
            plugin: Some(plugin),
            state_dir,
            socket_dir,
        })
    }

    /// Where the driver keeps its volumes.
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// The driver's socket.
    pub fn socket(&self) -> PathBuf {
        self.socket_dir.path().join("csi.sock")
    }

    /// The last lines of both logs.
    pub fn log_tails(&self, lines: usize) -> String {
        [&self.plugin, &self.registrar]
            .iter()
            .filter_map(|d| d.as_ref())
            .map(|d| format!("--- {}\n{}", d.name(), d.log_tail(lines)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Stops the registrar (the agent then deregisters the driver).
    pub fn stop_registrar(&mut self) {
        if let Some(mut r) = self.registrar.take() {
            r.stop();
        }
    }

    /// Every regular file under the state directory whose name is `name`.
    pub fn files_named(&self, name: &str) -> Vec<PathBuf> {
        fn walk(d: &Path, name: &str, out: &mut Vec<PathBuf>) {
            for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
                let p = e.path();
                match e.file_type() {
                    Ok(t) if t.is_dir() => walk(&p, name, out),
                    Ok(t) if t.is_file() && e.file_name() == name => out.push(p),
                    _ => {}
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.state_dir, name, &mut out);
        out
    }
}

impl Drop for HostPathDriver {
    fn drop(&mut self) {
        self.stop_registrar();
        if let Some(mut p) = self.plugin.take() {
            p.stop();
        }
    }
}

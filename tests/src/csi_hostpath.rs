//! csi-driver-host-path (`hostpathplugin` from `KEELSON_UPSTREAM_BIN`, a
//! real CSI driver) and `csi-node-driver-registrar` run as processes beside
//! a node agent, as the driver's DaemonSet runs them: the driver serves
//! CSI on a socket in a short directory of its own, the registrar puts
//! `<driver>-reg.sock` into the agent's `<root>/plugins_registry` and
//! answers the agent's GetInfo with the driver's socket.
//!
//! For PersistentVolumes, `csi-provisioner` and `csi-attacher` (the
//! driver's controller sidecars) run beside it too, against the cluster
//! ([`HostPathDriver::start_controllers`]).
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

/// `csi-provisioner` and `csi-attacher` in `KEELSON_UPSTREAM_BIN`, if there.
pub fn controller_binaries() -> Result<(PathBuf, PathBuf), String> {
    let (plugin, _) = binaries()?;
    let dir = plugin.parent().map(Path::to_path_buf).unwrap_or_default();
    let provisioner = dir.join("csi-provisioner");
    let attacher = dir.join("csi-attacher");
    for b in [&provisioner, &attacher] {
        if !b.is_file() {
            return Err(format!("{} is missing", b.display()));
        }
    }
    Ok((provisioner, attacher))
}

/// The driver and its registrar (and its controller sidecars when
/// started); all stopped on drop (the sidecars and the registrar first,
/// which removes its registration socket: the agent deregisters the
/// driver).
pub struct HostPathDriver {
    name: String,
    controllers: Vec<Daemon>,
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
        HostPathDriver::start_as(
            DRIVER,
            plugin_bin,
            registrar_bin,
            node_id,
            dir,
            registry_dir,
        )
    }

    /// [`HostPathDriver::start`] under the driver name `name` (cases that
    /// run beside each other with cluster-wide sidecars each have their
    /// own driver).
    pub fn start_as(
        name: &str,
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
            .arg(format!("--drivername={name}"))
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
            name: name.to_string(),
            controllers: Vec::new(),
            registrar: Some(registrar),
            plugin: Some(plugin),
            state_dir,
            socket_dir,
        })
    }

    /// The driver's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Starts `csi-provisioner` and `csi-attacher` on the driver's socket
    /// with `kubeconfig` (logs in `dir`), as the driver's deployment runs
    /// them: the provisioner creates PersistentVolumes for the driver's
    /// StorageClasses, the attacher marks its VolumeAttachments attached.
    pub fn start_controllers(
        &mut self,
        provisioner_bin: &Path,
        attacher_bin: &Path,
        kubeconfig: &Path,
        dir: &Path,
    ) -> Result<(), String> {
        let socket = self.socket();
        for (name, bin) in [
            ("csi-provisioner", provisioner_bin),
            ("csi-attacher", attacher_bin),
        ] {
            let mut cmd = Command::new(bin);
            cmd.arg(format!("--csi-address={}", socket.display()))
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .arg("--v=5");
            let d = Daemon::spawn(name, cmd, &dir.join(format!("{name}.log")))
                .map_err(|e| e.to_string())?;
            self.controllers.push(d);
        }
        Ok(())
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
            .chain(self.controllers.iter())
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
        for mut c in self.controllers.drain(..) {
            c.stop();
        }
        self.stop_registrar();
        if let Some(mut p) = self.plugin.take() {
            p.stop();
        }
    }
}

//! The migration plan: kubelet's files (and kube-proxy's configuration)
//! read as `keelson run --kubelet-config ... --kubeadm-flags ...
//! --proxy-config ...` would read them (`config::upstream`), the one
//! KeelsonConfiguration that replaces them, what keelson does differently,
//! and the exact steps `--apply` takes. Reading only: nothing on the node
//! changes.

use std::path::{Path, PathBuf};

use crate::config::upstream::{self, Sources};
use crate::config::{Config, ConfigError, Overrides};

use super::host::{Host, UnitState};
use super::{MigrateError, layout};

/// What the operator asked for.
#[derive(Debug, Clone, Default)]
pub struct PlanOptions {
    /// Take over kube-proxy's work too (`--replace-kube-proxy`): the proxy
    /// role runs, and the node is labelled so kube-proxy's DaemonSet leaves.
    pub replace_kube_proxy: bool,
    /// The proxy role's kubeconfig (kube-proxy's rights), a file on this
    /// machine (not below `--root`).
    pub proxy_kubeconfig: Option<PathBuf>,
}

/// Where kube-proxy's configuration came from.
#[derive(Debug, Clone)]
pub enum ProxySource {
    /// A file given on the command line (`--proxy-config`).
    File(PathBuf),
    /// `config.conf` of the `kube-system/kube-proxy` ConfigMap.
    ConfigMap(String),
    /// Neither: why the ConfigMap could not be read.
    Unavailable(String),
}

/// The plan `keelson migrate --from-kubelet` prints and `--apply` carries out.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The Node's name.
    pub node_name: String,
    /// The configuration keelson runs with (written to /etc/keelson/config.yaml).
    pub config: Config,
    /// How keelson's behaviour differs from kubelet's and kube-proxy's.
    pub differences: Vec<String>,
    /// Why `--apply` would refuse (empty: it can run).
    pub refused: Vec<String>,
    /// kubelet's and kube-proxy's units as systemctl reports them now.
    pub kubelet_unit: UnitState,
    /// kube-proxy's unit (`not-found` on kubeadm nodes).
    pub kube_proxy_unit: UnitState,
    /// The options it was made with.
    pub options: PlanOptions,
}

/// A temporary copy of kube-proxy's configuration for the loader, removed
/// when dropped.
struct StagedFile(PathBuf);

impl StagedFile {
    fn new(text: &str) -> Result<StagedFile, MigrateError> {
        let dir = std::env::temp_dir().join(format!("keelson-migrate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| MigrateError::io(&dir, e))?;
        let path = dir.join("kube-proxy-config.conf");
        std::fs::write(&path, text).map_err(|e| MigrateError::io(&path, e))?;
        Ok(StagedFile(path))
    }
}

impl Drop for StagedFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        if let Some(d) = self.0.parent() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Reads the node's files and makes the plan. Problems the operator must
/// fix (a kubelet setting keelson cannot honour, a missing file) are in
/// [`Plan::refused`]; an error is returned only when the node is not a
/// kubeadm node at all.
pub fn build(host: &Host, opts: &PlanOptions, proxy: ProxySource) -> Result<Plan, MigrateError> {
    let kubelet_config = host.path(layout::KUBELET_CONFIG);
    if !kubelet_config.is_file() {
        return Err(MigrateError::NotKubeadm(format!(
            "{} does not exist",
            layout::KUBELET_CONFIG
        )));
    }
    let mut refused = Vec::new();
    let mut differences = Vec::new();

    let flags = host.path(layout::KUBEADM_FLAGS);
    let staged = match (&proxy, opts.replace_kube_proxy) {
        (ProxySource::ConfigMap(text), true) => Some(StagedFile::new(text)?),
        _ => None,
    };
    let proxy_config = match (&proxy, opts.replace_kube_proxy) {
        (ProxySource::File(p), true) => Some(p.clone()),
        (ProxySource::ConfigMap(_), true) => staged.as_ref().map(|s| s.0.clone()),
        _ => None,
    };
    let sources = Sources {
        config: None,
        kubelet_config: Some(kubelet_config),
        proxy_config,
        kubeadm_flags: flags.is_file().then_some(flags),
        kubelet_extra_args: Some(host.path(layout::KUBELET_DEFAULTS)),
    };
    let overrides = Overrides {
        // kubelet's own flags in kubeadm's unit drop-in.
        kubeconfig: Some(PathBuf::from(layout::KUBELET_KUBECONFIG)),
        root_dir: Some(PathBuf::from(layout::KUBELET_ROOT_DIR)),
        proxy_kubeconfig: opts
            .replace_kube_proxy
            .then(|| PathBuf::from(layout::KEELSON_PROXY_KUBECONFIG)),
        node_only: !opts.replace_kube_proxy,
        ..Overrides::default()
    };
    let mut config = match upstream::load(&sources, &overrides) {
        Ok(loaded) => {
            // One line per file: "<file>: a, b, c".
            let mut by_file: Vec<(String, Vec<String>)> = Vec::new();
            for entry in &loaded.ignored {
                let (file, field) = entry.split_once(": ").unwrap_or(("", entry));
                match by_file.iter_mut().find(|(f, _)| f == file) {
                    Some((_, fields)) => fields.push(field.to_string()),
                    None => by_file.push((file.to_string(), vec![field.to_string()])),
                }
            }
            for (file, fields) in by_file {
                differences.push(format!(
                    "{file}: accepted at upstream's default value, not implemented by keelson: {}",
                    fields.join(", ")
                ));
            }
            differences.extend(loaded.notes);
            loaded.config
        }
        Err(ConfigError::Files { errors }) => {
            refused.extend(errors.iter().map(|(origin, e)| format!("{origin}: {e}")));
            Config::default()
        }
        Err(e) => {
            refused.push(e.to_string());
            Config::default()
        }
    };
    let node_name = config.effective_node_name();
    config.node_name = Some(node_name.clone());

    // The node's identity: kubelet.conf and the certificate it names.
    let kubeconfig = host.path(layout::KUBELET_KUBECONFIG);
    if !kubeconfig.is_file() {
        refused.push(format!(
            "{} does not exist: keelson needs the node's kubeconfig",
            layout::KUBELET_KUBECONFIG
        ));
    } else {
        match client_certificate(&kubeconfig) {
            Ok(Some(cert)) => {
                // kubelet's link has an absolute target: below a test
                // root, only the link itself can be looked at.
                let present = if host.is_real_root() {
                    host.path(&cert).exists()
                } else {
                    std::fs::symlink_metadata(host.path(&cert)).is_ok()
                };
                if !present {
                    refused.push(format!(
                        "{} names the client certificate {}, which does not exist",
                        layout::KUBELET_KUBECONFIG,
                        cert.display()
                    ));
                }
                if config.node.rotate_certificates {
                    differences.push(format!(
                        "client certificate: keelson starts from {} (named by {}) and renews it into {}/pki/keelson-client-current.pem; kubelet's files are not changed",
                        cert.display(),
                        layout::KUBELET_KUBECONFIG,
                        layout::KUBELET_ROOT_DIR
                    ));
                }
            }
            Ok(None) => {}
            Err(e) => refused.push(e),
        }
    }

    if opts.replace_kube_proxy {
        match &proxy {
            ProxySource::File(p) => differences.push(format!(
                "proxy role: kube-proxy's configuration read from {}",
                p.display()
            )),
            ProxySource::ConfigMap(_) => differences.push(format!(
                "proxy role: kube-proxy's configuration read from the ConfigMap {}/{} ({})",
                layout::KUBE_PROXY_CONFIGMAP.0,
                layout::KUBE_PROXY_CONFIGMAP.1,
                layout::KUBE_PROXY_CONFIGMAP.2
            )),
            ProxySource::Unavailable(why) => refused.push(format!(
                "kube-proxy's configuration is needed to replace it and could not be read ({why}): give it with --proxy-config FILE (kubectl -n kube-system get cm kube-proxy -o jsonpath='{{.data.config\\.conf}}')"
            )),
        }
        match &opts.proxy_kubeconfig {
            Some(p) if p.is_file() => differences.push(format!(
                "proxy role: credentials from {} (installed as {}); kube-proxy's own kubeconfig is its pod's ServiceAccount",
                p.display(),
                layout::KEELSON_PROXY_KUBECONFIG
            )),
            Some(p) => refused.push(format!("--proxy-kubeconfig {}: no such file", p.display())),
            None => refused.push(
                "--replace-kube-proxy needs --proxy-kubeconfig FILE: kube-proxy's identity (system:kube-proxy, docs/install.md 'Proxy role'); kube-proxy's own kubeconfig is its pod's ServiceAccount token".to_string(),
            ),
        }
        differences.push(format!(
            "kube-proxy's DaemonSet leaves this node through the label {}={} (its pod template needs the {} DoesNotExist node affinity, docs/install.md); kube-proxy's rules stay in the kernel until removed",
            layout::PROXY_LABEL,
            layout::PROXY_LABEL_VALUE,
            layout::PROXY_LABEL
        ));
    } else {
        // kube-proxy keeps its port 10249 for metrics; kubelet serves its
        // metrics on the node API, and so does keelson.
        config.metrics_bind_address = String::new();
        differences.push(
            "proxy role off: kube-proxy keeps serving Services on this node (--replace-kube-proxy moves that to keelson too); keelson's metrics are on the node API (:10250/metrics) as kubelet's, metricsBindAddress is left to kube-proxy".to_string(),
        );
    }
    differences.push(format!(
        "node.rootDir is kubelet's {}: running pods keep their volumes and keelson adopts their containers",
        layout::KUBELET_ROOT_DIR
    ));
    if let Err(errors) = config.validate() {
        refused.extend(
            errors
                .iter()
                .map(|e| format!("{}: {e}", layout::KEELSON_CONFIG)),
        );
    }

    let kubelet_unit = host.unit_state(layout::KUBELET_UNIT)?;
    let kube_proxy_unit = host.unit_state(layout::KUBE_PROXY_UNIT)?;
    if !kubelet_unit.exists() {
        refused.push(format!("{} is not known to systemd", layout::KUBELET_UNIT));
    }
    if host
        .path(layout::BACKUP_DIR)
        .join(super::backup::MANIFEST)
        .exists()
    {
        refused.push(format!(
            "a migration was already applied on this node (backup in {}): run keelson migrate --rollback first",
            layout::BACKUP_DIR
        ));
    }
    // Below a test root, name files as they are on the node.
    let unroot = |v: Vec<String>| -> Vec<String> {
        if host.is_real_root() {
            return v;
        }
        let prefix = host.root().display().to_string();
        v.into_iter().map(|s| s.replace(&prefix, "")).collect()
    };
    Ok(Plan {
        node_name,
        config,
        differences: unroot(differences),
        refused: unroot(refused),
        kubelet_unit,
        kube_proxy_unit,
        options: opts.clone(),
    })
}

/// The client certificate file the kubeconfig's current user names, if any.
fn client_certificate(kubeconfig: &Path) -> Result<Option<PathBuf>, String> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)
        .map_err(|e| format!("{}: {e}", layout::KUBELET_KUBECONFIG))?;
    Ok(crate::certificates::kubeconfig::current_user(&kc)
        .and_then(|u| u.client_certificate)
        .map(PathBuf::from))
}

impl Plan {
    /// The steps `--apply` takes, in order.
    pub fn steps(&self) -> Vec<String> {
        let mut s = vec![format!(
            "write the backup to {}: kubelet's files, the files keelson will write (or that they do not exist), the units' states (kubelet.service: {}; kube-proxy.service: {})",
            layout::BACKUP_DIR,
            self.kubelet_unit,
            self.kube_proxy_unit
        )];
        if self.options.replace_kube_proxy {
            s.push(format!(
                "label Node {} {}={} and wait until kube-proxy's pod has left it",
                self.node_name,
                layout::PROXY_LABEL,
                layout::PROXY_LABEL_VALUE
            ));
        }
        s.push(format!(
            "systemctl stop {u}{}",
            if self.kubelet_unit.is_enabled() {
                format!(", systemctl disable {}", layout::KUBELET_UNIT)
            } else {
                String::new()
            },
            u = layout::KUBELET_UNIT
        ));
        if self.options.replace_kube_proxy && self.kube_proxy_unit.exists() {
            s.push(format!(
                "systemctl stop {u}, systemctl disable {u}",
                u = layout::KUBE_PROXY_UNIT
            ));
        }
        s.push(format!(
            "write {} (the configuration above)",
            layout::KEELSON_CONFIG
        ));
        s.push(format!(
            "packaging/install.sh install --enable --now{}: {}, {}, daemon-reload, enable and start {}",
            if self.options.replace_kube_proxy {
                " --proxy-kubeconfig FILE"
            } else {
                ""
            },
            layout::KEELSON_BINARY,
            layout::KEELSON_UNIT_FILE,
            layout::KEELSON_UNIT
        ));
        s.push(format!(
            "wait until Node {} is Ready with a heartbeat from keelson and its running containers are the same ones (unless --no-wait)",
            self.node_name
        ));
        s
    }

    /// The report printed by `keelson migrate --from-kubelet`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# The KeelsonConfiguration keelson would run with\n");
        out.push_str(&format!("# ({}):\n", layout::KEELSON_CONFIG));
        out.push_str(&self.config.to_yaml());
        out.push_str("\n# Differences from kubelet and kube-proxy:\n");
        for d in &self.differences {
            out.push_str(&format!("#  - {d}\n"));
        }
        if !self.refused.is_empty() {
            out.push_str("\n# Refused (fix these; --apply will not run):\n");
            for r in &self.refused {
                out.push_str(&format!("#  - {r}\n"));
            }
        }
        out.push_str("\n# Steps of --apply:\n");
        for (i, s) in self.steps().iter().enumerate() {
            out.push_str(&format!("#  {}. {s}\n", i + 1));
        }
        out
    }
}

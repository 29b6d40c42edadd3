//! Upstream configuration files read as they are: kubelet's
//! KubeletConfiguration (`--kubelet-config`), kube-proxy's
//! KubeProxyConfiguration (`--proxy-config`) and kubeadm's kubelet flags
//! file (`--kubeadm-flags`), alone or on top of a KeelsonConfiguration.
//!
//! Order, lowest to highest: keelson's defaults, the KeelsonConfiguration,
//! the KubeletConfiguration, the KubeProxyConfiguration, kubeadm's flags
//! file, the command line. Every problem of every file is collected and
//! reported at once, each with its file and field path.

pub mod common;
pub mod kubeadm_flags;
pub mod kubelet;
pub mod proxy;
pub mod reader;

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{Config, ConfigError, FieldError, Overrides};
pub use reader::Report;

/// The files `keelson run` and `keelson check-config` read.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// A KeelsonConfiguration (`--config`).
    pub config: Option<PathBuf>,
    /// A KubeletConfiguration (`--kubelet-config`).
    pub kubelet_config: Option<PathBuf>,
    /// A KubeProxyConfiguration (`--proxy-config`).
    pub proxy_config: Option<PathBuf>,
    /// kubeadm's kubelet flags file (`--kubeadm-flags`).
    pub kubeadm_flags: Option<PathBuf>,
    /// The kubelet unit's second environment file, read after the flags
    /// file as kubeadm's drop-in orders them (`/etc/default/kubelet` on
    /// Debian, `/etc/sysconfig/kubelet` on RPM systems: its
    /// `KUBELET_EXTRA_ARGS`). Missing: nothing is read.
    pub kubelet_extra_args: Option<PathBuf>,
}

/// The effective configuration and what is worth telling the operator.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The configuration keelson runs with.
    pub config: Config,
    /// Upstream fields keelson does not implement, present in a file with
    /// upstream's default value (one warning lists them).
    pub ignored: Vec<String>,
    /// One log line each.
    pub notes: Vec<String>,
}

/// A document read from a file, kept to attribute later errors to it.
struct Doc {
    origin: String,
    keys: Vec<String>,
}

impl Doc {
    fn has(&self, key: &str) -> bool {
        self.keys.iter().any(|k| k == key)
    }
}

fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn parse_doc(
    path: &Path,
    errors: &mut Vec<(String, FieldError)>,
) -> Result<(Doc, Value), ConfigError> {
    let origin = path.display().to_string();
    let text = read(path)?;
    match reader::parse_yaml(&text) {
        Ok(v) => {
            let keys = v
                .as_object()
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default();
            Ok((Doc { origin, keys }, v))
        }
        Err(reason) => {
            errors.push((origin.clone(), FieldError::new(".", reason)));
            Ok((
                Doc {
                    origin,
                    keys: Vec::new(),
                },
                Value::Null,
            ))
        }
    }
}

fn absorb(
    origin: &str,
    report: Report,
    errors: &mut Vec<(String, FieldError)>,
    ignored: &mut Vec<String>,
    notes: &mut Vec<String>,
) {
    errors.extend(report.errors.into_iter().map(|e| (origin.to_string(), e)));
    ignored.extend(report.ignored.into_iter().map(|f| format!("{origin}: {f}")));
    notes.extend(report.notes.into_iter().map(|n| format!("{origin}: {n}")));
}

/// Reads every source, applies the command line and validates the result.
pub fn load(sources: &Sources, overrides: &Overrides) -> Result<Loaded, ConfigError> {
    let mut cfg = match &sources.config {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    let keelson_origin = sources
        .config
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "keelson's defaults".to_string());
    let mut errors: Vec<(String, FieldError)> = Vec::new();
    let mut ignored = Vec::new();
    let mut notes = Vec::new();

    let mut kubelet_doc = None;
    if let Some(path) = &sources.kubelet_config {
        let (doc, value) = parse_doc(path, &mut errors)?;
        let dir = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        let dir = std::path::absolute(&dir).unwrap_or(dir);
        let mut report = Report::default();
        if !value.is_null() {
            kubelet::apply(&mut cfg, value, &dir, &mut report);
        }
        absorb(&doc.origin, report, &mut errors, &mut ignored, &mut notes);
        kubelet_doc = Some(doc);
    }
    let mut proxy_doc = None;
    let mut proxy_name = None;
    if let Some(path) = &sources.proxy_config {
        let (doc, value) = parse_doc(path, &mut errors)?;
        let mut report = Report::default();
        if !value.is_null() {
            proxy_name = proxy::apply(&mut cfg, value, &mut report).hostname_override;
        }
        absorb(&doc.origin, report, &mut errors, &mut ignored, &mut notes);
        proxy_doc = Some(doc);
    }
    let mut flags_origin = None;
    // kubelet's unit expands $KUBELET_KUBEADM_ARGS before
    // $KUBELET_EXTRA_ARGS: the later flag wins.
    let extra = sources.kubelet_extra_args.as_ref().filter(|p| p.exists());
    for path in sources.kubeadm_flags.iter().chain(extra) {
        let origin = path.display().to_string();
        let text = read(path)?;
        let mut report = Report::default();
        let flags = kubeadm_flags::parse(&text, &mut report);
        kubeadm_flags::apply(&mut cfg, flags);
        absorb(&origin, report, &mut errors, &mut ignored, &mut notes);
        flags_origin.get_or_insert(origin);
    }
    // One process, one node name: kube-proxy's hostnameOverride must agree
    // with the node name set elsewhere; `--node-name` wins over both, as
    // command-line flags win over kube-proxy's and kubelet's files.
    if let Some(p) = proxy_name
        && overrides.node_name.is_none()
    {
        match cfg.node_name.clone().filter(|n| !n.is_empty()) {
            Some(n) if n != p => errors.push((
                proxy_doc.as_ref().map(|d| d.origin.clone()).unwrap_or_default(),
                FieldError::new(
                    "hostnameOverride",
                    format!("{p:?} differs from the node name {n:?}: keelson runs both roles as one node"),
                ),
            )),
            _ => cfg.node_name = Some(p),
        }
    }
    cfg.apply_overrides_unchecked(overrides);
    if let Err(invalid) = cfg.validate() {
        for mut e in invalid {
            let origin = attribute(
                &e.path,
                kubelet_doc.as_ref(),
                proxy_doc.as_ref(),
                flags_origin.as_deref(),
                overrides,
                &keelson_origin,
            );
            // In an upstream file, the field has the file's own path.
            let in_kubelet = kubelet_doc.as_ref().is_some_and(|d| d.origin == origin);
            let in_proxy = proxy_doc.as_ref().is_some_and(|d| d.origin == origin);
            if in_kubelet && let Some(rest) = e.path.strip_prefix("node.") {
                e.path = rest.to_string();
            } else if in_proxy && let Some(rest) = e.path.strip_prefix("proxy.") {
                e.path = rest.to_string();
            }
            errors.push((origin, e));
        }
    }
    // Grouped by file, each file's problems in the order found.
    errors.sort_by(|a, b| a.0.cmp(&b.0));
    if errors.is_empty() {
        Ok(Loaded {
            config: cfg,
            ignored,
            notes,
        })
    } else {
        Err(ConfigError::Files { errors })
    }
}

/// Which source an error of the merged configuration most likely comes
/// from: the upstream file that has the field, else the KeelsonConfiguration
/// (or the command line for the fields it sets).
fn attribute(
    path: &str,
    kubelet: Option<&Doc>,
    proxy: Option<&Doc>,
    flags: Option<&str>,
    overrides: &Overrides,
    keelson: &str,
) -> String {
    let first = |p: &str| -> String { p.split(['.', '[']).next().unwrap_or_default().to_string() };
    if let Some(rest) = path.strip_prefix("node.") {
        let key = first(rest);
        if matches!(
            key.as_str(),
            "nodeIP" | "nodeLabels" | "containerRuntimeEndpoint" | "registerWithTaints"
        ) && let Some(f) = flags
        {
            return f.to_string();
        }
        if let Some(d) = kubelet
            && d.has(&key)
        {
            return d.origin.clone();
        }
        if matches!(key.as_str(), "kubeconfig" | "bootstrapKubeconfig")
            && overrides.kubeconfig.is_some()
        {
            return "command line".to_string();
        }
    } else if let Some(rest) = path.strip_prefix("proxy.") {
        let key = first(rest);
        if let Some(d) = proxy
            && (d.has(&key) || key == "nftables")
        {
            return d.origin.clone();
        }
    } else if path == "healthzBindAddress" {
        if let Some(d) = kubelet
            && (d.has("healthzBindAddress") || d.has("healthzPort"))
        {
            return d.origin.clone();
        }
    } else if path == "metricsBindAddress" {
        if let Some(d) = proxy {
            return d.origin.clone();
        }
    } else if path == "nodeName" && overrides.node_name.is_some() {
        return "command line".to_string();
    }
    keelson.to_string()
}

#[cfg(test)]
mod tests;

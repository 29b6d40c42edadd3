//! kubeadm's kubelet flags file, `/var/lib/kubelet/kubeadm-flags.env`:
//! a systemd environment file whose `KUBELET_KUBEADM_ARGS` (and, in
//! `/etc/default/kubelet`, `KUBELET_EXTRA_ARGS`) hold kubelet command-line
//! flags (`cmd/kubeadm/app/phases/kubelet/flags.go` writes it). keelson
//! reads the flags kubeadm writes there; any other flag is an error naming
//! it, so nothing the node relies on is silently dropped.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Taint;

use super::reader::Report;
use crate::config::Config;

/// The variables read from the file, in this order.
pub const VARIABLES: &[&str] = &["KUBELET_KUBEADM_ARGS", "KUBELET_EXTRA_ARGS"];

/// The flags keelson understands, as read.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct KubeletFlags {
    /// `--container-runtime-endpoint`.
    pub container_runtime_endpoint: Option<String>,
    /// `--node-ip` (one address).
    pub node_ip: Option<IpAddr>,
    /// `--node-labels` (`k=v,k2=v2`).
    pub node_labels: BTreeMap<String, String>,
    /// `--hostname-override`.
    pub hostname_override: Option<String>,
    /// `--register-with-taints` (`key=value:Effect,...`).
    pub register_with_taints: Option<Vec<Taint>>,
    /// `--cloud-provider` (`external` or empty).
    pub cloud_provider: Option<String>,
    /// `--provider-id` (deprecated flag of `providerID`).
    pub provider_id: Option<String>,
    /// `--image-credential-provider-config`.
    pub image_credential_provider_config: Option<std::path::PathBuf>,
    /// `--image-credential-provider-bin-dir`.
    pub image_credential_provider_bin_dir: Option<std::path::PathBuf>,
}

/// Reads the variables of a systemd environment file: `NAME=value`,
/// `NAME="value"` or `NAME='value'`, `#` and `;` comments.
pub fn parse_env_file(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let Some((name, value)) = line.split_once('=') else {
            continue;
        };
        let value = value.trim();
        let value = unquote(value);
        out.insert(name.trim().to_string(), value);
    }
    out
}

fn unquote(v: &str) -> String {
    for q in ['"', '\''] {
        if v.len() >= 2 && v.starts_with(q) && v.ends_with(q) {
            let inner = &v[1..v.len() - 1];
            return if q == '"' {
                inner.replace("\\\"", "\"").replace("\\\\", "\\")
            } else {
                inner.to_string()
            };
        }
    }
    v.to_string()
}

/// Reads the kubelet flags of the file's variables. `origin` names the file
/// in error paths.
pub fn parse(text: &str, report: &mut Report) -> KubeletFlags {
    let vars = parse_env_file(text);
    let mut flags = KubeletFlags::default();
    for var in VARIABLES {
        let Some(value) = vars.get(*var) else {
            continue;
        };
        // systemd splits an unquoted `$VAR` on whitespace, as here.
        let mut args = value.split_whitespace().peekable();
        while let Some(arg) = args.next() {
            let Some(flag) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
                report.error(var.to_string(), format!("{arg:?} is not a flag"));
                continue;
            };
            let (name, value) = match flag.split_once('=') {
                Some((n, v)) => (n.to_string(), v.to_string()),
                None => match args.peek() {
                    Some(next) if !next.starts_with('-') => {
                        let v = next.to_string();
                        args.next();
                        (flag.to_string(), v)
                    }
                    _ => (flag.to_string(), String::new()),
                },
            };
            apply_flag(&mut flags, var, &name, &value, report);
        }
    }
    flags
}

fn apply_flag(flags: &mut KubeletFlags, var: &str, name: &str, value: &str, report: &mut Report) {
    let path = format!("{var}: --{name}");
    match name {
        "container-runtime-endpoint" => {
            flags.container_runtime_endpoint = Some(value.to_string());
        }
        "node-ip" => {
            let ips: Vec<&str> = value.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
            match ips.as_slice() {
                [one] => match one.parse::<IpAddr>() {
                    Ok(ip) if ip.is_unspecified() => report.error(
                        path,
                        "an unspecified address (prefer a family) is not supported: give the node's IP",
                    ),
                    Ok(ip) => flags.node_ip = Some(ip),
                    Err(_) => report.error(path, format!("{one:?} is not an IP address")),
                },
                [] => {}
                _ => report.error(
                    path,
                    format!("{value:?}: keelson's node role takes one node IP, not a dual-stack pair"),
                ),
            }
        }
        "node-labels" => {
            for pair in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                match pair.split_once('=') {
                    Some((k, v)) => {
                        flags.node_labels.insert(k.trim().to_string(), v.trim().to_string());
                    }
                    None => report.error(&path, format!("{pair:?} is not key=value")),
                }
            }
        }
        "hostname-override" => {
            if !value.is_empty() {
                flags.hostname_override = Some(value.trim().to_lowercase());
            }
        }
        "register-with-taints" => match parse_taints(value) {
            Ok(t) => flags.register_with_taints = Some(t),
            Err(e) => report.error(path, e),
        },
        "cloud-provider" => match crate::config::check_cloud_provider(value.trim()) {
            Ok(()) => flags.cloud_provider = Some(value.trim().to_string()),
            Err(e) => report.error(path, e),
        },
        "provider-id" => flags.provider_id = Some(value.trim().to_string()),
        "image-credential-provider-config" => {
            flags.image_credential_provider_config = Some(value.trim().into());
        }
        "image-credential-provider-bin-dir" => {
            flags.image_credential_provider_bin_dir = Some(value.trim().into());
        }
        // Removed from kubelet in 1.35; before that it only kept the image
        // from garbage collection. The sandbox image is the runtime's.
        "pod-infra-container-image" => report.notes.push(format!(
            "{path}={value} is ignored: the sandbox image is the container runtime's (kubelet ≥ 1.35 dropped this flag)"
        )),
        other => report.error(
            path,
            format!(
                "keelson does not read kubelet flag --{other} from this file (it reads --container-runtime-endpoint, --node-ip, --node-labels, --hostname-override, --register-with-taints, --cloud-provider, --provider-id, --image-credential-provider-config, --image-credential-provider-bin-dir, --pod-infra-container-image); move the setting into the configuration"
            ),
        ),
    }
}

/// kubelet's `--register-with-taints` syntax: `key[=value]:Effect,...`.
pub fn parse_taints(value: &str) -> Result<Vec<Taint>, String> {
    let mut out = Vec::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((kv, effect)) = item.rsplit_once(':') else {
            return Err(format!(
                "invalid taint spec {item:?}: want key[=value]:Effect"
            ));
        };
        if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
            return Err(format!("invalid taint effect {effect:?} in {item:?}"));
        }
        let (key, val) = match kv.split_once('=') {
            Some((k, v)) => (k.to_string(), Some(v.to_string())),
            None => (kv.to_string(), None),
        };
        if key.is_empty() {
            return Err(format!("invalid taint spec {item:?}: empty key"));
        }
        out.push(Taint {
            key,
            value: val,
            effect: effect.to_string(),
            time_added: None,
        });
    }
    Ok(out)
}

/// Applies the flags to `cfg` (they win over the configuration files, as
/// command-line flags win over kubelet's `--config`).
pub fn apply(cfg: &mut Config, flags: KubeletFlags) {
    if let Some(e) = flags.container_runtime_endpoint {
        cfg.node.container_runtime_endpoint = e;
    }
    if let Some(ip) = flags.node_ip {
        cfg.node.node_ip = Some(ip);
    }
    cfg.node.node_labels.extend(flags.node_labels);
    if let Some(h) = flags.hostname_override {
        cfg.node_name = Some(h);
    }
    if let Some(t) = flags.register_with_taints {
        cfg.node.register_with_taints = t;
    }
    if let Some(c) = flags.cloud_provider {
        cfg.node.cloud_provider = c;
    }
    if let Some(p) = flags.provider_id {
        cfg.node.provider_id = p;
    }
    if let Some(p) = flags.image_credential_provider_config {
        cfg.node.image_credential_provider_config = Some(p);
    }
    if let Some(p) = flags.image_credential_provider_bin_dir {
        cfg.node.image_credential_provider_bin_dir = Some(p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeadm_file_is_read() {
        let text = "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock --pod-infra-container-image=registry.k8s.io/pause:3.10 --node-ip 10.0.0.5 --node-labels=node-role.kubernetes.io/worker=,zone=a --hostname-override=Worker-1 --register-with-taints=dedicated=infra:NoSchedule\"\n";
        let mut r = Report::default();
        let f = parse(text, &mut r);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(r.notes.len(), 1, "{:?}", r.notes);
        assert_eq!(
            f.container_runtime_endpoint.as_deref(),
            Some("unix:///var/run/containerd/containerd.sock")
        );
        assert_eq!(f.node_ip, Some("10.0.0.5".parse().expect("ip")));
        assert_eq!(
            f.node_labels
                .get("node-role.kubernetes.io/worker")
                .map(String::as_str),
            Some("")
        );
        assert_eq!(f.node_labels.get("zone").map(String::as_str), Some("a"));
        assert_eq!(f.hostname_override.as_deref(), Some("worker-1"));
        let t = f.register_with_taints.expect("taints");
        assert_eq!(
            (
                t[0].key.as_str(),
                t[0].value.as_deref(),
                t[0].effect.as_str()
            ),
            ("dedicated", Some("infra"), "NoSchedule")
        );
    }

    #[test]
    fn unknown_flags_and_bad_values_are_named() {
        let text = "# kubeadm\nKUBELET_KUBEADM_ARGS='--cloud-provider=aws --node-ip=10.0.0.1,fd00::1'\nKUBELET_EXTRA_ARGS=--register-with-taints=a:Sometimes\n";
        let mut r = Report::default();
        let _ = parse(text, &mut r);
        let paths: Vec<_> = r.errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "KUBELET_KUBEADM_ARGS: --cloud-provider",
                "KUBELET_KUBEADM_ARGS: --node-ip",
                "KUBELET_EXTRA_ARGS: --register-with-taints"
            ]
        );
    }

    #[test]
    fn credential_provider_flags_are_read() {
        // As EKS-style nodes set them in KUBELET_EXTRA_ARGS.
        let text = "KUBELET_EXTRA_ARGS=\"--image-credential-provider-config /etc/eks/image-credential-provider/config.json --image-credential-provider-bin-dir=/etc/eks/image-credential-provider\"\n";
        let mut r = Report::default();
        let f = parse(text, &mut r);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        let mut cfg = Config::default();
        apply(&mut cfg, f);
        assert_eq!(
            cfg.node.image_credential_provider_config.as_deref(),
            Some(std::path::Path::new(
                "/etc/eks/image-credential-provider/config.json"
            ))
        );
        assert_eq!(
            cfg.node.image_credential_provider_bin_dir.as_deref(),
            Some(std::path::Path::new("/etc/eks/image-credential-provider"))
        );
    }

    #[test]
    fn an_external_cloud_provider_and_provider_id_are_read() {
        let text = "KUBELET_KUBEADM_ARGS=\"--cloud-provider=external --provider-id=aws:///us-east-1a/i-0abc\"\n";
        let mut r = Report::default();
        let f = parse(text, &mut r);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(f.cloud_provider.as_deref(), Some("external"));
        assert_eq!(f.provider_id.as_deref(), Some("aws:///us-east-1a/i-0abc"));
        let mut cfg = Config::default();
        apply(&mut cfg, f);
        assert!(cfg.node.external_cloud_provider());
        assert_eq!(cfg.node.provider_id, "aws:///us-east-1a/i-0abc");
    }

    #[test]
    fn empty_file_sets_nothing() {
        let mut r = Report::default();
        assert_eq!(
            parse("KUBELET_KUBEADM_ARGS=\"\"\n", &mut r),
            KubeletFlags::default()
        );
        assert!(r.errors.is_empty());
    }
}

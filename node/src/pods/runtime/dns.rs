//! A pod's DNS configuration and host name (kubelet's `dns.Configurer`
//! and `GeneratePodHostNameAndDomain`): `dnsPolicy` ClusterFirst (cluster
//! DNS servers, `<ns>.svc.<domain>` searches, `ndots:5`), Default (the
//! node's resolv.conf), ClusterFirstWithHostNet, None, then `dnsConfig`
//! appended, then the resolver limits.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;
use keelson_cri::api;

use crate::pod::podutil;

/// Most nameservers a resolver uses (`validation.MaxDNSNameservers`).
pub const MAX_NAMESERVERS: usize = 3;
/// Most search domains (`MaxDNSSearchPaths`).
pub const MAX_SEARCH_PATHS: usize = 32;
/// Longest search line (`MaxDNSSearchListChars`).
pub const MAX_SEARCH_CHARS: usize = 2048;

/// The node's DNS settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DnsSettings {
    /// `clusterDNS`.
    pub cluster_dns: Vec<IpAddr>,
    /// `clusterDomain`.
    pub cluster_domain: String,
    /// Parsed `resolvConf` (`None` when resolvConf is empty).
    pub host: Option<HostResolv>,
    /// The node's IPs (for an empty resolvConf).
    pub node_ips: Vec<IpAddr>,
}

/// Parsed resolv.conf.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostResolv {
    /// `nameserver` lines.
    pub servers: Vec<String>,
    /// The `search` line.
    pub searches: Vec<String>,
    /// The `options` line.
    pub options: Vec<String>,
}

/// Parses resolv.conf text (comments with `#` or `;`).
pub fn parse_resolv_conf(text: &str) -> HostResolv {
    let mut r = HostResolv::default();
    for line in text.lines() {
        let line = line.split(['#', ';']).next().unwrap_or_default();
        let mut f = line.split_whitespace();
        match f.next() {
            Some("nameserver") => r.servers.extend(f.next().map(str::to_string)),
            Some("search") => {
                r.searches = f
                    .map(|s| s.trim_end_matches('.').to_string())
                    .filter(|s| !s.is_empty())
                    .collect();
                if r.searches.is_empty() {
                    r.searches.push(".".into());
                }
            }
            Some("domain") => {
                if let Some(d) = f.next() {
                    r.searches = vec![d.trim_end_matches('.').to_string()];
                }
            }
            Some("options") => r.options = f.map(str::to_string).collect(),
            _ => {}
        }
    }
    r
}

/// Why the resolver settings could not be read or a pod's host name not
/// formed. Display texts are kubelet's (`pkg/kubelet/network/dns`,
/// `GeneratePodHostNameAndDomain`).
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    /// The host's resolver configuration could not be read.
    #[error("reading {path}: {error}")]
    ReadResolvConf {
        /// `resolvConf`.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// `spec.hostnameOverride` is not a DNS subdomain.
    #[error("pod HostnameOverride {0:?} is not a valid DNS subdomain")]
    HostnameOverride(String),
    /// `spec.hostname` is not a DNS label.
    #[error("pod Hostname {0:?} is not a valid DNS label")]
    Hostname(String),
    /// `spec.subdomain` is not a DNS label.
    #[error("pod Subdomain {0:?} is not a valid DNS label")]
    Subdomain(String),
    /// `setHostnameAsFQDN` with an FQDN over 64 characters.
    #[error(
        "failed to construct FQDN from pod hostname and cluster domain, FQDN {0} is too long (64 characters is the max, {len} characters requested)",
        len = .0.len()
    )]
    FqdnTooLong(String),
    /// Nothing is left of the host name once truncated.
    #[error("hostname for pod {pod:?} was invalid: {hostname:?}")]
    Truncated {
        /// The pod's name.
        pod: String,
        /// The host name before truncation.
        hostname: String,
    },
}

impl DnsSettings {
    /// Reads `resolv_conf` (an empty path means "no host resolver").
    pub fn load(
        cluster_dns: Vec<IpAddr>,
        cluster_domain: &str,
        resolv_conf: &Path,
        node_ips: Vec<IpAddr>,
    ) -> Result<Self, DnsError> {
        let host = if resolv_conf.as_os_str().is_empty() {
            None
        } else {
            let text =
                std::fs::read_to_string(resolv_conf).map_err(|error| DnsError::ReadResolvConf {
                    path: resolv_conf.to_path_buf(),
                    error,
                })?;
            Some(parse_resolv_conf(&text))
        };
        Ok(DnsSettings {
            cluster_dns,
            cluster_domain: cluster_domain.to_string(),
            host,
            node_ips,
        })
    }
}

fn omit_duplicates(v: Vec<String>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    v.into_iter().filter(|s| seen.insert(s.clone())).collect()
}

fn option_name(o: &str) -> &str {
    o.split(':').next().unwrap_or(o)
}

/// A warning for the pod's events (`DNSConfigForming`, `MissingClusterDNS`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsWarning {
    /// Event reason.
    pub reason: &'static str,
    /// Event message.
    pub message: String,
}

/// The sandbox DNS config for `pod`, with warnings to record.
pub fn pod_dns(pod: &Pod, s: &DnsSettings) -> (api::DnsConfig, Vec<DnsWarning>) {
    let mut warnings = Vec::new();
    let host = s.host.clone().unwrap_or_default();
    let mut cfg = api::DnsConfig {
        servers: host.servers.clone(),
        searches: host.searches.clone(),
        options: host.options.clone(),
    };
    let policy = podutil::spec(pod)
        .dns_policy
        .as_deref()
        .unwrap_or("ClusterFirst");
    #[derive(PartialEq)]
    enum Kind {
        None,
        Cluster,
        Host,
    }
    let kind = match policy {
        "None" => Kind::None,
        "ClusterFirstWithHostNet" => Kind::Cluster,
        "Default" => Kind::Host,
        "ClusterFirst" if podutil::is_host_network(pod) => Kind::Host,
        _ => Kind::Cluster,
    };
    let mut kind = kind;
    match kind {
        Kind::None => cfg = api::DnsConfig::default(),
        Kind::Cluster if !s.cluster_dns.is_empty() => {
            cfg.servers = s.cluster_dns.iter().map(IpAddr::to_string).collect();
            if !s.cluster_domain.is_empty() {
                let d = &s.cluster_domain;
                let mut searches = vec![
                    format!("{}.svc.{d}", podutil::namespace(pod)),
                    format!("svc.{d}"),
                    d.clone(),
                ];
                searches.append(&mut cfg.searches);
                cfg.searches = omit_duplicates(searches);
            }
            cfg.options = vec!["ndots:5".to_string()];
        }
        Kind::Cluster => {
            let msg = "kubelet does not have ClusterDNS IP configured and cannot create Pod using \"ClusterFirst\" policy. Falling back to \"Default\" policy.".to_string();
            warnings.push(DnsWarning {
                reason: "MissingClusterDNS",
                message: format!(
                    "pod: {}. {msg}",
                    keelson_common::gofmt::quote(&podutil::format_pod(pod))
                ),
            });
            kind = Kind::Host;
        }
        Kind::Host => {}
    }
    if kind == Kind::Host && s.host.is_none() {
        cfg.servers = if s.node_ips.is_empty() {
            vec!["127.0.0.1".to_string()]
        } else {
            s.node_ips
                .iter()
                .map(|ip| if ip.is_ipv6() { "::1" } else { "127.0.0.1" }.to_string())
                .collect()
        };
        cfg.searches = vec![".".to_string()];
    }
    if let Some(extra) = podutil::spec(pod).dns_config.as_ref() {
        let mut servers = std::mem::take(&mut cfg.servers);
        servers.extend(extra.nameservers.iter().flatten().cloned());
        cfg.servers = omit_duplicates(servers);
        let mut searches = std::mem::take(&mut cfg.searches);
        searches.extend(extra.searches.iter().flatten().cloned());
        cfg.searches = omit_duplicates(searches);
        // Options from dnsConfig override host options of the same name.
        let mut options: Vec<String> = Vec::new();
        let mut names: Vec<String> = Vec::new();
        for o in cfg.options.drain(..) {
            names.push(option_name(&o).to_string());
            options.push(o);
        }
        for o in extra.options.iter().flatten() {
            let value = match &o.value {
                Some(v) => format!("{}:{v}", o.name.as_deref().unwrap_or_default()),
                None => o.name.clone().unwrap_or_default(),
            };
            let n = option_name(&value).to_string();
            match names.iter().position(|x| *x == n) {
                Some(i) => options[i] = value,
                None => {
                    names.push(n);
                    options.push(value);
                }
            }
        }
        cfg.options = options;
    }
    // Resolver limits.
    if cfg.servers.len() > MAX_NAMESERVERS {
        cfg.servers.truncate(MAX_NAMESERVERS);
        warnings.push(DnsWarning {
            reason: "DNSConfigForming",
            message: format!(
                "Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: {}",
                cfg.servers.join(" ")
            ),
        });
    }
    let search_chars =
        |v: &[String]| v.iter().map(String::len).sum::<usize>() + v.len().saturating_sub(1);
    if cfg.searches.len() > MAX_SEARCH_PATHS || search_chars(&cfg.searches) > MAX_SEARCH_CHARS {
        let mut kept = Vec::new();
        for s in cfg.searches.drain(..) {
            kept.push(s);
            if kept.len() > MAX_SEARCH_PATHS || search_chars(&kept) > MAX_SEARCH_CHARS {
                kept.pop();
                break;
            }
        }
        cfg.searches = kept;
        warnings.push(DnsWarning {
            reason: "DNSConfigForming",
            message: format!(
                "Search Line limits were exceeded, some search paths have been omitted, the applied search line is: {}",
                cfg.searches.join(" ")
            ),
        });
    }
    (cfg, warnings)
}

/// `GeneratePodHostNameAndDomain` plus `GetNodenameForKernel`: the sandbox
/// host name (`spec.hostnameOverride` — HostnameOverride, beta and on in
/// v1.36 — as it is and without a domain; else the pod name or
/// `spec.hostname`, at most 63 characters; the FQDN with
/// `setHostnameAsFQDN`) and the pod's domain.
pub fn pod_hostname(pod: &Pod, cluster_domain: &str) -> Result<(String, String), DnsError> {
    let spec = podutil::spec(pod);
    if let Some(h) = spec.hostname_override.as_deref() {
        if !crate::config::is_dns_subdomain(h) {
            return Err(DnsError::HostnameOverride(h.to_string()));
        }
        return Ok((truncate_hostname(pod, h)?, String::new()));
    }
    let mut hostname = podutil::name(pod).to_string();
    if let Some(h) = spec.hostname.as_deref().filter(|h| !h.is_empty()) {
        if !is_dns1123_label(h) {
            return Err(DnsError::Hostname(h.to_string()));
        }
        hostname = h.to_string();
    }
    let hostname = truncate_hostname(pod, &hostname)?;
    let mut domain = String::new();
    if let Some(sub) = spec.subdomain.as_deref().filter(|s| !s.is_empty()) {
        if !is_dns1123_label(sub) {
            return Err(DnsError::Subdomain(sub.to_string()));
        }
        domain = format!("{sub}.{}.svc.{cluster_domain}", podutil::namespace(pod));
    }
    if spec.set_hostname_as_fqdn == Some(true) && !domain.is_empty() {
        let fqdn = format!("{hostname}.{domain}");
        if fqdn.len() > 64 {
            return Err(DnsError::FqdnTooLong(fqdn));
        }
        return Ok((fqdn, domain));
    }
    Ok((hostname, domain))
}

/// `truncatePodHostnameIfNeeded`: at most 63 characters, without a
/// trailing `-` or `.`.
fn truncate_hostname(pod: &Pod, hostname: &str) -> Result<String, DnsError> {
    const MAX: usize = 63;
    if hostname.len() <= MAX {
        return Ok(hostname.to_string());
    }
    // Validated as a DNS name: ASCII, so any byte is a character boundary.
    let truncated = hostname[..MAX].trim_end_matches(['-', '.']);
    if truncated.is_empty() {
        return Err(DnsError::Truncated {
            pod: podutil::name(pod).to_string(),
            hostname: hostname.to_string(),
        });
    }
    Ok(truncated.to_string())
}

fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).expect("pod")
    }

    fn settings() -> DnsSettings {
        DnsSettings {
            cluster_dns: vec!["10.96.0.10".parse().expect("ip")],
            cluster_domain: "cluster.local".into(),
            host: Some(parse_resolv_conf(
                "# comment\nnameserver 192.168.0.1\nsearch corp.example\noptions edns0\n",
            )),
            node_ips: vec![],
        }
    }

    #[test]
    fn cluster_first() {
        let p = pod(
            serde_json::json!({"metadata": {"name": "p", "namespace": "web"}, "spec": {"containers": []}}),
        );
        let (c, w) = pod_dns(&p, &settings());
        assert!(w.is_empty());
        assert_eq!(c.servers, vec!["10.96.0.10"]);
        assert_eq!(
            c.searches,
            vec![
                "web.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local",
                "corp.example"
            ]
        );
        assert_eq!(c.options, vec!["ndots:5"]);
    }

    #[test]
    fn host_network_falls_back_to_default_and_dns_config_appends() {
        let p = pod(
            serde_json::json!({"metadata": {"name": "p", "namespace": "web"},
            "spec": {"hostNetwork": true, "containers": [],
                     "dnsConfig": {"nameservers": ["1.1.1.1"], "options": [{"name": "edns0"}, {"name": "ndots", "value": "2"}]}}}),
        );
        let (c, _) = pod_dns(&p, &settings());
        assert_eq!(c.servers, vec!["192.168.0.1", "1.1.1.1"]);
        assert_eq!(c.searches, vec!["corp.example"]);
        assert_eq!(c.options, vec!["edns0", "ndots:2"]);
    }

    #[test]
    fn none_policy_and_missing_cluster_dns() {
        let p = pod(
            serde_json::json!({"metadata": {"name": "p", "namespace": "web"},
            "spec": {"dnsPolicy": "None", "containers": [], "dnsConfig": {"nameservers": ["8.8.8.8"]}}}),
        );
        let (c, _) = pod_dns(&p, &settings());
        assert_eq!(c.servers, vec!["8.8.8.8"]);
        assert!(c.searches.is_empty());
        let p = pod(
            serde_json::json!({"metadata": {"name": "p", "namespace": "web"}, "spec": {"containers": []}}),
        );
        let mut s = settings();
        s.cluster_dns.clear();
        let (c, w) = pod_dns(&p, &s);
        assert_eq!(c.servers, vec!["192.168.0.1"]);
        assert_eq!(w[0].reason, "MissingClusterDNS");
    }

    #[test]
    fn hostnames() {
        let p = pod(
            serde_json::json!({"metadata": {"name": "web-0", "namespace": "ns"},
            "spec": {"hostname": "h", "subdomain": "s", "containers": []}}),
        );
        assert_eq!(
            pod_hostname(&p, "cluster.local").ok(),
            Some(("h".to_string(), "s.ns.svc.cluster.local".to_string()))
        );
        let long = "a".repeat(62) + "-b";
        let p = pod(
            serde_json::json!({"metadata": {"name": long, "namespace": "ns"}, "spec": {"containers": []}}),
        );
        assert_eq!(pod_hostname(&p, "c").ok().map(|h| h.0.len()), Some(62));
        // hostnameOverride wins over hostname, subdomain and setHostnameAsFQDN,
        // with no domain.
        let p = pod(
            serde_json::json!({"metadata": {"name": "web-0", "namespace": "ns"},
            "spec": {"hostnameOverride": "db.example", "hostname": "h", "subdomain": "s",
                     "setHostnameAsFQDN": true, "containers": []}}),
        );
        assert_eq!(
            pod_hostname(&p, "cluster.local").ok(),
            Some(("db.example".to_string(), String::new()))
        );
        let p = pod(
            serde_json::json!({"metadata": {"name": "web-0", "namespace": "ns"},
            "spec": {"hostnameOverride": "Not_Valid", "containers": []}}),
        );
        assert_eq!(
            pod_hostname(&p, "c").map_err(|e| e.to_string()),
            Err("pod HostnameOverride \"Not_Valid\" is not a valid DNS subdomain".to_string())
        );
    }
}

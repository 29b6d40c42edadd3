//! A KubeProxyConfiguration (`kubeproxy.config.k8s.io/v1alpha1`, the file
//! kube-proxy reads with `--config`, e.g. `config.conf` of kubeadm's
//! `kube-system/kube-proxy` ConfigMap) applied to keelson's `proxy:`
//! section and its metrics address.
//!
//! Fields follow `staging/src/k8s.io/kube-proxy/config/v1alpha1/types.go`;
//! defaulting follows `pkg/proxy/apis/config/v1alpha1/defaults.go` (zero
//! `clientConnection.qps`/`burst` mean 5/10, a bare healthz or metrics IP
//! gets its port appended, `conntrack` pointers keep an explicit 0 which
//! means "leave the kernel's value") and the version conversion of
//! `conversion.go` (the sync periods and `masqueradeAll` come from the
//! section of the configured mode: `nftables.*` for `nftables`,
//! `iptables.*` otherwise).

use std::net::IpAddr;

use serde_json::Value;

use super::common::{apply_logging, check_type_meta};
use super::reader::{CONTENT_TYPES, Default, Object, Report};
use crate::config::duration::KubeDuration;
use crate::config::{Config, ProxyMode};

/// `apiVersion` of the files read here.
pub const API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";
/// `kind` of the files read here.
pub const KIND: &str = "KubeProxyConfiguration";

/// kube-proxy's health port (`ports.ProxyHealthzPort`).
const HEALTHZ_PORT: u16 = 10256;
/// kube-proxy's metrics port (`ports.ProxyStatusPort`).
const METRICS_PORT: u16 = 10249;

/// What the file says about things outside `proxy:`.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ProxyFileIdentity {
    /// `hostnameOverride`, when set.
    pub hostname_override: Option<String>,
}

/// Applies a KubeProxyConfiguration document to `cfg`.
pub fn apply(cfg: &mut Config, doc: Value, report: &mut Report) -> ProxyFileIdentity {
    let mut o = Object::root(doc, report);
    check_type_meta(&mut o, API_VERSION, KIND, report);
    let mut identity = ProxyFileIdentity::default();
    o.unimplemented(
        "featureGates",
        Default::Empty,
        "keelson has no feature gates",
        report,
    );

    let mut cc = o.object("clientConnection", report);
    if let Some(k) = cc.string("kubeconfig", report) {
        cfg.proxy.client_connection.kubeconfig = Some(k.into());
    }
    if let Some(q) = cc.get::<f32>("qps", report) {
        cfg.proxy.client_connection.qps = if q == 0.0 { 5.0 } else { q };
    }
    if let Some(b) = cc.get::<i32>("burst", report) {
        cfg.proxy.client_connection.burst = if b == 0 { 10 } else { b };
    }
    for key in ["contentType", "acceptContentTypes"] {
        cc.unimplemented(key, CONTENT_TYPES, "keelson always speaks JSON", report);
    }
    cc.finish(report);

    apply_logging(cfg, &mut o, report);
    identity.hostname_override = o
        .string("hostnameOverride", report)
        .map(|h| h.to_lowercase());

    let bind = o.string("bindAddress", report);
    let bind_ip = match bind.as_deref().map(str::parse::<IpAddr>) {
        None => None,
        Some(Ok(ip)) => Some(ip),
        Some(Err(_)) => {
            report.error(
                "bindAddress",
                format!("{:?} is not an IP address", bind.unwrap_or_default()),
            );
            None
        }
    };
    if let Some(ip) = bind_ip
        && !ip.is_unspecified()
    {
        report.error(
            "bindAddress",
            format!("keelson takes the node's IPs from its Node object; only 0.0.0.0 or :: is accepted, got {ip}"),
        );
    }
    let v6 = bind_ip.is_some_and(|ip| ip.is_ipv6());
    let (healthz_host, metrics_host) = if v6 {
        ("::", "::1")
    } else {
        ("0.0.0.0", "127.0.0.1")
    };
    match o.string("healthzBindAddress", report) {
        None => cfg.proxy.healthz_bind_address = join(healthz_host, HEALTHZ_PORT),
        Some(a) => match with_port(&a, HEALTHZ_PORT) {
            Some(a) => cfg.proxy.healthz_bind_address = a,
            None => report.error(
                "healthzBindAddress",
                format!("{a:?} is not an IP or IP:port"),
            ),
        },
    }
    match o.string("metricsBindAddress", report) {
        None => cfg.metrics_bind_address = join(metrics_host, METRICS_PORT),
        Some(a) => match with_port(&a, METRICS_PORT) {
            Some(a) => cfg.metrics_bind_address = a,
            None => report.error(
                "metricsBindAddress",
                format!("{a:?} is not an IP or IP:port"),
            ),
        },
    }
    o.unimplemented(
        "bindAddressHardFail",
        Default::Bool(false),
        "keelson always stops when it cannot listen",
        report,
    );
    o.unimplemented(
        "enableProfiling",
        Default::Bool(false),
        "no profiling",
        report,
    );
    o.unimplemented(
        "showHiddenMetricsForVersion",
        Default::Str(""),
        "no hidden metrics",
        report,
    );

    let mode = o.get::<String>("mode", report).unwrap_or_default();
    let section = match mode.as_str() {
        "" => {
            cfg.proxy.mode = ProxyMode::Nftables;
            report.notes.push(
                "mode \"\" (kube-proxy's iptables default): keelson uses its default data plane, nftables, with the iptables section's syncPeriod, minSyncPeriod, masqueradeBit and masqueradeAll".to_string(),
            );
            "iptables"
        }
        "nftables" => {
            cfg.proxy.mode = ProxyMode::Nftables;
            "nftables"
        }
        other => {
            report.error(
                "mode",
                format!("keelson programs Services with nftables (or its own ebpf mode in a KeelsonConfiguration); {other:?} cannot be honoured: use \"nftables\" or \"\""),
            );
            "nftables"
        }
    };
    for name in ["iptables", "nftables"] {
        let mut s = o.object(name, report);
        let used = name == section;
        if used {
            if let Some(d) = s.duration("syncPeriod", report) {
                cfg.proxy.sync_period = d;
            }
            if let Some(d) = s.duration("minSyncPeriod", report) {
                cfg.proxy.min_sync_period = d;
            }
            if let Some(b) = s.get::<i32>("masqueradeBit", report) {
                cfg.proxy.nftables.masquerade_bit = b;
            }
            if let Some(b) = s.flag("masqueradeAll", report) {
                cfg.proxy.nftables.masquerade_all = b;
            }
        } else {
            unused_mode_section(&mut s, report);
        }
        if name == "iptables" {
            s.unimplemented(
                "localhostNodePorts",
                Default::Bool(true),
                "NodePorts are not served on 127.0.0.1 (as kube-proxy's nftables mode)",
                report,
            );
        }
        s.finish(report);
    }
    let mut ipvs = o.object("ipvs", report);
    for key in [
        "syncPeriod",
        "minSyncPeriod",
        "tcpTimeout",
        "tcpFinTimeout",
        "udpTimeout",
    ] {
        let default = if key == "syncPeriod" { 30 } else { 0 };
        ipvs.unimplemented(
            key,
            Default::Duration(KubeDuration::from_secs(default)),
            "no ipvs mode",
            report,
        );
    }
    ipvs.unimplemented("scheduler", Default::Str(""), "no ipvs mode", report);
    ipvs.unimplemented("excludeCIDRs", Default::Empty, "no ipvs mode", report);
    ipvs.unimplemented("strictARP", Default::Bool(false), "no ipvs mode", report);
    ipvs.finish(report);
    let mut win = o.object("winkernel", report);
    for key in ["networkName", "sourceVip", "rootHnsEndpointName"] {
        win.unimplemented(key, Default::Str(""), "Windows only", report);
    }
    for key in ["enableDSR", "forwardHealthCheckVip"] {
        win.unimplemented(key, Default::Bool(false), "Windows only", report);
    }
    win.finish(report);
    o.unimplemented(
        "windowsRunAsService",
        Default::Bool(false),
        "Windows only",
        report,
    );

    o.unimplemented(
        "detectLocalMode",
        Default::OneOf(&["ClusterCIDR", ""]),
        "local traffic is detected by clusterCIDR",
        report,
    );
    let mut dl = o.object("detectLocal", report);
    for key in ["bridgeInterface", "interfaceNamePrefix"] {
        dl.unimplemented(
            key,
            Default::Str(""),
            "local traffic is detected by clusterCIDR",
            report,
        );
    }
    dl.finish(report);
    if let Some(c) = o.string("clusterCIDR", report) {
        cfg.proxy.cluster_cidr = c;
    }
    if let Some(list) = o.get::<Vec<String>>("nodePortAddresses", report) {
        cfg.proxy.node_port_addresses = list;
    }
    if let Some(v) = o.get::<i32>("oomScoreAdj", report) {
        cfg.proxy.oom_score_adj = v;
    }
    apply_conntrack(cfg, &mut o, report);
    o.unimplemented(
        "configSyncPeriod",
        Default::Duration(KubeDuration::from_secs(15 * 60)),
        "watches have no periodic resync",
        report,
    );
    // "previously used to configure the userspace proxy, but is now unused" upstream.
    o.accept_any("portRange", report);
    o.finish(report);
    identity
}

/// The section of a mode that is not the configured one: kube-proxy does
/// not read it, so keelson accepts what it holds.
fn unused_mode_section(s: &mut Object, report: &mut Report) {
    for key in [
        "syncPeriod",
        "minSyncPeriod",
        "masqueradeBit",
        "masqueradeAll",
    ] {
        s.accept_any(key, report);
    }
}

fn apply_conntrack(cfg: &mut Config, o: &mut Object, report: &mut Report) {
    let mut c = o.object("conntrack", report);
    let ct = &mut cfg.proxy.conntrack;
    if let Some(v) = c.get::<i32>("maxPerCore", report) {
        ct.max_per_core = v;
    }
    if let Some(v) = c.get::<i32>("min", report) {
        ct.min = v;
    }
    if let Some(d) = c.duration_ptr("tcpEstablishedTimeout", report) {
        ct.tcp_established_timeout = d;
    }
    if let Some(d) = c.duration_ptr("tcpCloseWaitTimeout", report) {
        ct.tcp_close_wait_timeout = d;
    }
    if let Some(b) = c.flag("tcpBeLiberal", report) {
        ct.tcp_be_liberal = b;
    }
    if let Some(d) = c.duration_ptr("udpTimeout", report) {
        ct.udp_timeout = d;
    }
    if let Some(d) = c.duration_ptr("udpStreamTimeout", report) {
        ct.udp_stream_timeout = d;
    }
    c.finish(report);
}

fn join(host: &str, port: u16) -> String {
    match host.parse::<IpAddr>() {
        Ok(ip) => std::net::SocketAddr::new(ip, port).to_string(),
        Err(_) => format!("{host}:{port}"),
    }
}

/// kube-proxy's `AppendPortIfNeeded`: `IP:port` stays, a bare IP gets the
/// port; anything else is invalid.
fn with_port(addr: &str, port: u16) -> Option<String> {
    if addr.parse::<std::net::SocketAddr>().is_ok() {
        return Some(addr.to_string());
    }
    addr.parse::<IpAddr>()
        .ok()
        .map(|ip| std::net::SocketAddr::new(ip, port).to_string())
}

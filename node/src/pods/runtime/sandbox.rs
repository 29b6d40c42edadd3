//! The sandbox config of a pod (kubelet's `generatePodSandboxConfig`):
//! metadata and attempt, labels/annotations, host name, DNS, log
//! directory, port mappings of every container port, cgroup parent,
//! security context, sysctls and the pod's resources.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, Pod};
use keelson_cri::api;

use super::dns::{DnsError, DnsSettings, DnsWarning, pod_dns, pod_hostname};
use super::linux_resources::{CpuQuota, sandbox_resources};
use super::security::sandbox_security_context;
use crate::pod::labels::{new_pod_annotations, new_pod_labels};
use crate::pod::podutil;

/// `/var/log/pods/<ns>_<name>_<uid>` (`BuildPodLogsDirectory`).
pub fn pod_logs_dir(root: &Path, pod: &Pod) -> PathBuf {
    root.join(format!(
        "{}_{}_{}",
        podutil::namespace(pod),
        podutil::name(pod),
        podutil::uid(pod)
    ))
}

/// `<pod logs dir>/<container>` (`BuildContainerLogsDirectory`).
pub fn container_logs_dir(root: &Path, pod: &Pod, container: &str) -> PathBuf {
    pod_logs_dir(root, pod).join(container)
}

/// CRI protocol numbers.
fn protocol(p: Option<&str>) -> i32 {
    match p {
        Some("UDP") => 1,
        Some("SCTP") => 2,
        _ => 0,
    }
}

/// `MakePortMappings` of one container.
pub fn port_mappings(c: &Container) -> Vec<api::PortMapping> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for p in c.ports.iter().flatten() {
        let proto = p.protocol.as_deref().unwrap_or("TCP");
        let family = if p.host_ip.as_deref().is_some_and(|ip| ip.contains(':')) {
            "v6"
        } else {
            "v4"
        };
        let name = match p.name.as_deref().filter(|n| !n.is_empty()) {
            Some(n) => format!("{}-{n}", c.name),
            None => format!("{}-{family}-{proto}:{}", c.name, p.container_port),
        };
        if !seen.insert(name) {
            tracing::info!(container = %c.name, port = p.container_port, "port name defined more than once; skipped");
            continue;
        }
        out.push(api::PortMapping {
            protocol: protocol(Some(proto)),
            container_port: p.container_port,
            host_port: p.host_port.unwrap_or(0),
            host_ip: p.host_ip.clone().unwrap_or_default(),
        });
    }
    out
}

/// What the sandbox config depends on besides the pod.
#[derive(Debug, Clone)]
pub struct SandboxInputs<'a> {
    /// DNS settings of the node.
    pub dns: &'a DnsSettings,
    /// `podLogsDir`.
    pub pod_logs_root: &'a Path,
    /// The pod's cgroup (cgroupfs path).
    pub cgroup_parent: &'a str,
    /// CFS quota settings.
    pub quota: CpuQuota,
    /// The host facts resources depend on.
    pub host: &'a super::linux_host::LinuxHost,
}

/// Why a pod gets no sandbox (the message of `FailedCreatePodSandBox`,
/// `ConfigPodSandboxError` or `FailedPrepareDynamicResources`).
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The host name could not be formed.
    #[error(transparent)]
    Hostname(#[from] DnsError),
    /// `spec.hostUsers: false`.
    #[error(
        "can't set `spec.hostUsers: false`, keelson does not support user namespaces \
         (it allocates no user namespace ID mappings)"
    )]
    UserNamespace,
    /// `resourceClaims` (DRA).
    #[error(
        "keelson does not support dynamic resource allocation (the pod has resourceClaims); \
         it prepares no DRA claims"
    )]
    DynamicResources,
}

/// What keelson answers for a pod asking for its own user namespace.
///
/// kubelet allocates a range of host IDs per pod (its `UsernsManager`) and
/// passes it as `NamespaceOption.userns_options` in POD mode; when the
/// runtime handler does not support user namespaces it refuses the sandbox
/// (`GetOrCreateUserNamespaceMappings`: "can't set `spec.hostUsers: false`,
/// ..."). keelson allocates no ID mappings, so it refuses every such pod
/// the same way rather than running it in the host's user namespace.
pub fn check_user_namespace(pod: &Pod) -> Result<(), SandboxError> {
    if podutil::spec(pod).host_users == Some(false) {
        return Err(SandboxError::UserNamespace);
    }
    Ok(())
}

/// kubelet prepares a pod's DRA claims (`PrepareDynamicResources`, through
/// the claims' DRA drivers) before it creates the sandbox; when that fails
/// it records `FailedPrepareDynamicResources` and leaves the pod pending.
/// keelson talks to no DRA driver, so a pod with `resourceClaims` (or a
/// container's `resources.claims`) gets that refusal and never runs
/// without its devices.
pub fn check_dynamic_resources(pod: &Pod) -> Result<(), SandboxError> {
    let spec = podutil::spec(pod);
    let container_claims = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(|c| {
            c.resources
                .as_ref()
                .and_then(|r| r.claims.as_ref())
                .is_some_and(|c| !c.is_empty())
        });
    if spec.resource_claims.as_ref().is_some_and(|c| !c.is_empty()) || container_claims {
        return Err(SandboxError::DynamicResources);
    }
    Ok(())
}

/// Builds the sandbox config; the error is a message for
/// `ConfigPodSandboxError` / `FailedCreatePodSandBox`.
pub fn generate_sandbox_config(
    pod: &Pod,
    attempt: u32,
    inp: &SandboxInputs<'_>,
) -> Result<(api::PodSandboxConfig, Vec<DnsWarning>), SandboxError> {
    let (dns, warnings) = pod_dns(pod, inp.dns);
    let hostname = if podutil::is_host_network(pod) {
        String::new()
    } else {
        pod_hostname(pod, &inp.dns.cluster_domain)?.0
    };
    check_user_namespace(pod)?;
    let mut ports = Vec::new();
    for c in podutil::containers(pod) {
        ports.extend(port_mappings(c));
    }
    let sysctls = podutil::spec(pod)
        .security_context
        .as_ref()
        .and_then(|s| s.sysctls.as_ref())
        .map(|list| {
            list.iter()
                // runc wants dots between the namespace parts of a name.
                .map(|s| (convert_sysctl_name(&s.name), s.value.clone()))
                .collect()
        })
        .unwrap_or_default();
    let (resources, overhead) = sandbox_resources(pod, inp.quota, inp.host);
    let config = api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: podutil::name(pod).to_string(),
            uid: podutil::uid(pod).to_string(),
            namespace: podutil::namespace(pod).to_string(),
            attempt,
        }),
        hostname,
        log_directory: pod_logs_dir(inp.pod_logs_root, pod).display().to_string(),
        dns_config: Some(dns),
        port_mappings: ports,
        labels: new_pod_labels(pod),
        annotations: new_pod_annotations(pod),
        linux: Some(api::LinuxPodSandboxConfig {
            cgroup_parent: inp.cgroup_parent.to_string(),
            security_context: Some(sandbox_security_context(pod)),
            sysctls,
            overhead,
            resources: Some(resources),
        }),
        windows: None,
    };
    Ok((config, warnings))
}

/// `ConvertSysctlVariableToDotsSeparator`: `a/b.c` → `a.b/c` style
/// conversion (slashes and dots swapped), as kubelet passes sysctls to runc.
pub fn convert_sysctl_name(name: &str) -> String {
    if !name.contains('/') {
        return name.to_string();
    }
    name.chars()
        .map(|c| match c {
            '/' => '.',
            '.' => '/',
            other => other,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_config_fields() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u1", "labels": {"app": "w"},
                         "annotations": {"a": "b"}},
            "spec": {"securityContext": {"sysctls": [{"name": "net/ipv4/ip_unprivileged_port_start", "value": "0"}]},
                     "containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 8080},
                                                           {"name": "dns", "containerPort": 53, "protocol": "UDP"}]}]}
        }))
        .expect("pod");
        let dns = DnsSettings::default();
        let (cfg, _) = generate_sandbox_config(
            &pod,
            2,
            &SandboxInputs {
                dns: &dns,
                pod_logs_root: Path::new("/var/log/pods"),
                cgroup_parent: "/kubepods/besteffort/podu1",
                quota: CpuQuota {
                    enforce: true,
                    period_us: 100_000,
                },
                host: &super::super::linux_host::LinuxHost::default(),
            },
        )
        .expect("config");
        let md = cfg.metadata.clone().expect("md");
        assert_eq!(
            (
                md.name.as_str(),
                md.namespace.as_str(),
                md.uid.as_str(),
                md.attempt
            ),
            ("web", "ns", "u1", 2)
        );
        assert_eq!(cfg.hostname, "web");
        assert_eq!(cfg.log_directory, "/var/log/pods/ns_web_u1");
        assert_eq!(cfg.labels["io.kubernetes.pod.uid"], "u1");
        assert_eq!(cfg.labels["app"], "w");
        assert_eq!(cfg.annotations["a"], "b");
        assert_eq!(cfg.port_mappings.len(), 2);
        assert_eq!(cfg.port_mappings[0].host_port, 8080);
        assert_eq!(cfg.port_mappings[1].protocol, 1);
        let linux = cfg.linux.expect("linux");
        assert_eq!(linux.cgroup_parent, "/kubepods/besteffort/podu1");
        assert_eq!(linux.sysctls["net.ipv4.ip_unprivileged_port_start"], "0");
        assert_eq!(
            linux
                .security_context
                .and_then(|s| s.namespace_options)
                .map(|n| n.network),
            Some(0)
        );
    }

    #[test]
    fn dynamic_resource_claims_are_refused() {
        let pod = |spec: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "web", "namespace": "ns", "uid": "u1"},
                "spec": spec
            }))
            .expect("pod")
        };
        assert!(
            check_dynamic_resources(&pod(serde_json::json!({"containers": [{"name": "c"}]})))
                .is_ok()
        );
        let claims = pod(serde_json::json!({
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu-claim"}],
            "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}]
        }));
        assert!(
            check_dynamic_resources(&claims)
                .expect_err("refused")
                .to_string()
                .contains("does not support dynamic resource allocation")
        );
        let container_only = pod(serde_json::json!({
            "initContainers": [{"name": "i", "resources": {"claims": [{"name": "gpu"}]}}],
            "containers": [{"name": "c"}]
        }));
        assert!(check_dynamic_resources(&container_only).is_err());
    }

    #[test]
    fn host_users_false_is_refused() {
        let pod = |host_users: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "web", "namespace": "ns", "uid": "u1"},
                "spec": {"hostUsers": host_users, "containers": [{"name": "c"}]}
            }))
            .expect("pod")
        };
        let dns = DnsSettings::default();
        let host = super::super::linux_host::LinuxHost::default();
        let inputs = SandboxInputs {
            dns: &dns,
            pod_logs_root: Path::new("/var/log/pods"),
            cgroup_parent: "/kubepods/podu1",
            quota: CpuQuota {
                enforce: true,
                period_us: 100_000,
            },
            host: &host,
        };
        let err = generate_sandbox_config(&pod(serde_json::json!(false)), 0, &inputs)
            .expect_err("hostUsers: false is refused")
            .to_string();
        assert!(
            err.starts_with(
                "can't set `spec.hostUsers: false`, keelson does not support user namespaces"
            ),
            "{err}"
        );
        for ok in [serde_json::json!(true), serde_json::Value::Null] {
            assert!(
                generate_sandbox_config(&pod(ok.clone()), 0, &inputs).is_ok(),
                "{ok}"
            );
        }
    }

    #[test]
    fn sysctl_names() {
        assert_eq!(
            convert_sysctl_name("kernel.shm_rmid_forced"),
            "kernel.shm_rmid_forced"
        );
        assert_eq!(
            convert_sysctl_name("net/ipv4/conf/eno2.100/rp_filter"),
            "net.ipv4.conf.eno2/100.rp_filter"
        );
    }
}

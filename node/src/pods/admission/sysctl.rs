//! kubelet's sysctl admission (`pkg/kubelet/sysctl/allowlist.go`,
//! `safe_sysctls.go`, `k8s.io/component-helpers/node/util/sysctl`): a pod
//! may set only the safe sysctls (those namespaced by the kernel it runs
//! on) and the `allowedUnsafeSysctls` of the node, and never a net or IPC
//! sysctl while sharing the host's network or IPC namespace. Anything else
//! is refused with `SysctlForbidden`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use super::Verdict;

/// kubelet's `ForbiddenReason`.
pub const FORBIDDEN_REASON: &str = "SysctlForbidden";

/// The kernel namespace a sysctl belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SysctlNamespace {
    /// The IPC namespace.
    Ipc,
    /// The network namespace.
    Net,
}

impl SysctlNamespace {
    fn as_str(self) -> &'static str {
        match self {
            SysctlNamespace::Ipc => "IPC",
            SysctlNamespace::Net => "Net",
        }
    }
}

/// Safe sysctls with the kernel version that namespaced them (`None`:
/// always namespaced). `safe_sysctls.go` and `pkg/util/kernel/constants.go`.
const SAFE_SYSCTLS: &[(&str, Option<(u32, u32)>)] = &[
    ("kernel.shm_rmid_forced", None),
    ("net.ipv4.ip_local_port_range", None),
    ("net.ipv4.tcp_syncookies", None),
    ("net.ipv4.ping_group_range", None),
    ("net.ipv4.ip_unprivileged_port_start", None),
    ("net.ipv4.ip_local_reserved_ports", Some((3, 16))),
    ("net.ipv4.tcp_keepalive_time", Some((4, 5))),
    ("net.ipv4.tcp_fin_timeout", Some((4, 6))),
    ("net.ipv4.tcp_keepalive_intvl", Some((4, 5))),
    ("net.ipv4.tcp_keepalive_probes", Some((4, 5))),
    ("net.ipv4.tcp_rmem", Some((4, 15))),
    ("net.ipv4.tcp_wmem", Some((4, 15))),
];

/// `NormalizeName`: a name whose first separator is `/` has its `.` and
/// `/` swapped (`net/ipv4/conf/eno2.100/rp_filter` →
/// `net.ipv4.conf.eno2/100.rp_filter`).
pub fn normalize_name(name: &str) -> String {
    match name.find(['.', '/']) {
        Some(i) if name.as_bytes()[i] == b'/' => name
            .chars()
            .map(|c| match c {
                '.' => '/',
                '/' => '.',
                other => other,
            })
            .collect(),
        _ => name.to_string(),
    }
}

/// `namespaceOf`: the IPC sysctls by name, `net.*` and `fs.mqueue.*` by
/// prefix; anything else is not known to be namespaced.
fn namespace_of(name: &str) -> Option<SysctlNamespace> {
    const IPC: &[&str] = &[
        "kernel.sem",
        "kernel.shmall",
        "kernel.shmmax",
        "kernel.shmmni",
        "kernel.shm_rmid_forced",
        "kernel.shm",
        "kernel.msgmax",
        "kernel.msgmnb",
        "kernel.msgmni",
        "kernel.msg",
    ];
    if IPC.contains(&name) {
        return Some(SysctlNamespace::Ipc);
    }
    if name.starts_with("net.") {
        return Some(SysctlNamespace::Net);
    }
    if name.starts_with("fs.mqueue.") {
        return Some(SysctlNamespace::Ipc);
    }
    None
}

/// `GetNamespace`: the namespace, the name (or the prefix before the first
/// `*`) and whether it is a prefix.
fn get_namespace(pattern: &str) -> (Option<SysctlNamespace>, String, bool) {
    let mut name = normalize_name(pattern);
    let prefixed = match name.find('*') {
        Some(i) => {
            name.truncate(i);
            true
        }
        None => false,
    };
    (namespace_of(&name), name, prefixed)
}

fn is_segment(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && alnum(b[0])
        && alnum(b[b.len() - 1])
        && b.iter().all(|&c| alnum(c) || c == b'-' || c == b'_')
}

fn is_pattern_segment(s: &str) -> bool {
    // `([a-z0-9][-_a-z0-9]*)?[a-z0-9*]`
    let b = s.as_bytes();
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let Some((&last, rest)) = b.split_last() else {
        return false;
    };
    if !(alnum(last) || last == b'*') {
        return false;
    }
    match rest.split_first() {
        None => true,
        Some((&first, middle)) => {
            alnum(first) && middle.iter().all(|&c| alnum(c) || c == b'-' || c == b'_')
        }
    }
}

/// Why a sysctl pattern or a pod's sysctl is refused (kubelet's
/// `sysctl.NewAllowlist` and `patternAllowlist.validateSysctl` texts).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SysctlError {
    /// `allowedUnsafeSysctls` entry that is no sysctl pattern.
    #[error(
        "sysctl {0:?} must have at most 253 characters and match regex \
         ([a-z0-9]([-_a-z0-9]*[a-z0-9])?[\\./])*([a-z0-9][-_a-z0-9]*)?[a-z0-9*]"
    )]
    InvalidPattern(String),
    /// A pattern naming sysctls no namespace isolates.
    #[error("the sysctls {0:?} are not known to be namespaced")]
    NotNamespaced(String),
    /// A namespaced sysctl in a pod sharing that namespace with the host.
    #[error("{name:?} not allowed with host {} enabled", namespace.as_str())]
    HostNamespace {
        /// The sysctl, normalized.
        name: String,
        /// Its namespace.
        namespace: SysctlNamespace,
    },
    /// A sysctl neither safe nor allowlisted.
    #[error("{0:?} not allowlisted")]
    NotAllowlisted(String),
}

/// `IsValidSysctlPattern` (at most 253 characters, segments separated by
/// `.` or `/`, the last may end in `*`) plus `NewAllowlist`'s namespace
/// check; the error is kubelet's text.
pub fn check_pattern(pattern: &str) -> Result<(), SysctlError> {
    let valid = pattern.len() <= 253 && {
        let parts: Vec<&str> = pattern.split(['.', '/']).collect();
        match parts.split_last() {
            Some((last, init)) => is_pattern_segment(last) && init.iter().all(|s| is_segment(s)),
            None => false,
        }
    };
    if !valid {
        return Err(SysctlError::InvalidPattern(pattern.to_string()));
    }
    let (ns, name, _) = get_namespace(pattern);
    if ns.is_none() {
        return Err(SysctlError::NotNamespaced(name));
    }
    Ok(())
}

/// The safe sysctls this kernel namespaces (`SafeSysctlAllowlist`).
pub fn safe_sysctls(kernel: Option<(u32, u32)>) -> Vec<String> {
    SAFE_SYSCTLS
        .iter()
        .filter(|(name, min)| match (min, kernel) {
            (None, _) => true,
            (Some(min), Some(k)) => k >= *min,
            (Some(_), None) => {
                tracing::info!(
                    sysctl = name,
                    "kernel version unknown; sysctl dropped from the safe list"
                );
                false
            }
        })
        .map(|(name, _)| (*name).to_string())
        .collect()
}

/// The running kernel's `major.minor`.
pub fn kernel_version() -> Option<(u32, u32)> {
    let uts = nix::sys::utsname::uname().ok()?;
    let release = uts.release().to_string_lossy().into_owned();
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// kubelet's `patternAllowlist`: exact names and prefixes, each with its
/// namespace.
#[derive(Debug, Clone, Default)]
pub struct SysctlAllowlist {
    names: BTreeMap<String, SysctlNamespace>,
    prefixes: BTreeMap<String, SysctlNamespace>,
}

impl SysctlAllowlist {
    /// The safe sysctls of this kernel plus `allowed_unsafe` (patterns
    /// already validated by the configuration; invalid ones are skipped
    /// with a warning).
    pub fn new(kernel: Option<(u32, u32)>, allowed_unsafe: &[String]) -> Self {
        let mut list = SysctlAllowlist::default();
        for pattern in safe_sysctls(kernel).iter().chain(allowed_unsafe) {
            if let Err(e) = check_pattern(pattern) {
                tracing::warn!(sysctl = %pattern, error = %e, "sysctl pattern skipped");
                continue;
            }
            let (ns, name, prefixed) = get_namespace(pattern);
            let Some(ns) = ns else { continue };
            if prefixed {
                list.prefixes.insert(name, ns);
            } else {
                list.names.insert(name, ns);
            }
        }
        list
    }

    fn validate(&self, sysctl: &str, host_net: bool, host_ipc: bool) -> Result<(), SysctlError> {
        let name = normalize_name(sysctl);
        let ns = self.names.get(&name).copied().or_else(|| {
            self.prefixes
                .iter()
                .find(|(p, _)| name.starts_with(p.as_str()))
                .map(|(_, ns)| *ns)
        });
        match ns {
            Some(namespace @ SysctlNamespace::Ipc) if host_ipc => {
                Err(SysctlError::HostNamespace { name, namespace })
            }
            Some(namespace @ SysctlNamespace::Net) if host_net => {
                Err(SysctlError::HostNamespace { name, namespace })
            }
            Some(_) => Ok(()),
            None => Err(SysctlError::NotAllowlisted(name)),
        }
    }

    /// The admit handler.
    pub fn admit(&self, pod: &Pod) -> Verdict {
        let Some(spec) = pod.spec.as_ref() else {
            return Ok(());
        };
        let sysctls = spec
            .security_context
            .as_ref()
            .and_then(|s| s.sysctls.as_ref());
        for s in sysctls.into_iter().flatten() {
            if let Err(e) = self.validate(
                &s.name,
                spec.host_network.unwrap_or(false),
                spec.host_ipc.unwrap_or(false),
            ) {
                return Err(super::rejection(
                    FORBIDDEN_REASON,
                    format!("forbidden sysctl: {e}"),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(sysctls: &[&str], host_net: bool) -> Pod {
        serde_json::from_value(serde_json::json!({
            "spec": {"hostNetwork": host_net, "containers": [],
                     "securityContext": {"sysctls": sysctls.iter()
                        .map(|n| serde_json::json!({"name": n, "value": "1"})).collect::<Vec<_>>()}}
        }))
        .expect("pod")
    }

    #[test]
    fn safe_list_follows_the_kernel() {
        let old = safe_sysctls(Some((4, 4)));
        assert!(old.contains(&"net.ipv4.ip_local_reserved_ports".to_string()));
        assert!(!old.contains(&"net.ipv4.tcp_keepalive_time".to_string()));
        assert_eq!(safe_sysctls(Some((6, 1))).len(), SAFE_SYSCTLS.len());
        assert_eq!(safe_sysctls(None).len(), 5);
    }

    #[test]
    fn admission_messages_are_kubelets() {
        let list = SysctlAllowlist::new(
            Some((6, 1)),
            &["net.core.somaxconn".into(), "kernel.msg*".into()],
        );
        assert!(
            list.admit(&pod(
                &["kernel.shm_rmid_forced", "net/ipv4/tcp_syncookies"],
                false
            ))
            .is_ok()
        );
        assert!(
            list.admit(&pod(&["net.core.somaxconn", "kernel.msgmax"], false))
                .is_ok()
        );
        let e = list
            .admit(&pod(&["kernel.sched_rt_runtime_us"], false))
            .expect_err("unsafe");
        assert_eq!(e.reason, "SysctlForbidden");
        assert_eq!(
            e.message,
            "forbidden sysctl: \"kernel.sched_rt_runtime_us\" not allowlisted"
        );
        let e = list
            .admit(&pod(&["net.ipv4.tcp_syncookies"], true))
            .expect_err("host net");
        assert_eq!(
            e.message,
            "forbidden sysctl: \"net.ipv4.tcp_syncookies\" not allowed with host Net enabled"
        );
    }

    #[test]
    fn patterns() {
        assert!(check_pattern("net.core.somaxconn").is_ok());
        assert!(check_pattern("net.ipv4.conf.*").is_ok());
        assert!(check_pattern("kernel.msg*").is_ok());
        assert_eq!(
            check_pattern("kernel.panic"),
            Err(SysctlError::NotNamespaced("kernel.panic".into()))
        );
        assert!(check_pattern("Net.Core").is_err());
        assert!(check_pattern("net..x").is_err());
        assert_eq!(
            normalize_name("net/ipv4/conf/eno2.100/rp_filter"),
            "net.ipv4.conf.eno2/100.rp_filter"
        );
    }
}

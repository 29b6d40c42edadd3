//! Pod and container security contexts converted to CRI (kubelet's
//! `NamespacesForPod`, `determineEffectiveSecurityContext`, seccomp and
//! masked-path rules).

use k8s_openapi::api::core::v1::{Container, Pod, SeccompProfile};
use keelson_cri::api;

use crate::pod::podutil;

/// Paths masked in every non-privileged container (`DefaultProcMount`).
pub const DEFAULT_MASKED_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
/// Paths mounted read-only (`DefaultProcMount`).
pub const DEFAULT_READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// CRI namespace modes.
const MODE_POD: i32 = 0;
const MODE_CONTAINER: i32 = 1;
const MODE_NODE: i32 = 2;

/// `NamespacesForPod`: network/IPC/PID sharing of a pod.
pub fn namespaces_for_pod(pod: &Pod) -> api::NamespaceOption {
    let spec = podutil::spec(pod);
    let pid = if spec.host_pid.unwrap_or(false) {
        MODE_NODE
    } else if spec.share_process_namespace.unwrap_or(false) {
        MODE_POD
    } else {
        MODE_CONTAINER
    };
    api::NamespaceOption {
        network: if spec.host_network.unwrap_or(false) {
            MODE_NODE
        } else {
            MODE_POD
        },
        pid,
        ipc: if spec.host_ipc.unwrap_or(false) {
            MODE_NODE
        } else {
            MODE_POD
        },
        target_id: String::new(),
        userns_options: None,
    }
}

/// Whether any container (init or regular) is privileged.
pub fn has_privileged_container(pod: &Pod) -> bool {
    podutil::containers(pod)
        .iter()
        .chain(podutil::init_containers(pod))
        .any(|c| {
            c.security_context
                .as_ref()
                .and_then(|s| s.privileged)
                .unwrap_or(false)
        })
}

/// Where `Localhost` seccomp profiles live.
#[derive(Debug, Clone)]
pub struct SeccompSettings {
    /// `<rootDir>/seccomp`.
    pub profile_root: String,
    /// `seccompDefault`: RuntimeDefault when nothing is set.
    pub default_runtime: bool,
}

/// CRI `SecurityProfile` types.
const PROFILE_RUNTIME_DEFAULT: i32 = 0;
const PROFILE_UNCONFINED: i32 = 1;
const PROFILE_LOCALHOST: i32 = 2;

fn convert_seccomp(p: &SeccompProfile, s: &SeccompSettings) -> api::SecurityProfile {
    match p.type_.as_str() {
        "RuntimeDefault" => api::SecurityProfile {
            profile_type: PROFILE_RUNTIME_DEFAULT,
            localhost_ref: String::new(),
        },
        "Localhost" => api::SecurityProfile {
            profile_type: PROFILE_LOCALHOST,
            localhost_ref: format!(
                "{}/{}",
                s.profile_root.trim_end_matches('/'),
                p.localhost_profile.as_deref().unwrap_or_default()
            ),
        },
        _ => api::SecurityProfile {
            profile_type: PROFILE_UNCONFINED,
            localhost_ref: String::new(),
        },
    }
}

/// The container's seccomp profile: its own, else the pod's, else the
/// node default.
pub fn container_seccomp(pod: &Pod, c: &Container, s: &SeccompSettings) -> api::SecurityProfile {
    let own = c
        .security_context
        .as_ref()
        .and_then(|sc| sc.seccomp_profile.as_ref());
    let pod_level = podutil::spec(pod)
        .security_context
        .as_ref()
        .and_then(|sc| sc.seccomp_profile.as_ref());
    match own.or(pod_level) {
        Some(p) => convert_seccomp(p, s),
        None if s.default_runtime => api::SecurityProfile {
            profile_type: PROFILE_RUNTIME_DEFAULT,
            localhost_ref: String::new(),
        },
        None => api::SecurityProfile {
            profile_type: PROFILE_UNCONFINED,
            localhost_ref: String::new(),
        },
    }
}

fn selinux(o: Option<&k8s_openapi::api::core::v1::SELinuxOptions>) -> Option<api::SeLinuxOption> {
    o.map(|o| api::SeLinuxOption {
        user: o.user.clone().unwrap_or_default(),
        role: o.role.clone().unwrap_or_default(),
        r#type: o.type_.clone().unwrap_or_default(),
        level: o.level.clone().unwrap_or_default(),
    })
}

/// The sandbox's security context.
pub fn sandbox_security_context(pod: &Pod) -> api::LinuxSandboxSecurityContext {
    let psc = podutil::spec(pod).security_context.as_ref();
    let mut groups: Vec<i64> = Vec::new();
    if let Some(g) = psc.and_then(|s| s.fs_group) {
        groups.push(g);
    }
    groups.extend(
        psc.and_then(|s| s.supplemental_groups.clone())
            .unwrap_or_default(),
    );
    api::LinuxSandboxSecurityContext {
        namespace_options: Some(namespaces_for_pod(pod)),
        selinux_options: selinux(psc.and_then(|s| s.se_linux_options.as_ref())),
        run_as_user: psc
            .and_then(|s| s.run_as_user)
            .map(|v| api::Int64Value { value: v }),
        run_as_group: psc
            .and_then(|s| s.run_as_group)
            .map(|v| api::Int64Value { value: v }),
        readonly_rootfs: false,
        supplemental_groups: groups,
        supplemental_groups_policy: supplemental_groups_policy(pod),
        privileged: has_privileged_container(pod),
        seccomp: Some(api::SecurityProfile {
            profile_type: PROFILE_RUNTIME_DEFAULT,
            localhost_ref: String::new(),
        }),
        apparmor: None,
        ..Default::default()
    }
}

/// `determineEffectiveSecurityContext`: the container's security context
/// over the pod's.
pub fn container_security_context(
    pod: &Pod,
    c: &Container,
    image_username: &str,
    seccomp: &SeccompSettings,
) -> api::LinuxContainerSecurityContext {
    let psc = podutil::spec(pod).security_context.as_ref();
    let csc = c.security_context.as_ref();
    let privileged = csc.and_then(|s| s.privileged).unwrap_or(false);
    let run_as_user = csc
        .and_then(|s| s.run_as_user)
        .or_else(|| psc.and_then(|s| s.run_as_user));
    let run_as_group = csc
        .and_then(|s| s.run_as_group)
        .or_else(|| psc.and_then(|s| s.run_as_group));
    let mut groups: Vec<i64> = Vec::new();
    if let Some(g) = psc.and_then(|s| s.fs_group) {
        groups.push(g);
    }
    groups.extend(
        psc.and_then(|s| s.supplemental_groups.clone())
            .unwrap_or_default(),
    );
    let caps = csc
        .and_then(|s| s.capabilities.as_ref())
        .map(|caps| api::Capability {
            add_capabilities: caps.add.clone().unwrap_or_default(),
            drop_capabilities: caps.drop.clone().unwrap_or_default(),
            add_ambient_capabilities: Vec::new(),
        });
    let (apparmor, apparmor_profile) = container_apparmor(pod, c);
    let unmasked = csc.and_then(|s| s.proc_mount.as_deref()) == Some("Unmasked");
    let (masked, readonly) = if unmasked {
        (Vec::new(), Vec::new())
    } else {
        (
            DEFAULT_MASKED_PATHS.iter().map(|s| s.to_string()).collect(),
            DEFAULT_READONLY_PATHS
                .iter()
                .map(|s| s.to_string())
                .collect(),
        )
    };
    let mut sc = api::LinuxContainerSecurityContext {
        capabilities: caps,
        privileged,
        namespace_options: Some(namespaces_for_pod(pod)),
        selinux_options: selinux(
            csc.and_then(|s| s.se_linux_options.as_ref())
                .or_else(|| psc.and_then(|s| s.se_linux_options.as_ref())),
        ),
        run_as_user: run_as_user.map(|v| api::Int64Value { value: v }),
        run_as_group: run_as_group.map(|v| api::Int64Value { value: v }),
        run_as_username: if run_as_user.is_none() {
            image_username.to_string()
        } else {
            String::new()
        },
        readonly_rootfs: csc
            .and_then(|s| s.read_only_root_filesystem)
            .unwrap_or(false),
        supplemental_groups: groups,
        supplemental_groups_policy: supplemental_groups_policy(pod),
        no_new_privs: csc.and_then(|s| s.allow_privilege_escalation) == Some(false),
        masked_paths: masked,
        readonly_paths: readonly,
        seccomp: Some(container_seccomp(pod, c, seccomp)),
        apparmor,
        ..Default::default()
    };
    // The deprecated string form, still sent as kubelet sends it.
    #[allow(deprecated)]
    {
        sc.apparmor_profile = apparmor_profile;
    }
    sc
}

/// The pod's `supplementalGroupsPolicy` as CRI numbers it (`Merge` 0,
/// `Strict` 1). `Strict` reaches a runtime only if the node declares it
/// supports it (admission refuses it otherwise).
fn supplemental_groups_policy(pod: &Pod) -> i32 {
    match podutil::spec(pod)
        .security_context
        .as_ref()
        .and_then(|s| s.supplemental_groups_policy.as_deref())
    {
        Some("Strict") => api::SupplementalGroupsPolicy::Strict as i32,
        _ => api::SupplementalGroupsPolicy::Merge as i32,
    }
}

/// kubelet's `getAppArmorProfile`: the container's AppArmor profile (its
/// field, the deprecated annotation, the pod's field) as a CRI
/// SecurityProfile and in the deprecated string form (`runtime/default`,
/// `unconfined`, `localhost/<name>`) older runtimes read.
pub fn container_apparmor(pod: &Pod, c: &Container) -> (Option<api::SecurityProfile>, String) {
    let Some(p) = crate::pods::admission::apparmor::profile_for(pod, c) else {
        return (None, String::new());
    };
    use crate::pods::admission::apparmor as aa;
    let (profile_type, localhost_ref, deprecated) = match p.type_.as_str() {
        "RuntimeDefault" => (
            PROFILE_RUNTIME_DEFAULT,
            String::new(),
            aa::DEPRECATED_RUNTIME_DEFAULT.to_string(),
        ),
        "Unconfined" => (
            PROFILE_UNCONFINED,
            String::new(),
            aa::DEPRECATED_UNCONFINED.to_string(),
        ),
        // A Localhost profile without a name never gets here: admission
        // refuses it.
        _ => {
            let name = p.localhost_profile.unwrap_or_default();
            let deprecated = format!("{}{name}", aa::DEPRECATED_LOCALHOST_PREFIX);
            (PROFILE_LOCALHOST, name, deprecated)
        }
    };
    (
        Some(api::SecurityProfile {
            profile_type,
            localhost_ref,
        }),
        deprecated,
    )
}

/// Why `runAsNonRoot` refuses a container (kubelet's `verifyRunAsNonRoot`
/// texts; the message of `CreateContainerConfigError`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NonRootError {
    /// `runAsUser: 0`.
    #[error("container's runAsUser breaks non-root policy (pod: {pod:?}, container: {container})")]
    RunAsUserRoot {
        /// The pod as kubelet formats it.
        pod: String,
        /// The container.
        container: String,
    },
    /// The image runs as uid 0 (or names no user).
    #[error(
        "container has runAsNonRoot and image will run as root (pod: {pod:?}, container: {container})"
    )]
    ImageRoot {
        /// The pod as kubelet formats it.
        pod: String,
        /// The container.
        container: String,
    },
    /// The image's user is a name, which cannot be checked.
    #[error(
        "container has runAsNonRoot and image has non-numeric user ({user}), cannot verify user is non-root (pod: {pod:?}, container: {container})"
    )]
    NonNumericUser {
        /// The image's user.
        user: String,
        /// The pod as kubelet formats it.
        pod: String,
        /// The container.
        container: String,
    },
}

/// kubelet's `verifyRunAsNonRoot` against the image's user.
pub fn verify_run_as_non_root(
    pod: &Pod,
    c: &Container,
    image_uid: Option<i64>,
    image_username: &str,
) -> Result<(), NonRootError> {
    let psc = podutil::spec(pod).security_context.as_ref();
    let csc = c.security_context.as_ref();
    let non_root = csc
        .and_then(|s| s.run_as_non_root)
        .or_else(|| psc.and_then(|s| s.run_as_non_root))
        .unwrap_or(false);
    if !non_root {
        return Ok(());
    }
    let pod_name = podutil::format_pod(pod);
    let run_as_user = csc
        .and_then(|s| s.run_as_user)
        .or_else(|| psc.and_then(|s| s.run_as_user));
    if let Some(uid) = run_as_user {
        if uid == 0 {
            return Err(NonRootError::RunAsUserRoot {
                pod: pod_name,
                container: c.name.clone(),
            });
        }
        return Ok(());
    }
    match image_uid {
        Some(0) => Err(NonRootError::ImageRoot {
            pod: pod_name,
            container: c.name.clone(),
        }),
        Some(_) => Ok(()),
        None if !image_username.is_empty() => Err(NonRootError::NonNumericUser {
            user: image_username.to_string(),
            pod: pod_name,
            container: c.name.clone(),
        }),
        None => Err(NonRootError::ImageRoot {
            pod: pod_name,
            container: c.name.clone(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_and_contexts() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "n", "uid": "u"},
            "spec": {"hostNetwork": true, "shareProcessNamespace": true,
                     "securityContext": {"runAsUser": 1000, "fsGroup": 2000, "supplementalGroups": [3000],
                                         "seccompProfile": {"type": "RuntimeDefault"}},
                     "containers": [{"name": "c", "securityContext": {
                         "allowPrivilegeEscalation": false, "runAsUser": 0,
                         "capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]}}}]}
        }))
        .expect("pod");
        let ns = namespaces_for_pod(&pod);
        assert_eq!(
            (ns.network, ns.pid, ns.ipc),
            (MODE_NODE, MODE_POD, MODE_POD)
        );
        let c = &podutil::containers(&pod)[0];
        let s = SeccompSettings {
            profile_root: "/var/lib/keelson/seccomp".into(),
            default_runtime: false,
        };
        let sc = container_security_context(&pod, c, "", &s);
        assert_eq!(sc.run_as_user.map(|v| v.value), Some(0));
        assert_eq!(sc.supplemental_groups, vec![2000, 3000]);
        assert!(sc.no_new_privs);
        assert_eq!(
            sc.seccomp.map(|p| p.profile_type),
            Some(PROFILE_RUNTIME_DEFAULT)
        );
        assert_eq!(
            sc.capabilities.map(|c| c.add_capabilities),
            Some(vec!["NET_ADMIN".to_string()])
        );
        assert!(sc.masked_paths.contains(&"/proc/kcore".to_string()));
        assert!(verify_run_as_non_root(&pod, c, Some(0), "").is_ok());
    }

    #[test]
    fn run_as_non_root() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "n", "uid": "u"},
            "spec": {"securityContext": {"runAsNonRoot": true}, "containers": [{"name": "c"}]}
        }))
        .expect("pod");
        let c = &podutil::containers(&pod)[0];
        assert!(
            verify_run_as_non_root(&pod, c, Some(0), "")
                .expect_err("an error")
                .to_string()
                .contains("will run as root")
        );
        assert!(verify_run_as_non_root(&pod, c, Some(65534), "").is_ok());
        assert!(
            verify_run_as_non_root(&pod, c, None, "nobody")
                .expect_err("an error")
                .to_string()
                .contains("non-numeric")
        );
    }

    #[test]
    fn apparmor_and_supplemental_groups_policy_reach_the_runtime() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "n", "uid": "u",
                         "annotations": {"container.apparmor.security.beta.kubernetes.io/b": "localhost/web"}},
            "spec": {
                "securityContext": {"appArmorProfile": {"type": "RuntimeDefault"},
                                    "supplementalGroupsPolicy": "Strict"},
                "containers": [
                    {"name": "a", "image": "i"},
                    {"name": "b", "image": "i"},
                    {"name": "c", "image": "i", "securityContext": {"appArmorProfile": {"type": "Unconfined"}}}
                ]
            }
        }))
        .expect("pod");
        let settings = SeccompSettings {
            profile_root: "/var/lib/keelson/seccomp".into(),
            default_runtime: false,
        };
        let ctx = |i: usize| {
            container_security_context(&pod, &podutil::containers(&pod)[i], "", &settings)
        };
        #[allow(deprecated)]
        let got: Vec<(i32, String, String)> = (0..3)
            .map(|i| {
                let sc = ctx(i);
                let p = sc.apparmor.expect("an AppArmor profile");
                (p.profile_type, p.localhost_ref, sc.apparmor_profile)
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    PROFILE_RUNTIME_DEFAULT,
                    String::new(),
                    "runtime/default".to_string()
                ),
                (
                    PROFILE_LOCALHOST,
                    "web".to_string(),
                    "localhost/web".to_string()
                ),
                (PROFILE_UNCONFINED, String::new(), "unconfined".to_string()),
            ]
        );
        assert_eq!(
            ctx(0).supplemental_groups_policy,
            api::SupplementalGroupsPolicy::Strict as i32
        );
        assert_eq!(
            sandbox_security_context(&pod).supplemental_groups_policy,
            api::SupplementalGroupsPolicy::Strict as i32
        );
    }
}

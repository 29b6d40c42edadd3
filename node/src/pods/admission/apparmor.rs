//! AppArmor: which profile each container gets (`pkg/security/apparmor`
//! `GetProfile`: the container's field, then the deprecated
//! `container.apparmor.security.beta.kubernetes.io/<name>` annotation, then
//! the pod's field) and kubelet's admission handler
//! (`lifecycle.NewAppArmorAdmitHandler`): a pending pod that asks for a
//! profile other than `Unconfined` is refused with reason `AppArmor` when
//! the host cannot enforce AppArmor, or when a `Localhost` profile has no
//! name.

use std::path::Path;

use k8s_openapi::api::core::v1::{AppArmorProfile, Container, Pod};

use super::Verdict;
use crate::pod::podutil;

/// kubelet's `AppArmorNotAdmittedReason`.
pub const NOT_ADMITTED_REASON: &str = "AppArmor";
/// `DeprecatedAppArmorBetaContainerAnnotationKeyPrefix`.
pub const ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";
/// `DeprecatedAppArmorBetaProfileRuntimeDefault`.
pub const DEPRECATED_RUNTIME_DEFAULT: &str = "runtime/default";
/// `DeprecatedAppArmorBetaProfileNameUnconfined`.
pub const DEPRECATED_UNCONFINED: &str = "unconfined";
/// `DeprecatedAppArmorBetaProfileNamePrefix`.
pub const DEPRECATED_LOCALHOST_PREFIX: &str = "localhost/";

/// Why a pod's AppArmor profiles cannot be enforced (kubelet's
/// `appArmorAdmitHandler` texts, after `Cannot enforce AppArmor: `).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AppArmorError {
    /// The host has no AppArmor.
    #[error("AppArmor is not enabled on the host")]
    HostDisabled,
    /// A `Localhost` profile without a name (Go's `%q` of the profile).
    #[error("invalid empty AppArmor profile name: {0}")]
    EmptyLocalhostProfile(String),
}

/// Whether this host can enforce AppArmor (libcontainer's `IsEnabled`:
/// securityfs has `apparmor` and the module says `Y`), read once at start
/// as kubelet does; `Err` is kubelet's reason.
pub fn validate_host(root: &Path) -> Result<(), AppArmorError> {
    let securityfs = root.join("sys/kernel/security/apparmor");
    let enabled = root.join("sys/module/apparmor/parameters/enabled");
    let on =
        securityfs.exists() && std::fs::read(&enabled).is_ok_and(|b| b.len() > 1 && b[0] == b'Y');
    if on {
        Ok(())
    } else {
        Err(AppArmorError::HostDisabled)
    }
}

fn profile_from_annotation(pod: &Pod, container: &str) -> Option<AppArmorProfile> {
    let value = pod
        .metadata
        .annotations
        .as_ref()?
        .get(&format!("{ANNOTATION_PREFIX}{container}"))?;
    if value == DEPRECATED_RUNTIME_DEFAULT {
        Some(AppArmorProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        })
    } else if value == DEPRECATED_UNCONFINED {
        Some(AppArmorProfile {
            type_: "Unconfined".into(),
            localhost_profile: None,
        })
    } else {
        value
            .strip_prefix(DEPRECATED_LOCALHOST_PREFIX)
            .map(|name| AppArmorProfile {
                type_: "Localhost".into(),
                localhost_profile: Some(name.to_string()),
            })
    }
}

/// `GetProfile`: the profile a container runs with, if any.
pub fn profile_for(pod: &Pod, c: &Container) -> Option<AppArmorProfile> {
    if let Some(p) = c
        .security_context
        .as_ref()
        .and_then(|s| s.app_armor_profile.clone())
    {
        return Some(p);
    }
    if let Some(p) = profile_from_annotation(pod, &c.name) {
        return Some(p);
    }
    podutil::spec(pod)
        .security_context
        .as_ref()
        .and_then(|s| s.app_armor_profile.clone())
}

/// `isRequired`: any profile other than `Unconfined` in a field, or a
/// deprecated annotation that is not `unconfined`.
fn is_required(pod: &Pod) -> bool {
    let confined = |p: Option<&AppArmorProfile>| p.is_some_and(|p| p.type_ != "Unconfined");
    let spec = podutil::spec(pod);
    if confined(
        spec.security_context
            .as_ref()
            .and_then(|s| s.app_armor_profile.as_ref()),
    ) {
        return true;
    }
    let all = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    if all.clone().any(|c| {
        confined(
            c.security_context
                .as_ref()
                .and_then(|s| s.app_armor_profile.as_ref()),
        )
    }) {
        return true;
    }
    pod.metadata
        .annotations
        .iter()
        .flatten()
        .find(|(k, _)| k.starts_with(ANNOTATION_PREFIX))
        .is_some_and(|(_, v)| v != DEPRECATED_UNCONFINED)
}

/// The admit handler, with the host check done at start.
#[derive(Debug, Clone)]
pub struct AppArmorAdmission {
    host: Result<(), AppArmorError>,
}

impl AppArmorAdmission {
    /// With this host's AppArmor support (`validate_host`).
    pub fn new(host: Result<(), AppArmorError>) -> Self {
        AppArmorAdmission { host }
    }

    /// Whether the host enforces AppArmor.
    pub fn host_enabled(&self) -> bool {
        self.host.is_ok()
    }

    fn validate(&self, pod: &Pod) -> Result<(), AppArmorError> {
        if !is_required(pod) {
            return Ok(());
        }
        self.host.clone()?;
        let spec = podutil::spec(pod);
        for c in spec
            .init_containers
            .iter()
            .flatten()
            .chain(spec.containers.iter())
        {
            if let Some(p) = profile_for(pod, c)
                && p.type_ == "Localhost"
                && p.localhost_profile
                    .as_deref()
                    .is_none_or(|n| n.trim().is_empty())
            {
                return Err(AppArmorError::EmptyLocalhostProfile(go_profile(&p)));
            }
        }
        Ok(())
    }

    /// The admit handler: only pending pods are checked.
    pub fn admit(&self, pod: &Pod) -> Verdict {
        if podutil::phase(pod) != "Pending" {
            return Ok(());
        }
        self.validate(pod).map_err(|e| {
            super::rejection(NOT_ADMITTED_REASON, format!("Cannot enforce AppArmor: {e}"))
        })
    }
}

/// Go's `%q` of a `*AppArmorProfile` (a struct pointer prints as `&{...}`).
fn go_profile(p: &AppArmorProfile) -> String {
    match &p.localhost_profile {
        Some(n) => format!("&{{{} {:?}}}", p.type_, n),
        None => format!("&{{{} <nil>}}", p.type_),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).expect("pod")
    }

    #[test]
    fn profiles_and_precedence() {
        let p = pod(serde_json::json!({
            "metadata": {"annotations": {"container.apparmor.security.beta.kubernetes.io/b": "localhost/prof"}},
            "spec": {"securityContext": {"appArmorProfile": {"type": "RuntimeDefault"}},
                     "containers": [
                        {"name": "a", "securityContext": {"appArmorProfile": {"type": "Unconfined"}}},
                        {"name": "b"}, {"name": "c"}]}
        }));
        let c = &podutil::containers(&p);
        assert_eq!(
            profile_for(&p, &c[0]).map(|p| p.type_),
            Some("Unconfined".into())
        );
        assert_eq!(
            profile_for(&p, &c[1]).and_then(|p| p.localhost_profile),
            Some("prof".into())
        );
        assert_eq!(
            profile_for(&p, &c[2]).map(|p| p.type_),
            Some("RuntimeDefault".into())
        );
    }

    #[test]
    fn refused_where_the_host_has_no_apparmor() {
        let adm = AppArmorAdmission::new(Err(AppArmorError::HostDisabled));
        let confined = pod(serde_json::json!({
            "spec": {"containers": [{"name": "a", "securityContext": {"appArmorProfile": {"type": "RuntimeDefault"}}}]},
            "status": {"phase": "Pending"}
        }));
        let e = adm.admit(&confined).expect_err("refused");
        assert_eq!(
            (e.reason.as_str(), e.message.as_str()),
            (
                "AppArmor",
                "Cannot enforce AppArmor: AppArmor is not enabled on the host"
            )
        );
        let unconfined = pod(serde_json::json!({
            "metadata": {"annotations": {"container.apparmor.security.beta.kubernetes.io/a": "unconfined"}},
            "spec": {"containers": [{"name": "a"}]},
            "status": {"phase": "Pending"}
        }));
        assert!(adm.admit(&unconfined).is_ok());
        let running = pod(serde_json::json!({
            "spec": {"containers": [{"name": "a", "securityContext": {"appArmorProfile": {"type": "RuntimeDefault"}}}]},
            "status": {"phase": "Running"}
        }));
        assert!(adm.admit(&running).is_ok());
    }

    #[test]
    fn host_detection_reads_securityfs_and_the_module() {
        let dir = tempfile::tempdir().expect("tmp");
        assert!(validate_host(dir.path()).is_err());
        std::fs::create_dir_all(dir.path().join("sys/kernel/security/apparmor")).expect("mk");
        std::fs::create_dir_all(dir.path().join("sys/module/apparmor/parameters")).expect("mk");
        std::fs::write(
            dir.path().join("sys/module/apparmor/parameters/enabled"),
            "Y\n",
        )
        .expect("w");
        assert!(validate_host(dir.path()).is_ok());
    }
}

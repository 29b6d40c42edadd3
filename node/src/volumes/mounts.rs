//! The CRI mounts of one container (kubelet's `makeMounts`): each
//! volumeMount becomes a bind of the volume (or of a safely bound subPath
//! of it) with readOnly, recursive read-only and mount propagation
//! translated. `/etc/hosts` and the termination-log mount are the pod
//! workers' to add.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, Pod, VolumeMount};
use keelson_cri::api::{Mount, MountPropagation};

use super::expand::expand_sub_path;
use super::plugins::blocking;
use super::subpath::{SubpathRequest, bind_sub_path, safe_make_dir, validate_sub_path};
use super::{VolumeError, VolumeManager, uid_of};

/// What building a container's mounts needs besides the pod.
#[derive(Debug, Clone, Copy, Default)]
pub struct MountOptions<'a> {
    /// The container's resolved environment, for `subPathExpr`.
    pub env: &'a [(String, String)],
    /// The runtime handler supports recursive read-only mounts (CRI
    /// `RuntimeHandlerFeatures.recursive_read_only`).
    pub runtime_supports_rro: bool,
}

/// kubelet's `translateMountPropagation`.
pub fn propagation(mode: Option<&str>) -> Result<MountPropagation, String> {
    match mode {
        None | Some("None") => Ok(MountPropagation::PropagationPrivate),
        Some("HostToContainer") => Ok(MountPropagation::PropagationHostToContainer),
        Some("Bidirectional") => Ok(MountPropagation::PropagationBidirectional),
        Some(other) => Err(format!("invalid MountPropagation mode: {other:?}")),
    }
}

/// kubelet's `resolveRecursiveReadOnly`.
pub fn recursive_read_only(m: &VolumeMount, runtime_supports: bool) -> Result<bool, String> {
    let mode = match m.recursive_read_only.as_deref() {
        None | Some("Disabled") => return Ok(false),
        Some(mode) => mode,
    };
    if m.read_only != Some(true) {
        return Err(format!(
            "volume {:?} requested recursive read-only mode, but it is not read-only",
            m.name
        ));
    }
    if let Some(p) = m.mount_propagation.as_deref().filter(|p| *p != "None") {
        return Err(format!(
            "volume {:?} requested recursive read-only mode, but it is not compatible with propagation {p:?}",
            m.name
        ));
    }
    match mode {
        "IfPossible" => Ok(runtime_supports),
        "Enabled" if runtime_supports => Ok(true),
        "Enabled" => Err(format!(
            "volume {:?} requested recursive read-only mode, but it is not supported by the runtime",
            m.name
        )),
        other => Err(format!("unknown recursive read-only mode {other:?}")),
    }
}

impl VolumeManager {
    /// The CRI mounts for `container` of `pod`, whose volumes must be set
    /// up ([`VolumeManager::setup_pod`] returned `Ok`). SubPaths are bound
    /// under `<pod>/volume-subpaths` now.
    pub async fn container_mounts(
        &self,
        pod: &Pod,
        container: &Container,
        opts: &MountOptions<'_>,
    ) -> Result<Vec<Mount>, VolumeError> {
        let uid = uid_of(pod).to_string();
        let Some(slot) = self.existing_slot(&uid) else {
            return Err(VolumeError::Mount(format!(
                "volumes of pod {} are not set up",
                super::pod_name(pod)
            )));
        };
        let mut st = slot.state.lock().await;
        let mut out = Vec::new();
        for (index, vm) in container.volume_mounts.iter().flatten().enumerate() {
            let Some(mounted) = st.mounted.get(&vm.name).cloned() else {
                return Err(VolumeError::Mount(format!(
                    "cannot find volume {:?} to mount into container {:?}",
                    vm.name, container.name
                )));
            };
            let mut host_path = mounted.path.clone();
            let sub_path = match vm.sub_path_expr.as_deref().filter(|e| !e.is_empty()) {
                Some(expr) => expand_sub_path(expr, opts.env).map_err(VolumeError::Mount)?,
                None => vm.sub_path.clone().unwrap_or_default(),
            };
            if !sub_path.is_empty() {
                validate_sub_path(&sub_path).map_err(VolumeError::Mount)?;
                host_path = self
                    .prepare_sub_path(
                        &uid,
                        &vm.name,
                        &container.name,
                        index,
                        &mounted.path,
                        &sub_path,
                    )
                    .await?;
            }
            let mut container_path = vm.mount_path.clone();
            if !container_path.starts_with('/') {
                container_path.insert(0, '/');
            }
            let propagation =
                propagation(vm.mount_propagation.as_deref()).map_err(VolumeError::Mount)?;
            let rro = recursive_read_only(vm, opts.runtime_supports_rro).map_err(|e| {
                VolumeError::Mount(format!("failed to resolve recursive read-only mode: {e}"))
            })?;
            let relabel = mounted.plugin.selinux_relabel() && !mounted.selinux_labeled;
            if relabel && let Some(m) = st.mounted.get_mut(&vm.name) {
                m.selinux_labeled = true;
            }
            out.push(Mount {
                container_path,
                host_path: host_path.to_string_lossy().into_owned(),
                readonly: vm.read_only == Some(true) || mounted.read_only,
                selinux_relabel: relabel,
                propagation: propagation as i32,
                recursive_read_only: rro,
                ..Mount::default()
            });
        }
        Ok(out)
    }

    async fn prepare_sub_path(
        &self,
        uid: &str,
        volume: &str,
        container: &str,
        index: usize,
        volume_path: &Path,
        sub_path: &str,
    ) -> Result<PathBuf, VolumeError> {
        let volume_path = volume_path.to_path_buf();
        let path = volume_path.join(sub_path);
        let target = self
            .inner
            .layout
            .subpath_target(uid, volume, container, index);
        let mounter = self.inner.mounter.clone();
        let sub = sub_path.to_string();
        let (v, c) = (volume.to_string(), container.to_string());
        blocking(move || {
            if std::fs::metadata(&path).is_err() {
                // Create it now with the volume's mode, so that a fsGroup
                // can write to it (kubelet does the same).
                use std::os::unix::fs::MetadataExt;
                let perm = std::fs::metadata(&volume_path)
                    .map(|m| m.mode() & 0o7777)
                    .map_err(|e| e.to_string())?;
                if let Err(e) = safe_make_dir(&sub, &volume_path, perm) {
                    tracing::error!(volume = %v, container = %c, error = %e, "failed to create subPath directory");
                    return Err(format!(
                        "failed to create subPath directory for volumeMount {v:?} of container {c:?}"
                    ));
                }
            }
            let req = SubpathRequest {
                volume_path: &volume_path,
                path: &path,
                target: &target,
            };
            bind_sub_path(mounter.as_ref(), &req).map_err(|e| {
                tracing::error!(volume = %v, container = %c, error = %e, "failed to prepare subPath");
                format!("failed to prepare subPath for volumeMount {v:?} of container {c:?}")
            })
        })
        .await
        .map_err(VolumeError::Mount)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn vm(ro: Option<bool>, rro: Option<&str>, prop: Option<&str>) -> VolumeMount {
        VolumeMount {
            name: "v".into(),
            mount_path: "/m".into(),
            read_only: ro,
            recursive_read_only: rro.map(String::from),
            mount_propagation: prop.map(String::from),
            ..Default::default()
        }
    }

    #[test]
    fn propagation_modes() {
        assert_eq!(propagation(None), Ok(MountPropagation::PropagationPrivate));
        assert_eq!(
            propagation(Some("None")),
            Ok(MountPropagation::PropagationPrivate)
        );
        assert_eq!(
            propagation(Some("HostToContainer")),
            Ok(MountPropagation::PropagationHostToContainer)
        );
        assert_eq!(
            propagation(Some("Bidirectional")),
            Ok(MountPropagation::PropagationBidirectional)
        );
        assert_eq!(
            propagation(Some("Sideways")).unwrap_err(),
            "invalid MountPropagation mode: \"Sideways\""
        );
    }

    #[test]
    fn recursive_read_only_rules() {
        assert_eq!(
            recursive_read_only(&vm(Some(true), None, None), true),
            Ok(false)
        );
        assert_eq!(
            recursive_read_only(&vm(Some(true), Some("IfPossible"), None), false),
            Ok(false)
        );
        assert_eq!(
            recursive_read_only(&vm(Some(true), Some("IfPossible"), None), true),
            Ok(true)
        );
        assert_eq!(
            recursive_read_only(&vm(Some(true), Some("Enabled"), None), true),
            Ok(true)
        );
        assert!(recursive_read_only(&vm(Some(true), Some("Enabled"), None), false).is_err());
        assert!(recursive_read_only(&vm(None, Some("Enabled"), None), true).is_err());
        assert!(
            recursive_read_only(
                &vm(Some(true), Some("Enabled"), Some("HostToContainer")),
                true
            )
            .is_err()
        );
    }
}

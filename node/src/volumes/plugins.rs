//! Setting up one volume of one pod, per volume type.

#[cfg(test)]
use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{Pod, Volume};

use super::atomic_writer::{AtomicWriter, Payload};
use super::claims::{BoundVolume, PvSource, VolumeMode};
use super::emptydir::{self, EmptyDir, Medium};
use super::ownership::{fs_group_from, set_volume_ownership};
use super::{Mounted, VolumeManager, hostpath, nested, ns_of, paths, payload, uid_of};

/// The volume types keelson sets up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plugin {
    /// emptyDir.
    EmptyDir,
    /// configMap.
    ConfigMap,
    /// secret.
    Secret,
    /// downwardAPI.
    DownwardApi,
    /// projected.
    Projected,
    /// hostPath (inline, or a hostPath PersistentVolume).
    HostPath,
    /// A `local` PersistentVolume.
    LocalVolume,
    /// A `csi` volume: inline (ephemeral lifecycle) or a CSI
    /// PersistentVolume (persistent lifecycle).
    Csi,
}

impl Plugin {
    /// The plugin for a pod volume, or why keelson cannot set it up.
    pub fn of(v: &Volume) -> Result<Plugin, String> {
        if v.empty_dir.is_some() {
            return Ok(Plugin::EmptyDir);
        }
        if v.config_map.is_some() {
            return Ok(Plugin::ConfigMap);
        }
        if v.secret.is_some() {
            return Ok(Plugin::Secret);
        }
        if v.downward_api.is_some() {
            return Ok(Plugin::DownwardApi);
        }
        if v.projected.is_some() {
            return Ok(Plugin::Projected);
        }
        if v.host_path.is_some() {
            return Ok(Plugin::HostPath);
        }
        if v.csi.is_some() {
            return Ok(Plugin::Csi);
        }
        Err(format!(
            "keelson cannot set up {} volumes (supported: emptyDir, configMap, secret, downwardAPI, projected, hostPath, csi)",
            source_kind(v)
        ))
    }

    /// The plugin for a claim-backed volume, from its bound PV's source,
    /// or why keelson cannot set it up. This is where PV source types plug
    /// in: a source gets a `Plugin` variant here and its setup in
    /// `setup_volume`.
    pub fn of_pv(bound: &BoundVolume) -> Result<Plugin, String> {
        let plugin = match &bound.source {
            PvSource::HostPath(_) => Plugin::HostPath,
            PvSource::Local(_) => Plugin::LocalVolume,
            PvSource::Csi(_) => Plugin::Csi,
            other => {
                return Err(format!(
                    "keelson cannot set up {} persistent volumes (supported: hostPath, local, csi)",
                    other.kind()
                ));
            }
        };
        if bound.mode == VolumeMode::Block {
            return Err(format!(
                "keelson cannot map raw block volumes (volumeMode: Block, volumeDevices); PV {} is {} with volumeMode Block",
                bound.pv_name,
                bound.source.kind()
            ));
        }
        Ok(plugin)
    }

    /// Directory name under `<pod>/volumes` (none for hostPath).
    pub fn dir(self) -> Option<&'static str> {
        match self {
            Plugin::EmptyDir => Some(paths::EMPTY_DIR),
            Plugin::ConfigMap => Some(paths::CONFIG_MAP),
            Plugin::Secret => Some(paths::SECRET),
            Plugin::DownwardApi => Some(paths::DOWNWARD_API),
            Plugin::Projected => Some(paths::PROJECTED),
            Plugin::HostPath => None,
            Plugin::LocalVolume => Some(paths::LOCAL_VOLUME),
            Plugin::Csi => Some(super::csi::CSI_DIR),
        }
    }

    /// kubelet's plugin name (metrics).
    pub fn full_name(self) -> &'static str {
        match self {
            Plugin::EmptyDir => "kubernetes.io/empty-dir",
            Plugin::ConfigMap => "kubernetes.io/configmap",
            Plugin::Secret => "kubernetes.io/secret",
            Plugin::DownwardApi => "kubernetes.io/downward-api",
            Plugin::Projected => "kubernetes.io/projected",
            Plugin::HostPath => "kubernetes.io/host-path",
            Plugin::LocalVolume => "kubernetes.io/local-volume",
            Plugin::Csi => crate::csi::PLUGIN_NAME,
        }
    }

    /// Content that follows API objects is rewritten on every sync.
    pub fn requires_remount(self) -> bool {
        matches!(
            self,
            Plugin::ConfigMap | Plugin::Secret | Plugin::DownwardApi | Plugin::Projected
        )
    }

    /// The runtime may relabel it for SELinux (kubelet's `SELinuxRelabel`).
    pub fn selinux_relabel(self) -> bool {
        !matches!(self, Plugin::HostPath)
    }
}

/// The API name of a volume's source, for messages.
fn source_kind(v: &Volume) -> String {
    let value = serde_json::to_value(v).unwrap_or_default();
    value
        .as_object()
        .and_then(|o| o.keys().find(|k| k.as_str() != "name").cloned())
        .unwrap_or_else(|| "unknown".to_string())
}

/// Names of the volumes some container (init, regular, ephemeral) mounts;
/// kubelet sets up only those.
pub fn used_volumes(pod: &Pod) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let Some(spec) = pod.spec.as_ref() else {
        return out;
    };
    for c in spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
    {
        for m in c.volume_mounts.iter().flatten() {
            out.insert(m.name.clone());
        }
        for d in c.volume_devices.iter().flatten() {
            out.insert(d.name.clone());
        }
    }
    for c in spec.ephemeral_containers.iter().flatten() {
        for m in c.volume_mounts.iter().flatten() {
            out.insert(m.name.clone());
        }
    }
    out
}

/// Runs blocking filesystem work off the async threads.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| format!("volume setup task failed: {e}"))?
}

/// Where and how an atomically written volume lives.
struct AtomicTarget {
    plugin: Plugin,
    medium: Medium,
}

/// A claim-backed volume's PV and, for an attached CSI volume, the
/// VolumeAttachment's publish context.
pub(super) struct Claimed<'a> {
    pub(super) bound: &'a BoundVolume,
    pub(super) publish_context: std::collections::HashMap<String, String>,
}

impl VolumeManager {
    pub(super) async fn setup_volume(
        &self,
        pod: &Pod,
        vol: &Volume,
        plugin: Plugin,
        claimed: Option<Claimed<'_>>,
        was_mounted: bool,
        warned: &mut BTreeSet<String>,
    ) -> Result<Mounted, String> {
        let ns = ns_of(pod);
        let bound = claimed.as_ref().map(|c| c.bound);
        match plugin {
            Plugin::EmptyDir => self.setup_empty_dir(pod, vol).await,
            Plugin::Csi => match claimed {
                Some(c) => self.setup_pv_csi(pod, c.bound, c.publish_context).await,
                None => self.setup_inline_csi(pod, vol).await,
            },
            Plugin::HostPath => {
                // The same checks for a hostPath PV as for an inline
                // hostPath (pkg/volume/hostpath/host_path.go serves both);
                // a PV's volume is read-only when the pod's claim says so.
                let (hp, read_only) = match bound.map(|b| (&b.source, b.read_only)) {
                    Some((PvSource::HostPath(hp), ro)) => (hp.clone(), ro),
                    _ => (vol.host_path.clone().unwrap_or_default(), false),
                };
                let path = hp.path.clone();
                blocking(move || hostpath::check_type(&hp.path, hp.type_.as_deref())).await?;
                Ok(Mounted {
                    plugin,
                    path: PathBuf::from(path),
                    read_only,
                    selinux_labeled: false,
                })
            }
            Plugin::LocalVolume => match bound {
                Some(b) => self.setup_local(pod, b).await,
                None => Err("a local volume needs a PersistentVolume".to_string()),
            },
            Plugin::ConfigMap => {
                let src = vol.config_map.clone().unwrap_or_default();
                let optional = src.optional == Some(true);
                let cm = match self.inner.config_maps.get(ns, &src.name).await {
                    Ok(cm) => Some(cm),
                    Err(e) if e.is_not_found() && optional => None,
                    Err(e) => return Err(e.to_string()),
                };
                let payload = payload::config_map(
                    src.items.as_deref(),
                    cm.as_deref(),
                    src.default_mode.unwrap_or(payload::DEFAULT_MODE),
                    optional,
                )?;
                let t = AtomicTarget {
                    plugin,
                    medium: Medium::Default,
                };
                self.write_atomic(pod, &vol.name, t, payload, was_mounted)
                    .await
            }
            Plugin::Secret => {
                let src = vol.secret.clone().unwrap_or_default();
                let optional = src.optional == Some(true);
                let name = src.secret_name.clone().unwrap_or_default();
                let secret = match self.inner.secrets.get(ns, &name).await {
                    Ok(s) => Some(s),
                    Err(e) if e.is_not_found() && optional => None,
                    Err(e) => return Err(e.to_string()),
                };
                let payload = payload::secret(
                    src.items.as_deref(),
                    secret.as_deref(),
                    src.default_mode.unwrap_or(payload::DEFAULT_MODE),
                    optional,
                )?;
                let t = AtomicTarget {
                    plugin,
                    medium: Medium::Memory,
                };
                self.write_atomic(pod, &vol.name, t, payload, was_mounted)
                    .await
            }
            Plugin::DownwardApi => {
                let src = vol.downward_api.clone().unwrap_or_default();
                let payload = payload::downward_api(
                    src.items.as_deref().unwrap_or_default(),
                    pod,
                    &(self.inner.allocatable)(),
                    src.default_mode.unwrap_or(payload::DEFAULT_MODE),
                )?;
                let t = AtomicTarget {
                    plugin,
                    medium: Medium::Memory,
                };
                self.write_atomic(pod, &vol.name, t, payload, was_mounted)
                    .await
            }
            Plugin::Projected => {
                let src = vol.projected.clone().unwrap_or_default();
                let payload = self.collect_projected(pod, &vol.name, &src, warned).await?;
                let t = AtomicTarget {
                    plugin,
                    medium: Medium::Memory,
                };
                self.write_atomic(pod, &vol.name, t, payload, was_mounted)
                    .await
            }
        }
    }

    async fn setup_empty_dir(&self, pod: &Pod, vol: &Volume) -> Result<Mounted, String> {
        let src = vol.empty_dir.clone().unwrap_or_default();
        let medium = Medium::parse(src.medium.as_deref())?;
        let size = match medium {
            Medium::Memory => emptydir::memory_size_limit(
                pod,
                src.size_limit.as_ref(),
                &(self.inner.allocatable)(),
            ),
            _ => None,
        };
        let page = match medium {
            Medium::HugePages(_) => Some(emptydir::page_size(&medium, pod)?),
            _ => None,
        };
        let uid = uid_of(pod);
        let dir = self
            .inner
            .layout
            .volume_dir(uid, paths::EMPTY_DIR, &vol.name);
        let meta = self.inner.layout.empty_dir_meta(uid, &vol.name);
        let mounter = self.inner.mounter.clone();
        let fs_group = fs_group_from(pod);
        let path = dir.clone();
        blocking(move || {
            emptydir::set_up(
                mounter.as_ref(),
                &EmptyDir {
                    dir: &dir,
                    meta_dir: &meta,
                    medium,
                    size_bytes: size,
                    page_size: page,
                    fs_group,
                },
            )
            .map_err(|e| e.to_string())
        })
        .await?;
        Ok(Mounted {
            plugin: Plugin::EmptyDir,
            path,
            read_only: false,
            selinux_labeled: false,
        })
    }

    /// Sets up the wrapper directory (tmpfs for secrets and projected
    /// volumes) and projects `payload` into it atomically.
    async fn write_atomic(
        &self,
        pod: &Pod,
        name: &str,
        target: AtomicTarget,
        payload: Payload,
        was_mounted: bool,
    ) -> Result<Mounted, String> {
        let uid = uid_of(pod);
        let Some(plugin_dir) = target.plugin.dir() else {
            return Err("volume type has no directory".to_string());
        };
        let dir = self.inner.layout.volume_dir(uid, plugin_dir, name);
        let meta = self.inner.layout.empty_dir_meta(uid, name);
        let size = match target.medium {
            Medium::Memory => emptydir::memory_size_limit(pod, None, &(self.inner.allocatable)()),
            _ => None,
        };
        let fs_group = fs_group_from(pod);
        let mounter = self.inner.mounter.clone();
        let pod_copy = pod.clone();
        let volume = name.to_string();
        let context = format!("pod {} volume {name}", super::pod_name(pod));
        let path = dir.clone();
        blocking(move || {
            emptydir::set_up(
                mounter.as_ref(),
                &EmptyDir {
                    dir: &dir,
                    meta_dir: &meta,
                    medium: target.medium,
                    size_bytes: size,
                    page_size: None,
                    fs_group,
                },
            )
            .map_err(|e| e.to_string())?;
            let written = nested::make_nested_mount_points(&volume, &dir, &pod_copy).and_then(|()| {
                let writer = AtomicWriter::new(&dir, context).map_err(|e| e.to_string())?;
                let perms_dir = dir.clone();
                // First writes create files outside the timestamped
                // directory too: the whole volume gets the group.
                let set_perms = move |_: &str| set_volume_ownership(&perms_dir, fs_group, true);
                writer
                    .write(&payload, Some(&set_perms))
                    .map_err(|e| e.to_string())
            });
            match written {
                Ok(_) => Ok(()),
                Err(e) => {
                    if !was_mounted
                        && let Err(te) = emptydir::tear_down(mounter.as_ref(), &dir, &meta)
                    {
                        tracing::error!(dir = %dir.display(), error = %te, "cleaning up a failed volume setup");
                    }
                    Err(e)
                }
            }
        })
        .await?;
        Ok(Mounted {
            plugin: target.plugin,
            path,
            read_only: true,
            selinux_labeled: false,
        })
    }
}

/// The kinds of a pod's volumes.
#[cfg(test)]
fn kinds(pod: &Pod) -> BTreeMap<String, Result<Plugin, String>> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .map(|v| (v.name.clone(), Plugin::of(v)))
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn classification_and_used_volumes() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "spec": {
                "containers": [{"name": "c", "volumeMounts": [
                    {"name": "a", "mountPath": "/a"}, {"name": "pvc", "mountPath": "/p"}
                ]}],
                "volumes": [
                    {"name": "a", "emptyDir": {}},
                    {"name": "unused", "configMap": {"name": "x"}},
                    {"name": "pvc", "persistentVolumeClaim": {"claimName": "c"}}
                ]
            }
        }))
        .unwrap();
        let used = used_volumes(&pod);
        assert_eq!(used.into_iter().collect::<Vec<_>>(), ["a", "pvc"]);
        let k = kinds(&pod);
        assert_eq!(k["a"], Ok(Plugin::EmptyDir));
        assert_eq!(
            k["pvc"].clone().unwrap_err(),
            "keelson cannot set up persistentVolumeClaim volumes (supported: emptyDir, configMap, secret, downwardAPI, projected, hostPath, csi)"
        );
    }
}

//! The volume manager as the volume statistics' lister (kubelet's
//! `ListVolumesForPod` over its actual state of the world): the node's
//! pods and, per pod, its mounted volumes with the source of their
//! figures as each kubelet plugin's `MetricsProvider` gives it —
//! `NewMetricsDu` for emptyDir, configMap, secret, downwardAPI and
//! projected, `NewMetricsStatFS` for local PVs, `NewMetricsCsi` for CSI
//! volumes (`pkg/volume/csi/csi_plugin.go`: the volume handle and the
//! publish directory), `MetricsNil` (nothing) for hostPath.

use futures::future::BoxFuture;

use k8s_openapi::api::core::v1::{Pod, Volume};

use crate::stats::types::PvcReference;
use crate::stats::volume_stats::{
    MetricsSource, PodVolume, PodVolumeLister, is_local_ephemeral_volume,
};

use super::plugins::Plugin;
use super::{Mounted, VolumeManager, lock, ns_of};

/// The `pvcRef` of a pod volume (`volume_stat_calculator.go`): the claim
/// of a `persistentVolumeClaim` volume, `<pod>-<volume>` for a generic
/// `ephemeral` one.
fn pvc_ref_of(pod: &Pod, v: &Volume) -> Option<PvcReference> {
    let (name, _, _) = super::claims::claim_of(pod, v)?;
    Some(PvcReference {
        name,
        namespace: ns_of(pod).to_string(),
    })
}

/// The entry of volume `v` of `pod`, mounted as `m`; `None` when its
/// plugin reports no figures.
fn entry(pod: &Pod, v: &Volume, m: &Mounted) -> Option<PodVolume> {
    Some(PodVolume {
        name: v.name.clone(),
        pvc_ref: pvc_ref_of(pod, v),
        local_ephemeral: is_local_ephemeral_volume(v),
        source: source_of(m)?,
    })
}

/// The figures' source of a volume mounted by `plugin` (`None`: the
/// plugin reports none).
fn source_of(m: &Mounted) -> Option<MetricsSource> {
    match m.plugin {
        Plugin::EmptyDir
        | Plugin::ConfigMap
        | Plugin::Secret
        | Plugin::DownwardApi
        | Plugin::Projected => Some(MetricsSource::Du(m.path.clone())),
        Plugin::LocalVolume => Some(MetricsSource::Statfs(m.path.clone())),
        Plugin::HostPath => None,
        Plugin::Csi => {
            let (driver, volume_id) = super::csi_data::stats_identity(&m.path)?;
            Some(MetricsSource::Csi {
                driver,
                volume_id,
                target_path: m.path.clone(),
            })
        }
    }
}

impl PodVolumeLister for VolumeManager {
    fn pods(&self) -> Vec<String> {
        lock(&self.inner.pods)
            .iter()
            .filter(|(_, slot)| *lock(&slot.registered))
            .map(|(uid, _)| uid.clone())
            .collect()
    }

    fn volumes<'a>(&'a self, uid: &'a str) -> BoxFuture<'a, Vec<PodVolume>> {
        Box::pin(async move {
            let Some(slot) = lock(&self.inner.pods).get(uid).cloned() else {
                return Vec::new();
            };
            let pod = lock(&slot.pod).clone();
            let mounted = slot.state.lock().await.mounted.clone();
            pod.spec
                .iter()
                .flat_map(|s| s.volumes.iter().flatten())
                .filter_map(|v| entry(&pod, v, mounted.get(&v.name)?))
                .collect()
        })
    }
}

/// The volumes of some pods as found on disk under the node's root
/// directory, for a process that is not the node role (`keelson
/// diagnose`): a pod volume whose plugin directory exists is taken as
/// mounted (a claim's as a `local` PV or a CSI volume, whichever is
/// there).
pub struct OnDisk {
    layout: super::Layout,
    pods: Vec<std::sync::Arc<Pod>>,
}

impl OnDisk {
    /// The volumes of `pods` under `root_dir`.
    pub fn new(root_dir: std::path::PathBuf, pods: Vec<std::sync::Arc<Pod>>) -> OnDisk {
        OnDisk {
            layout: super::Layout::new(root_dir),
            pods,
        }
    }

    fn mounted(&self, uid: &str, pod: &Pod, v: &Volume) -> Option<Mounted> {
        let candidates = match Plugin::of(v) {
            Ok(p) => vec![p],
            Err(_) if super::claims::claim_of(pod, v).is_some() => {
                vec![Plugin::LocalVolume, Plugin::Csi]
            }
            Err(_) => return None,
        };
        candidates.into_iter().find_map(|plugin| {
            let dir = self.layout.volume_dir(uid, plugin.dir()?, &v.name);
            let path = if plugin == Plugin::Csi {
                dir.join("mount")
            } else {
                dir
            };
            path.exists().then_some(Mounted {
                plugin,
                path,
                read_only: false,
                selinux_labeled: false,
            })
        })
    }
}

impl PodVolumeLister for OnDisk {
    fn pods(&self) -> Vec<String> {
        self.pods
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .collect()
    }

    fn volumes<'a>(&'a self, uid: &'a str) -> BoxFuture<'a, Vec<PodVolume>> {
        Box::pin(async move {
            let Some(pod) = self
                .pods
                .iter()
                .find(|p| p.metadata.uid.as_deref() == Some(uid))
            else {
                return Vec::new();
            };
            pod.spec
                .iter()
                .flat_map(|s| s.volumes.iter().flatten())
                .filter_map(|v| entry(pod, v, &self.mounted(uid, pod, v)?))
                .collect()
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn mounted(plugin: Plugin, path: &str) -> Mounted {
        Mounted {
            plugin,
            path: PathBuf::from(path),
            read_only: false,
            selinux_labeled: false,
        }
    }

    fn pod(spec_volumes: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-0", "namespace": "ns", "uid": "u1"},
            "spec": {"containers": [], "volumes": spec_volumes},
        }))
        .unwrap()
    }

    #[test]
    fn pvc_refs_name_the_claim() {
        let p = pod(serde_json::json!([
            {"name": "data", "persistentVolumeClaim": {"claimName": "db"}},
            {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
            {"name": "d", "emptyDir": {}},
        ]));
        let vols = p.spec.as_ref().unwrap().volumes.clone().unwrap();
        let refs: Vec<_> = vols.iter().map(|v| pvc_ref_of(&p, v)).collect();
        let r = |n: &str| {
            Some(PvcReference {
                name: n.into(),
                namespace: "ns".into(),
            })
        };
        assert_eq!(refs, [r("db"), r("web-0-scratch"), None]);
    }

    #[tokio::test]
    async fn on_disk_lists_the_volumes_whose_directories_exist() {
        let root = tempfile::tempdir().unwrap();
        let p = pod(serde_json::json!([
            {"name": "scratch", "emptyDir": {}},
            {"name": "cfg", "configMap": {"name": "c"}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "db"}},
            {"name": "host", "hostPath": {"path": "/"}},
        ]));
        let vols = root.path().join("pods/u1/volumes");
        std::fs::create_dir_all(vols.join("kubernetes.io~empty-dir/scratch")).unwrap();
        std::fs::create_dir_all(vols.join("kubernetes.io~local-volume/data")).unwrap();
        let lister = OnDisk::new(root.path().to_path_buf(), vec![std::sync::Arc::new(p)]);
        assert_eq!(lister.pods(), ["u1"]);
        let got = lister.volumes("u1").await;
        assert_eq!(
            got,
            [
                PodVolume {
                    name: "scratch".into(),
                    pvc_ref: None,
                    local_ephemeral: true,
                    source: MetricsSource::Du(vols.join("kubernetes.io~empty-dir/scratch")),
                },
                PodVolume {
                    name: "data".into(),
                    pvc_ref: Some(PvcReference {
                        name: "db".into(),
                        namespace: "ns".into()
                    }),
                    local_ephemeral: false,
                    source: MetricsSource::Statfs(vols.join("kubernetes.io~local-volume/data")),
                },
            ]
        );
        assert!(lister.volumes("other").await.is_empty());
    }

    #[test]
    fn each_plugin_has_kubelets_metrics_provider() {
        for p in [
            Plugin::EmptyDir,
            Plugin::ConfigMap,
            Plugin::Secret,
            Plugin::DownwardApi,
            Plugin::Projected,
        ] {
            assert_eq!(
                source_of(&mounted(p, "/v")),
                Some(MetricsSource::Du("/v".into())),
                "{p:?}"
            );
        }
        assert_eq!(
            source_of(&mounted(Plugin::LocalVolume, "/l")),
            Some(MetricsSource::Statfs("/l".into()))
        );
        assert_eq!(source_of(&mounted(Plugin::HostPath, "/h")), None);
        // A CSI volume without its vol_data.json has no identity.
        assert_eq!(source_of(&mounted(Plugin::Csi, "/nowhere/mount")), None);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("vol_data.json"),
            r#"{"driverName":"hostpath.csi.k8s.io","volumeHandle":"csi-abc"}"#,
        )
        .unwrap();
        let mount = dir.path().join("mount");
        assert_eq!(
            source_of(&Mounted {
                path: mount.clone(),
                ..mounted(Plugin::Csi, "")
            }),
            Some(MetricsSource::Csi {
                driver: "hostpath.csi.k8s.io".into(),
                volume_id: "csi-abc".into(),
                target_path: mount,
            })
        );
    }
}

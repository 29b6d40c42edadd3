//! The volume manager as the volume statistics' lister (kubelet's
//! `ListVolumesForPod` over its actual state of the world): the node's
//! pods and, per pod, its mounted volumes with the source of their
//! figures as each kubelet plugin's `MetricsProvider` gives it —
//! `NewMetricsDu` for emptyDir, configMap, secret, downwardAPI and
//! projected, `NewMetricsStatFS` for local PVs, `NewMetricsCsi` for CSI
//! volumes (`pkg/volume/csi/csi_plugin.go`: the volume handle and the
//! publish directory), `MetricsNil` (nothing) for hostPath.

use futures::future::BoxFuture;

use crate::stats::volume_stats::{
    MetricsSource, PodVolume, PodVolumeLister, is_local_ephemeral_volume, pvc_ref_of,
};

use super::plugins::Plugin;
use super::{Mounted, VolumeManager, lock, ns_of};

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
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            let ns = ns_of(&pod);
            pod.spec
                .iter()
                .flat_map(|s| s.volumes.iter().flatten())
                .filter_map(|v| {
                    let source = source_of(mounted.get(&v.name)?)?;
                    Some(PodVolume {
                        name: v.name.clone(),
                        pvc_ref: pvc_ref_of(name, ns, v),
                        local_ephemeral: is_local_ephemeral_volume(v),
                        source,
                    })
                })
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

//! Pod volume statistics as kubelet v1.36 computes them: each pod gets a
//! calculator that measures its mounted volumes every
//! `volumeStatsAggPeriod` (jittered) in the background, and
//! `/stats/summary` and the `kubelet_volume_stats_*` metrics read the
//! latest result, never measuring on a request.
//!
//! Upstream:
//! - `pkg/kubelet/server/stats/fs_resource_analyzer.go`: every period the
//!   pods the node knows get a calculator (started at once), the ones gone
//!   are stopped and their figures forgotten; a non-positive period
//!   disables the whole thing.
//! - `pkg/kubelet/server/stats/volume_stat_calculator.go`: a pod's
//!   calculator runs `wait.JitterUntil(period, 1.0, sliding)` (so one to
//!   two periods between the end of a measurement and the next); it lists
//!   the pod's mounted volumes (none listed: the previous figures stay),
//!   measures each (a volume whose measurement fails is left out), adds
//!   `pvcRef` for `persistentVolumeClaim` (the claim) and generic
//!   `ephemeral` volumes (`<pod>-<volume>`), fills all six figures (0 when
//!   the source gave none) and splits the list in local ephemeral volumes
//!   (`util.IsLocalEphemeralVolume`: gitRepo, default-medium emptyDir,
//!   configMap), which count in the pod's `ephemeral-storage`, and the
//!   others.
//! - The figures per plugin ([`MetricsSource`]): `pkg/volume/metrics_du.go`
//!   (emptyDir, configMap, secret, projected, downwardAPI),
//!   `metrics_statfs.go` (local PVs), `pkg/volume/csi/csi_metrics.go` and
//!   `csi_client.go` `NodeGetVolumeStats` (CSI volumes); hostPath and
//!   gitRepo have `MetricsNil`: no entry at all.
//! - `volumeHealthStats` and the `VolumeConditionAbnormal` event need the
//!   `CSIVolumeHealth` feature gate, alpha and off by default in v1.36;
//!   keelson has no feature gates (a `featureGates` setting is refused),
//!   so, like a default kubelet, it reports neither.
//! - kubelet wraps the du of configMap, secret, projected and downwardAPI
//!   volumes in `NewCachedMetrics` (measured once per mounter); its
//!   reconciler makes a new mounter at every remount of these volumes,
//!   which happens at every pod sync (`syncFrequency`, one minute), so
//!   keelson measures them at every calculation like emptyDirs.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Volume;
use prometheus::{HistogramOpts, HistogramVec, Registry};
use rand::Rng;
use tokio_util::sync::CancellationToken;

use super::disk::du;
use super::types::{FsStats, PvcReference, VolumeStats, rfc3339};

/// Where a volume's figures come from (kubelet's `MetricsProvider` of the
/// volume's plugin).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricsSource {
    /// `NewMetricsDu`: used bytes and inodes walked like `du`, capacity,
    /// available and inodes from statfs of the same path.
    Du(PathBuf),
    /// `NewMetricsStatFS`: every figure from statfs of the path.
    Statfs(PathBuf),
    /// `NewMetricsCsi`: the driver's `NodeGetVolumeStats` for the volume
    /// published at `target_path`, when the driver has `GET_VOLUME_STATS`.
    Csi {
        /// The CSI driver's name.
        driver: String,
        /// The volume handle.
        volume_id: String,
        /// Where the volume is published for the pod.
        target_path: PathBuf,
    },
}

/// One mounted volume of a pod that has figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodVolume {
    /// The volume's name in the pod spec.
    pub name: String,
    /// The claim behind it.
    pub pvc_ref: Option<PvcReference>,
    /// It counts in the pod's `ephemeral-storage`.
    pub local_ephemeral: bool,
    /// Where its figures come from.
    pub source: MetricsSource,
}

/// The pods the node knows and their mounted volumes (kubelet's
/// `Provider.GetPods` and `ListVolumesForPod`); the volume manager.
pub trait PodVolumeLister: Send + Sync + 'static {
    /// UIDs of the node's pods.
    fn pods(&self) -> Vec<String>;
    /// The mounted volumes of pod `uid` that have figures (hostPath has
    /// none); empty when none is mounted.
    fn volumes<'a>(&'a self, uid: &'a str) -> BoxFuture<'a, Vec<PodVolume>>;
}

/// kubelet's `util.IsLocalEphemeralVolume`: the volume's usage counts in
/// the pod's `ephemeral-storage`.
pub fn is_local_ephemeral_volume(v: &Volume) -> bool {
    v.git_repo.is_some()
        || v.empty_dir
            .as_ref()
            .is_some_and(|e| e.medium.as_deref().unwrap_or_default().is_empty())
        || v.config_map.is_some()
}

/// A pod's volume figures (kubelet's `PodVolumeStats`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodVolumeStats {
    /// Local ephemeral volumes.
    pub ephemeral: Vec<VolumeStats>,
    /// The others (claims, secrets, projected, CSI, ...).
    pub persistent: Vec<VolumeStats>,
}

/// What one source reports (kubelet's `volume.Metrics`); `None` is a
/// figure the source does not give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metrics {
    /// When the measurement started.
    pub time: SystemTime,
    /// Available bytes.
    pub available: Option<u64>,
    /// Capacity in bytes.
    pub capacity: Option<u64>,
    /// Used bytes.
    pub used: Option<u64>,
    /// Inodes.
    pub inodes: Option<u64>,
    /// Free inodes.
    pub inodes_free: Option<u64>,
    /// Used inodes.
    pub inodes_used: Option<u64>,
}

impl Metrics {
    fn at(time: SystemTime) -> Metrics {
        Metrics {
            time,
            available: None,
            capacity: None,
            used: None,
            inodes: None,
            inodes_free: None,
            inodes_used: None,
        }
    }
}

/// `parsePodVolumeStats`: every figure present, 0 when the source had none.
pub fn volume_stats(name: &str, pvc_ref: Option<PvcReference>, m: &Metrics) -> VolumeStats {
    let v = |x: Option<u64>| Some(x.unwrap_or(0));
    VolumeStats {
        fs: FsStats {
            time: rfc3339(m.time),
            available_bytes: v(m.available),
            capacity_bytes: v(m.capacity),
            used_bytes: v(m.used),
            inodes_free: v(m.inodes_free),
            inodes: v(m.inodes),
            inodes_used: v(m.inodes_used),
        },
        name: name.to_string(),
        pvc_ref,
        volume_health_stats: None,
    }
}

/// `fs.Info`: statfs(2) of `path`, in its block size: (available,
/// capacity, used, inodes, free inodes, used inodes).
fn fs_info(path: &Path) -> Result<[u64; 6], String> {
    let s = nix::sys::statfs::statfs(path)
        .map_err(|e| format!("failed to get FsInfo due to error {e}"))?;
    // The field types differ between architectures.
    #[allow(clippy::useless_conversion, clippy::unnecessary_cast)]
    let (bsize, blocks, bfree, bavail, files, ffree) = (
        s.block_size() as u64,
        s.blocks() as u64,
        s.blocks_free() as u64,
        s.blocks_available() as u64,
        s.files() as u64,
        s.files_free() as u64,
    );
    Ok([
        bavail.saturating_mul(bsize),
        blocks.saturating_mul(bsize),
        blocks.saturating_sub(bfree).saturating_mul(bsize),
        files,
        ffree,
        files.saturating_sub(ffree),
    ])
}

/// `metricsDu.GetMetrics` (blocking).
pub fn measure_du(path: &Path) -> Result<Metrics, String> {
    let mut m = Metrics::at(SystemTime::now());
    let usage = du(path).ok_or_else(|| format!("{}: cannot be walked", path.display()))?;
    m.used = Some(usage.used_bytes);
    m.inodes_used = Some(usage.inodes_used);
    let [available, capacity, _, inodes, free, _] = fs_info(path)?;
    m.available = Some(available);
    m.capacity = Some(capacity);
    m.inodes = Some(inodes);
    m.inodes_free = Some(free);
    Ok(m)
}

/// `metricsStatFS.GetMetrics` (blocking).
pub fn measure_statfs(path: &Path) -> Result<Metrics, String> {
    let mut m = Metrics::at(SystemTime::now());
    let [available, capacity, used, inodes, free, inodes_used] = fs_info(path)?;
    m.available = Some(available);
    m.capacity = Some(capacity);
    m.used = Some(used);
    m.inodes = Some(inodes);
    m.inodes_free = Some(free);
    m.inodes_used = Some(inodes_used);
    Ok(m)
}

/// Why a volume has no figures this time.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Skip {
    /// The source does not report (a driver without `GET_VOLUME_STATS`):
    /// silent, as kubelet's `IsNotSupported`.
    NotSupported,
    /// The measurement failed (logged).
    Failed(String),
}

/// `NodeGetVolumeStats` folded into [`Metrics`] as `csi_client.go` does:
/// all figures 0 unless a usage entry gives them, an answer without usage
/// is an error (without the CSIVolumeHealth gate), the `i64`s converted
/// as Go's `uint64()` does.
pub(crate) fn csi_metrics(
    time: SystemTime,
    stats: &crate::csi::client::VolumeStats,
) -> Result<Metrics, String> {
    if stats.bytes.is_none() && stats.inodes.is_none() && !stats.any_usage {
        return Err("failed to get usage from response. usage is nil".to_string());
    }
    // Go's uint64(int64): two's complement, as kubelet converts.
    #[allow(clippy::cast_sign_loss)]
    let u = |v: i64| Some(v as u64);
    let mut m = Metrics::at(time);
    m.available = Some(0);
    m.capacity = Some(0);
    m.used = Some(0);
    m.inodes = Some(0);
    m.inodes_free = Some(0);
    m.inodes_used = Some(0);
    if let Some(b) = stats.bytes {
        m.available = u(b.available);
        m.capacity = u(b.total);
        m.used = u(b.used);
    }
    if let Some(i) = stats.inodes {
        m.inodes_free = u(i.available);
        m.inodes = u(i.total);
        m.inodes_used = u(i.used);
    }
    Ok(m)
}

struct Inner {
    period: Duration,
    csi: Option<crate::csi::Csi>,
    latest: Mutex<HashMap<String, PodVolumeStats>>,
    /// Running calculators by pod UID.
    running: Mutex<HashMap<String, CancellationToken>>,
    /// `kubelet_volume_metric_collection_duration_seconds`.
    duration: Option<HistogramVec>,
}

/// The pods' volume figures, measured in the background (kubelet's
/// `fsResourceAnalyzer`); shared.
#[derive(Clone)]
pub struct VolumeStatsCalculator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for VolumeStatsCalculator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeStatsCalculator")
            .field("period", &self.inner.period)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl VolumeStatsCalculator {
    /// A calculator measuring every `period` (`volumeStatsAggPeriod`),
    /// CSI volumes through `csi`'s drivers, its duration histogram in
    /// `registry`.
    pub fn new(
        period: Duration,
        csi: Option<crate::csi::Csi>,
        registry: Option<&Registry>,
    ) -> VolumeStatsCalculator {
        let duration = registry.and_then(|r| {
            let h = HistogramVec::new(
                HistogramOpts::new(
                    "kubelet_volume_metric_collection_duration_seconds",
                    "[ALPHA] Duration in seconds to calculate volume stats",
                ),
                &["metric_source"],
            )
            .ok()?;
            keelson_common::observability::metrics::register(r, h.clone());
            Some(h)
        });
        VolumeStatsCalculator {
            inner: Arc::new(Inner {
                period,
                csi,
                latest: Mutex::new(HashMap::new()),
                running: Mutex::new(HashMap::new()),
                duration,
            }),
        }
    }

    /// The latest figures of pod `uid` (`GetPodVolumeStats`); `None` before
    /// its first measurement that found volumes.
    pub fn get(&self, uid: &str) -> Option<PodVolumeStats> {
        lock(&self.inner.latest).get(uid).cloned()
    }

    /// `fsResourceAnalyzer.Start`: every period, calculators for the new
    /// pods of `lister` (each measuring at once, then every one to two
    /// periods) and none for the pods gone; until `stop`.
    pub async fn run(self, lister: Arc<dyn PodVolumeLister>, stop: CancellationToken) {
        if self.inner.period.is_zero() {
            tracing::info!("Volume stats collection disabled");
            return;
        }
        loop {
            self.update_calculators(&lister, &stop);
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(self.inner.period) => {}
            }
        }
        for (_, token) in lock(&self.inner.running).drain() {
            token.cancel();
        }
    }

    /// `updateCachedPodVolumeStats`.
    fn update_calculators(&self, lister: &Arc<dyn PodVolumeLister>, stop: &CancellationToken) {
        let pods: HashSet<String> = lister.pods().into_iter().collect();
        let mut running = lock(&self.inner.running);
        running.retain(|uid, token| {
            let keep = pods.contains(uid);
            if !keep {
                token.cancel();
                lock(&self.inner.latest).remove(uid);
            }
            keep
        });
        for uid in pods {
            if running.contains_key(&uid) {
                continue;
            }
            let token = stop.child_token();
            running.insert(uid.clone(), token.clone());
            let (this, lister) = (self.clone(), lister.clone());
            tokio::spawn(async move {
                loop {
                    let stats = tokio::select! {
                        _ = token.cancelled() => return,
                        s = this.measure_pod(lister.as_ref(), &uid) => s,
                    };
                    if let Some(stats) = stats {
                        // Under the lock the analyzer stops calculators
                        // with: a stopped pod's figures never come back.
                        let _running = lock(&this.inner.running);
                        if token.is_cancelled() {
                            return;
                        }
                        lock(&this.inner.latest).insert(uid.clone(), stats);
                    }
                    // JitterUntil(period, 1.0): period + up to one period.
                    let jitter = this.inner.period.mul_f64(rand::rng().random::<f64>());
                    tokio::select! {
                        _ = token.cancelled() => return,
                        _ = tokio::time::sleep(this.inner.period + jitter) => {}
                    }
                }
            });
        }
    }

    /// `calcAndStoreStats` for pod `uid`: measures its mounted volumes
    /// and keeps the result (nothing mounted: the previous one stays).
    pub async fn calculate(&self, lister: &dyn PodVolumeLister, uid: &str) {
        if let Some(stats) = self.measure_pod(lister, uid).await {
            lock(&self.inner.latest).insert(uid.to_string(), stats);
        }
    }

    /// The figures of pod `uid`'s mounted volumes; `None` when none is.
    async fn measure_pod(&self, lister: &dyn PodVolumeLister, uid: &str) -> Option<PodVolumeStats> {
        let volumes = lister.volumes(uid).await;
        if volumes.is_empty() {
            return None;
        }
        let mut out = PodVolumeStats::default();
        for v in volumes {
            let m = match self.measure(&v.source).await {
                Ok(m) => m,
                Err(Skip::NotSupported) => continue,
                Err(Skip::Failed(e)) => {
                    tracing::debug!(pod_uid = %uid, volume = %v.name, error = %e, "Failed to calculate volume metrics");
                    continue;
                }
            };
            let s = volume_stats(&v.name, v.pvc_ref, &m);
            if v.local_ephemeral {
                out.ephemeral.push(s);
            } else {
                out.persistent.push(s);
            }
        }
        Some(out)
    }

    fn observe(&self, source: &str, since: std::time::Instant) {
        if let Some(h) = &self.inner.duration {
            h.with_label_values(&[source])
                .observe(since.elapsed().as_secs_f64());
        }
    }

    async fn measure(&self, source: &MetricsSource) -> Result<Metrics, Skip> {
        let started = std::time::Instant::now();
        match source {
            MetricsSource::Du(path) => {
                let path = path.clone();
                let r = tokio::task::spawn_blocking(move || measure_du(&path))
                    .await
                    .map_err(|e| Skip::Failed(e.to_string()))?;
                // kubelet times the walk as `du` (no quota monitoring).
                self.observe("du", started);
                r.map_err(Skip::Failed)
            }
            MetricsSource::Statfs(path) => {
                let path = path.clone();
                let r = tokio::task::spawn_blocking(move || measure_statfs(&path))
                    .await
                    .map_err(|e| Skip::Failed(e.to_string()))?;
                self.observe("statfs", started);
                r.map_err(Skip::Failed)
            }
            MetricsSource::Csi {
                driver,
                volume_id,
                target_path,
            } => {
                let r = self.measure_csi(driver, volume_id, target_path).await;
                self.observe(driver, started);
                r
            }
        }
    }

    /// `metricsCsi.GetMetrics`: the driver's capabilities, then
    /// `NodeGetVolumeStats`, both within the CSI timeout.
    async fn measure_csi(
        &self,
        driver: &str,
        volume_id: &str,
        target: &Path,
    ) -> Result<Metrics, Skip> {
        let time = SystemTime::now();
        let csi = self
            .inner
            .csi
            .as_ref()
            .ok_or_else(|| Skip::Failed("CSI is not enabled on this node".to_string()))?;
        let client = csi.client(driver).map_err(Skip::Failed)?;
        let caps = client
            .node_get_capabilities()
            .await
            .map_err(|e| Skip::Failed(e.to_string()))?;
        if !caps.volume_stats {
            return Err(Skip::NotSupported);
        }
        if volume_id.is_empty() {
            return Err(Skip::Failed("missing volume id".to_string()));
        }
        let stats = client
            .node_get_volume_stats(volume_id, target)
            .await
            .map_err(|e| Skip::Failed(e.to_string()))?;
        csi_metrics(time, &stats).map_err(Skip::Failed)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::csi::client::{Usage, VolumeStats as CsiStats};

    fn vol(json: serde_json::Value) -> Volume {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn local_ephemeral_volumes_are_upstreams() {
        for (v, want) in [
            (serde_json::json!({"name": "a", "emptyDir": {}}), true),
            (
                serde_json::json!({"name": "a", "emptyDir": {"medium": ""}}),
                true,
            ),
            (
                serde_json::json!({"name": "a", "emptyDir": {"medium": "Memory"}}),
                false,
            ),
            (
                serde_json::json!({"name": "a", "configMap": {"name": "c"}}),
                true,
            ),
            (
                serde_json::json!({"name": "a", "gitRepo": {"repository": "r"}}),
                true,
            ),
            (
                serde_json::json!({"name": "a", "secret": {"secretName": "s"}}),
                false,
            ),
            (serde_json::json!({"name": "a", "downwardAPI": {}}), false),
            (serde_json::json!({"name": "a", "projected": {}}), false),
            (
                serde_json::json!({"name": "a", "persistentVolumeClaim": {"claimName": "c"}}),
                false,
            ),
        ] {
            assert_eq!(is_local_ephemeral_volume(&vol(v.clone())), want, "{v}");
        }
    }

    #[test]
    fn every_figure_is_reported_zero_when_missing() {
        let mut m = Metrics::at(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000));
        m.used = Some(4096);
        let s = volume_stats("v", None, &m);
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "time": "2023-11-14T22:13:20Z",
                "availableBytes": 0, "capacityBytes": 0, "usedBytes": 4096,
                "inodesFree": 0, "inodes": 0, "inodesUsed": 0,
                "name": "v",
            })
        );
        let s = volume_stats(
            "v",
            Some(PvcReference {
                name: "c".into(),
                namespace: "n".into(),
            }),
            &m,
        );
        assert_eq!(
            serde_json::to_value(&s).unwrap()["pvcRef"],
            serde_json::json!({"name": "c", "namespace": "n"})
        );
    }

    #[test]
    fn du_and_statfs_figures() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), vec![7u8; 256 * 1024]).unwrap();
        let d = measure_du(dir.path()).unwrap();
        assert!(d.used.unwrap() >= 256 * 1024, "{d:?}");
        assert_eq!(d.inodes_used, Some(2));
        let s = measure_statfs(dir.path()).unwrap();
        // statfs reports the whole filesystem: its used figure includes
        // the file, capacity and inodes are the filesystem's as du's.
        assert_eq!(s.capacity, d.capacity);
        assert_eq!(s.inodes, d.inodes);
        assert!(s.used.unwrap() >= 256 * 1024);
        assert_eq!(
            s.inodes_used,
            Some(s.inodes.unwrap() - s.inodes_free.unwrap())
        );
        assert!(measure_du(&dir.path().join("missing")).is_err());
        assert!(measure_statfs(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn csi_answers_map_as_kubelets_client() {
        let t = SystemTime::UNIX_EPOCH;
        let stats = CsiStats {
            bytes: Some(Usage {
                available: 70,
                total: 100,
                used: 30,
            }),
            inodes: None,
            any_usage: true,
            abnormal: None,
        };
        let m = csi_metrics(t, &stats).unwrap();
        assert_eq!(
            (m.available, m.capacity, m.used),
            (Some(70), Some(100), Some(30))
        );
        assert_eq!(
            (m.inodes, m.inodes_free, m.inodes_used),
            (Some(0), Some(0), Some(0))
        );
        let negative = CsiStats {
            bytes: Some(Usage {
                available: -1,
                total: 0,
                used: 0,
            }),
            ..stats.clone()
        };
        assert_eq!(csi_metrics(t, &negative).unwrap().available, Some(u64::MAX));
        let none = CsiStats::default();
        assert_eq!(
            csi_metrics(t, &none).unwrap_err(),
            "failed to get usage from response. usage is nil"
        );
        // Usage entries of unknown units only: all figures 0.
        let unknown = CsiStats {
            any_usage: true,
            ..CsiStats::default()
        };
        assert_eq!(csi_metrics(t, &unknown).unwrap().capacity, Some(0));
    }

    /// A pod UID and its mounted volumes.
    type Entry = (String, Vec<PodVolume>);

    /// A lister of the pods and volumes a test sets.
    #[derive(Clone, Default)]
    struct Fixed(Arc<Mutex<Vec<Entry>>>);

    impl Fixed {
        fn of(entries: Vec<Entry>) -> Fixed {
            Fixed(Arc::new(Mutex::new(entries)))
        }
    }

    impl PodVolumeLister for Fixed {
        fn pods(&self) -> Vec<String> {
            lock(&self.0).iter().map(|(u, _)| u.clone()).collect()
        }
        fn volumes<'a>(&'a self, uid: &'a str) -> BoxFuture<'a, Vec<PodVolume>> {
            let v = lock(&self.0)
                .iter()
                .find(|(u, _)| u == uid)
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            Box::pin(async move { v })
        }
    }

    #[tokio::test]
    async fn a_calculation_splits_ephemeral_and_persistent_and_skips_failures() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("scratch")).unwrap();
        std::fs::write(dir.path().join("scratch/f"), vec![1u8; 8192]).unwrap();
        std::fs::create_dir(dir.path().join("pv")).unwrap();
        let claim = PvcReference {
            name: "data".into(),
            namespace: "ns".into(),
        };
        let lister = Fixed::of(vec![(
            "u1".into(),
            vec![
                PodVolume {
                    name: "scratch".into(),
                    pvc_ref: None,
                    local_ephemeral: true,
                    source: MetricsSource::Du(dir.path().join("scratch")),
                },
                PodVolume {
                    name: "data".into(),
                    pvc_ref: Some(claim.clone()),
                    local_ephemeral: false,
                    source: MetricsSource::Statfs(dir.path().join("pv")),
                },
                PodVolume {
                    name: "gone".into(),
                    pvc_ref: None,
                    local_ephemeral: true,
                    source: MetricsSource::Du(dir.path().join("missing")),
                },
                PodVolume {
                    name: "csi".into(),
                    pvc_ref: None,
                    local_ephemeral: false,
                    source: MetricsSource::Csi {
                        driver: "d".into(),
                        volume_id: "v".into(),
                        target_path: dir.path().join("csi"),
                    },
                },
            ],
        )]);
        let registry = Registry::new();
        let c = VolumeStatsCalculator::new(Duration::from_secs(60), None, Some(&registry));
        assert_eq!(c.get("u1"), None);
        c.calculate(&lister, "u1").await;
        let got = c.get("u1").unwrap();
        let names = |l: &[VolumeStats]| l.iter().map(|v| v.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&got.ephemeral), ["scratch"]);
        assert_eq!(names(&got.persistent), ["data"]);
        assert!(got.ephemeral[0].fs.used_bytes.unwrap() >= 8192);
        assert_eq!(got.persistent[0].pvc_ref, Some(claim));
        let text = keelson_common::observability::metrics::render(&registry);
        assert!(
            text.contains(
                "kubelet_volume_metric_collection_duration_seconds_count{metric_source=\"du\"} 2"
            ),
            "{text}"
        );
        assert!(text.contains("metric_source=\"statfs\"} 1"), "{text}");
        // Nothing mounted any more: the previous figures stay.
        let empty = Fixed::of(vec![("u1".into(), vec![])]);
        c.calculate(&empty, "u1").await;
        assert_eq!(c.get("u1"), Some(got));
    }

    #[tokio::test(start_paused = true)]
    async fn calculators_follow_the_pods_and_the_period() {
        let dir = tempfile::tempdir().unwrap();
        let one = |uid: &str| {
            (
                uid.to_string(),
                vec![PodVolume {
                    name: "scratch".into(),
                    pvc_ref: None,
                    local_ephemeral: true,
                    source: MetricsSource::Du(dir.path().to_path_buf()),
                }],
            )
        };
        let pods = Fixed::of(vec![one("a")]);
        let period = Duration::from_secs(60);
        let c = VolumeStatsCalculator::new(period, None, None);
        let stop = CancellationToken::new();
        let task = tokio::spawn(c.clone().run(Arc::new(pods.clone()), stop.clone()));
        let wait = |uid: &'static str, present: bool| {
            let c = c.clone();
            async move {
                for _ in 0..10_000 {
                    if c.get(uid).is_some() == present {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                panic!("{uid} present={present} not reached");
            }
        };
        // A pod known at start is measured at once.
        wait("a", true).await;
        // A new pod gets its calculator at the analyzer's next round, at
        // most one period later.
        lock(&pods.0).push(one("b"));
        let before = tokio::time::Instant::now();
        wait("b", true).await;
        assert!(before.elapsed() <= period + Duration::from_secs(1));
        // A pod gone: its figures go at the next round.
        lock(&pods.0).retain(|(u, _)| u != "a");
        wait("a", false).await;
        assert!(c.get("b").is_some());
        stop.cancel();
        task.await.unwrap();
    }
}

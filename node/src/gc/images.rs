//! Image garbage collection, as kubelet's image GC manager does it:
//! - images are detected every 5 minutes (and at every collection): when
//!   first seen, when last used by any container (running or not), size,
//!   pinned;
//! - every 5 minutes, images unused for longer than `imageMaximumGCAge` are
//!   removed (once keelson has run that long), then, if the image
//!   filesystem is used at `imageGCHighThresholdPercent` or more, unused
//!   images — least recently used first, never younger than
//!   `imageMinimumGCAge`, never pinned — are removed until usage is down to
//!   `imageGCLowThresholdPercent` (`FreeDiskSpaceFailed` when not enough
//!   could be freed);
//! - the eviction manager removes every unused image when reclaiming disk.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::error::{Errors, GcError};
use keelson_cri::{RuntimeClient, api, image_spec};
use prometheus::{IntCounterVec, Opts, Registry};
use tokio::time::Instant;

use keelson_common::events::{EventRecorder, EventType, node_ref};
use keelson_common::observability::metrics::register;

/// Period of the collection (kubelet's `ImageGCPeriod`).
pub const IMAGE_GC_PERIOD: Duration = Duration::from_secs(300);
/// Period of image detection.
pub const DETECT_PERIOD: Duration = Duration::from_secs(300);

/// The image GC policy (KubeletConfiguration's image GC fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageGcPolicy {
    /// `imageGCHighThresholdPercent`.
    pub high_threshold_percent: i32,
    /// `imageGCLowThresholdPercent`.
    pub low_threshold_percent: i32,
    /// `imageMinimumGCAge`.
    pub min_age: Duration,
    /// `imageMaximumGCAge` (zero: off).
    pub max_age: Duration,
}

/// Image filesystem capacity and availability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageFsUsage {
    /// Total bytes.
    pub capacity: u64,
    /// Available bytes.
    pub available: u64,
}

#[derive(Debug, Clone)]
struct ImageRecord {
    first_detected: Instant,
    /// `None`: never seen in use (kubelet's zero time: oldest of all).
    last_used: Option<Instant>,
    size: u64,
    pinned: bool,
}

/// `kubelet_image_garbage_collected_total{reason}`.
#[derive(Debug, Clone)]
pub struct ImageGcMetrics {
    /// Images removed, by reason (`age`, `space`).
    pub collected: IntCounterVec,
}

impl ImageGcMetrics {
    /// Registered metrics.
    pub fn new(registry: &Registry) -> ImageGcMetrics {
        let m = Self::unregistered();
        register(registry, m.collected.clone());
        m
    }

    /// Metrics without a registry. The name is a constant, so creation cannot fail.
    pub fn unregistered() -> ImageGcMetrics {
        ImageGcMetrics {
            collected: IntCounterVec::new(
                Opts::new(
                    "kubelet_image_garbage_collected_total",
                    "Total number of images garbage collected by the kubelet, whether through disk usage or image age.",
                ),
                &["reason"],
            )
            .expect("constant metric name is valid"),
        }
    }
}

/// The image garbage collector; cheap to clone.
#[derive(Clone)]
pub struct ImageGc {
    cri: RuntimeClient,
    policy: ImageGcPolicy,
    records: Arc<Mutex<BTreeMap<String, ImageRecord>>>,
    recorder: Option<EventRecorder>,
    node_name: String,
    metrics: ImageGcMetrics,
}

impl std::fmt::Debug for ImageGc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageGc")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// statvfs of the image filesystem CRI names.
pub async fn image_fs_usage(cri: &RuntimeClient) -> Result<ImageFsUsage, GcError> {
    let info = cri.image_fs_info().await?;
    let mount = info
        .image_filesystems
        .iter()
        .find_map(|f| f.fs_id.as_ref().map(|id| id.mountpoint.clone()))
        .filter(|m| !m.is_empty())
        .ok_or(GcError::NoImageFs)?;
    let s = nix::sys::statvfs::statvfs(Path::new(&mount)).map_err(|error| GcError::Statvfs {
        mount: mount.clone(),
        error,
    })?;
    let frsize = s.fragment_size() as u64;
    Ok(ImageFsUsage {
        capacity: frsize.saturating_mul(s.blocks() as u64),
        available: frsize.saturating_mul(s.blocks_available() as u64),
    })
}

/// An image eligible for removal.
#[derive(Debug, Clone)]
struct Candidate {
    id: String,
    record: ImageRecord,
}

impl ImageGc {
    /// A collector.
    pub fn new(
        cri: RuntimeClient,
        policy: ImageGcPolicy,
        recorder: Option<EventRecorder>,
        node_name: &str,
        metrics: ImageGcMetrics,
    ) -> ImageGc {
        ImageGc {
            cri,
            policy,
            records: Arc::new(Mutex::new(BTreeMap::new())),
            recorder,
            node_name: node_name.to_string(),
            metrics,
        }
    }

    fn records(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, ImageRecord>> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn warn(&self, reason: &str, message: &str) {
        if let Some(r) = &self.recorder {
            r.event(
                &node_ref(&self.node_name),
                EventType::Warning,
                reason,
                message,
            );
        }
    }

    /// kubelet's `detectImages`: records images; returns the ids in use.
    pub async fn detect_images(&self, detect_time: Instant) -> Result<HashSet<String>, GcError> {
        let images = self.cri.list_images(None).await?;
        let containers = self.cri.list_containers(None).await?;
        let mut in_use = HashSet::new();
        for c in &containers {
            // image_ref is the image id for containerd; image.image may be a tag.
            for r in [&c.image_ref, &c.image_id] {
                if !r.is_empty() {
                    in_use.insert(r.clone());
                }
            }
            if let Some(spec) = &c.image
                && !spec.image.is_empty()
            {
                in_use.insert(spec.image.clone());
            }
        }
        let used = |img: &api::Image| {
            in_use.contains(&img.id)
                || img.repo_tags.iter().any(|t| in_use.contains(t))
                || img.repo_digests.iter().any(|d| in_use.contains(d))
        };
        let now = Instant::now();
        let mut records = self.records();
        let mut current = HashSet::new();
        let mut in_use_ids = HashSet::new();
        for img in &images {
            current.insert(img.id.clone());
            let r = records.entry(img.id.clone()).or_insert(ImageRecord {
                first_detected: detect_time,
                last_used: None,
                size: 0,
                pinned: false,
            });
            if used(img) {
                r.last_used = Some(now);
                in_use_ids.insert(img.id.clone());
            }
            r.size = img.size;
            r.pinned = img.pinned;
        }
        records.retain(|id, _| current.contains(id));
        Ok(in_use_ids)
    }

    /// kubelet's `imagesInEvictionOrder`: unused, unpinned images, least
    /// recently used first (ties: first detected first).
    async fn images_in_eviction_order(
        &self,
        free_time: Instant,
    ) -> Result<Vec<Candidate>, GcError> {
        let in_use = self.detect_images(free_time).await?;
        let records = self.records();
        let mut out: Vec<Candidate> = records
            .iter()
            .filter(|(id, r)| !in_use.contains(*id) && !r.pinned)
            .map(|(id, r)| Candidate {
                id: id.clone(),
                record: r.clone(),
            })
            .collect();
        out.sort_by(|a, b| {
            a.record
                .last_used
                .cmp(&b.record.last_used)
                .then(a.record.first_detected.cmp(&b.record.first_detected))
        });
        Ok(out)
    }

    async fn free_image(&self, c: &Candidate, reason: &str) -> Result<(), GcError> {
        tracing::info!(image_id = %c.id, size = c.record.size, "removing image to free bytes");
        self.cri.remove_image(image_spec(&c.id)).await?;
        self.records().remove(&c.id);
        self.metrics.collected.with_label_values(&[reason]).inc();
        Ok(())
    }

    /// kubelet's `freeSpace`: frees up to `bytes_to_free`; returns bytes freed.
    async fn free_space(
        &self,
        bytes_to_free: u64,
        free_time: Instant,
        images: &[Candidate],
    ) -> (u64, Result<(), GcError>) {
        let mut freed = 0u64;
        let mut errors = Vec::new();
        for c in images {
            if c.record.last_used.is_some_and(|t| t >= free_time) {
                continue;
            }
            if free_time.saturating_duration_since(c.record.first_detected) < self.policy.min_age {
                tracing::debug!(image_id = %c.id, "image is younger than the minimum GC age");
                continue;
            }
            if let Err(e) = self.free_image(c, "space").await {
                errors.push(e);
                continue;
            }
            freed = freed.saturating_add(c.record.size);
            if freed >= bytes_to_free {
                break;
            }
        }
        let result = if errors.is_empty() {
            Ok(())
        } else {
            Err(GcError::FreeSpace {
                wanted: bytes_to_free,
                freed,
                errors: Errors(errors),
            })
        };
        (freed, result)
    }

    /// kubelet's `freeOldImages`: images unused for longer than `imageMaximumGCAge`.
    async fn free_old_images(
        &self,
        images: Vec<Candidate>,
        free_time: Instant,
        began: Instant,
    ) -> Result<Vec<Candidate>, GcError> {
        if self.policy.max_age.is_zero()
            || free_time.saturating_duration_since(began) <= self.policy.max_age
        {
            return Ok(images);
        }
        let mut remaining = Vec::new();
        let mut errors = Vec::new();
        for c in images {
            let last = c.record.last_used.unwrap_or(c.record.first_detected);
            let unused_for = match c.record.last_used {
                Some(_) => free_time.saturating_duration_since(last),
                // Never used: older than any age.
                None => Duration::MAX,
            };
            if unused_for > self.policy.max_age {
                if let Err(e) = self.free_image(&c, "age").await {
                    errors.push(e);
                    remaining.push(c);
                }
                continue;
            }
            remaining.push(c);
        }
        if errors.is_empty() {
            Ok(remaining)
        } else {
            Err(GcError::FreeOldImages {
                max_age: self.policy.max_age,
                errors: Errors(errors),
            })
        }
    }

    /// kubelet's `GarbageCollect`, with the filesystem figures given.
    pub async fn garbage_collect_with(
        &self,
        began: Instant,
        fs: ImageFsUsage,
    ) -> Result<(), GcError> {
        let free_time = Instant::now();
        let images = self.images_in_eviction_order(free_time).await?;
        let images = self.free_old_images(images, free_time, began).await?;
        let capacity = fs.capacity;
        let available = fs.available.min(capacity);
        if capacity == 0 {
            let e = GcError::ZeroCapacity;
            self.warn("InvalidDiskCapacity", &e.to_string());
            return Err(e);
        }
        let usage_percent = 100 - (u128::from(available) * 100 / u128::from(capacity)) as i64;
        if usage_percent >= i64::from(self.policy.high_threshold_percent) {
            let low = u128::from(capacity)
                * u128::try_from(100 - self.policy.low_threshold_percent).unwrap_or(0)
                / 100;
            let to_free =
                u64::try_from(low.saturating_sub(u128::from(available))).unwrap_or(u64::MAX);
            tracing::info!(
                usage = usage_percent,
                high_threshold = self.policy.high_threshold_percent,
                amount_to_free = to_free,
                low_threshold = self.policy.low_threshold_percent,
                "disk usage on image filesystem is over the high threshold, trying to free bytes down to the low threshold"
            );
            let (freed, result) = self.free_space(to_free, free_time, &images).await;
            result?;
            if freed < to_free {
                let e = GcError::NotEnoughFreed {
                    wanted: to_free,
                    freed,
                };
                self.warn("FreeDiskSpaceFailed", &e.to_string());
                return Err(e);
            }
        }
        Ok(())
    }

    /// kubelet's `GarbageCollect`.
    pub async fn garbage_collect(&self, began: Instant) -> Result<(), GcError> {
        let fs = image_fs_usage(&self.cri).await?;
        self.garbage_collect_with(began, fs).await
    }

    /// kubelet's `DeleteUnusedImages` (eviction's disk reclaim).
    pub async fn delete_unused_images(&self) -> Result<(), GcError> {
        tracing::info!("attempting to delete unused images");
        let free_time = Instant::now();
        let images = self.images_in_eviction_order(free_time).await?;
        self.free_space(u64::MAX, free_time, &images).await.1
    }
}

//! emptyDir volumes, and the directory every configMap, secret,
//! downwardAPI and projected volume is "wrapped" on (kubelet builds those
//! on an emptyDir: secrets and projected volumes on tmpfs, the others on
//! disk).
//!
//! - default medium: a directory with mode 0777 on the node's disk;
//! - `Memory`: a tmpfs mounted on that directory, `size=` the smallest of
//!   the volume's `sizeLimit`, the pod's memory limit and the node's
//!   allocatable memory (kubelet's SizeMemoryBackedVolumes);
//! - `HugePages` / `HugePages-<size>`: hugetlbfs with the pod's page size.
//!
//! A `ready` marker under `<pod>/plugins/kubernetes.io~empty-dir/<volume>`
//! records a finished setup (kept across keelson restarts); teardown
//! unmounts whatever filesystem is mounted on the directory and removes it.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use super::mounter::{Mounter, mount_at};
use super::ownership::set_volume_ownership;
use super::removal::remove_all_one_filesystem;
use keelson_common::quantity::Quantity;

const PERM: u32 = 0o777;
const READY: &str = "ready";

/// Storage medium of an emptyDir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Medium {
    /// The node's disk.
    Default,
    /// tmpfs.
    Memory,
    /// hugetlbfs; `Some(size)` for `HugePages-<size>`.
    HugePages(Option<String>),
}

impl Medium {
    /// Parses `emptyDir.medium`.
    pub fn parse(medium: Option<&str>) -> Result<Medium, String> {
        match medium.unwrap_or("") {
            "" => Ok(Medium::Default),
            "Memory" => Ok(Medium::Memory),
            "HugePages" => Ok(Medium::HugePages(None)),
            m => match m.strip_prefix("HugePages-") {
                Some(size) if Quantity::parse(size).is_ok() => {
                    Ok(Medium::HugePages(Some(size.to_string())))
                }
                _ => Err(format!("unknown storage medium {m:?}")),
            },
        }
    }

    fn name(&self) -> String {
        match self {
            Medium::Default => String::new(),
            Medium::Memory => "Memory".into(),
            Medium::HugePages(None) => "HugePages".into(),
            Medium::HugePages(Some(s)) => format!("HugePages-{s}"),
        }
    }
}

/// Everything one emptyDir setup needs.
#[derive(Debug)]
pub struct EmptyDir<'a> {
    /// The volume directory.
    pub dir: &'a Path,
    /// Directory of the `ready` marker.
    pub meta_dir: &'a Path,
    /// Medium.
    pub medium: Medium,
    /// `size=` for tmpfs, in bytes.
    pub size_bytes: Option<u64>,
    /// `pagesize=` for hugetlbfs.
    pub page_size: Option<String>,
    /// `fsGroup` applied on setup.
    pub fs_group: Option<u32>,
}

/// Sets up the directory (idempotent; the `ready` marker short-cuts).
pub fn set_up(mounter: &dyn Mounter, v: &EmptyDir<'_>) -> io::Result<()> {
    let ready = v.meta_dir.join(READY);
    let mounted = mount_at(&mounter.mount_points()?, v.dir).map(|m| m.fstype.clone());
    if ready.exists() {
        match (&v.medium, mounted.as_deref()) {
            (Medium::Memory, Some("tmpfs")) | (Medium::HugePages(_), Some("hugetlbfs")) => {
                return Ok(());
            }
            (Medium::Default, _) if v.dir.is_dir() => return Ok(()),
            _ => {
                tracing::warn!(dir = %v.dir.display(), "volume ready marker present but the volume is not; setting it up again");
                let _ = std::fs::remove_dir_all(v.meta_dir);
            }
        }
    }
    setup_dir(v.dir)?;
    match &v.medium {
        Medium::Default => {}
        Medium::Memory => {
            if mounted.as_deref() != Some("tmpfs") {
                let mut options: Vec<String> = v
                    .size_bytes
                    .filter(|s| *s > 0)
                    .map(|s| vec![format!("size={s}")])
                    .unwrap_or_default();
                if noswap_supported(mounter, v.meta_dir) {
                    options.push("noswap".to_string());
                }
                mounter.mount_fs("tmpfs", v.dir, "tmpfs", &options)?;
            }
        }
        Medium::HugePages(_) => {
            if mounted.as_deref() != Some("hugetlbfs") {
                let Some(page) = &v.page_size else {
                    return Err(io::Error::other(
                        "hugePages storage requested, but the page size is unknown",
                    ));
                };
                mounter.mount_fs("nodev", v.dir, "hugetlbfs", &[format!("pagesize={page}")])?;
            }
        }
    }
    set_volume_ownership(v.dir, v.fs_group, false)?;
    std::fs::create_dir_all(v.meta_dir)?;
    std::fs::write(&ready, b"")?;
    Ok(())
}

/// Whether tmpfs takes `noswap` (kernel 6.4+; older kernels are asked
/// once with a test mount), as kubelet checks before mounting memory-backed
/// volumes: their content must never reach swap.
fn noswap_supported(mounter: &dyn Mounter, near: &Path) -> bool {
    static SUPPORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        if kernel_at_least(6, 4) {
            return true;
        }
        // Probe beside the volume's metadata (never in the volume itself).
        let base = near.parent().unwrap_or(near);
        let probe = base.join(format!("tmpfs-noswap-test-{}", std::process::id()));
        if std::fs::create_dir_all(&probe).is_err() {
            return false;
        }
        let ok = mounter
            .mount_fs("tmpfs", &probe, "tmpfs", &["noswap".to_string()])
            .is_ok();
        if ok && let Err(e) = mounter.unmount(&probe) {
            tracing::warn!(dir = %probe.display(), error = %e, "could not unmount the tmpfs noswap probe");
            return ok;
        }
        let _ = std::fs::remove_dir(&probe);
        ok
    })
}

/// True when the running kernel's release is at least `major.minor`.
fn kernel_at_least(major: u32, minor: u32) -> bool {
    let Ok(uts) = nix::sys::utsname::uname() else {
        return false;
    };
    let release = uts.release().to_string_lossy().into_owned();
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (ma, mi) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (ma, mi) >= (major, minor)
}

/// Creates `dir` with mode 0777 whatever the umask.
fn setup_dir(dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mode = std::fs::symlink_metadata(dir)?.permissions().mode() & 0o7777;
    if mode & 0o777 != PERM {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(PERM))?;
    }
    Ok(())
}

/// Tears down: removes the ready marker, unmounts a tmpfs/hugetlbfs
/// mounted on `dir`, removes `dir` (never reaching through a mount).
pub fn tear_down(mounter: &dyn Mounter, dir: &Path, meta_dir: &Path) -> io::Result<()> {
    match std::fs::remove_dir_all(meta_dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(io::Error::other(format!(
                "failed to remove ready dir [{}]: {e}",
                meta_dir.display()
            )));
        }
    }
    if std::fs::symlink_metadata(dir).is_err() {
        return Ok(());
    }
    if let Some(m) = mount_at(&mounter.mount_points()?, dir)
        && matches!(m.fstype.as_str(), "tmpfs" | "hugetlbfs")
    {
        mounter.unmount(dir)?;
    }
    remove_all_one_filesystem(mounter, dir)
}

/// tmpfs size for a memory-backed emptyDir: the node's allocatable memory,
/// lowered to the pod's memory limit and then to the volume's `sizeLimit`
/// when those are positive and smaller.
pub fn memory_size_limit(
    pod: &Pod,
    size_limit: Option<&ApiQuantity>,
    allocatable: &BTreeMap<String, ApiQuantity>,
) -> Option<u64> {
    let parse = |q: &ApiQuantity| Quantity::parse(&q.0).ok().map(|q| q.value());
    let mut size = allocatable.get("memory").and_then(parse).filter(|v| *v > 0);
    if let Some(limit) = pod_memory_limit(pod)
        && limit > 0
        && size.is_none_or(|s| limit <= s)
    {
        size = Some(limit);
    }
    if let Some(limit) = size_limit.and_then(parse)
        && limit > 0
        && size.is_none_or(|s| limit <= s)
    {
        size = Some(limit);
    }
    size.and_then(|s| u64::try_from(s).ok())
}

/// The pod's memory limit as its cgroup gets it: set only when every
/// container (init included) declares one; regular containers and sidecars
/// add up, a plain init container counts with the sidecars started before
/// it, the larger wins, plus the pod's overhead.
pub fn pod_memory_limit(pod: &Pod) -> Option<i128> {
    let spec = pod.spec.as_ref()?;
    let limit = |c: &k8s_openapi::api::core::v1::Container| -> Option<i128> {
        let q = c.resources.as_ref()?.limits.as_ref()?.get("memory")?;
        let v = Quantity::parse(&q.0).ok()?.value();
        (v > 0).then_some(v)
    };
    let mut sidecars = 0i128;
    let mut init_peak = 0i128;
    for c in spec.init_containers.iter().flatten() {
        let l = limit(c)?;
        if c.restart_policy.as_deref() == Some("Always") {
            sidecars += l;
        } else {
            init_peak = init_peak.max(sidecars + l);
        }
    }
    let mut regular = 0i128;
    for c in &spec.containers {
        regular += limit(c)?;
    }
    let overhead = spec
        .overhead
        .as_ref()
        .and_then(|o| o.get("memory"))
        .and_then(|q| Quantity::parse(&q.0).ok())
        .map(|q| q.value())
        .unwrap_or(0);
    Some((regular + sidecars).max(init_peak) + overhead)
}

/// `pagesize=` value for a hugePages medium, from the pod's hugepage
/// requests (kubelet's `getPageSizeMountOption`).
pub fn page_size(medium: &Medium, pod: &Pod) -> Result<String, String> {
    let spec = pod.spec.as_ref();
    let mut found: Option<(String, Quantity)> = None;
    let wanted = match medium {
        Medium::HugePages(Some(s)) => Quantity::parse(s).ok(),
        _ => None,
    };
    let containers = spec.into_iter().flat_map(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
    });
    for c in containers {
        let requests = c.resources.as_ref().and_then(|r| r.requests.as_ref());
        for name in requests.into_iter().flat_map(|r| r.keys()) {
            let Some(size) = name.strip_prefix("hugepages-") else {
                continue;
            };
            let Ok(q) = Quantity::parse(size) else {
                return Err(format!("unable to parse hugepage size {size:?}"));
            };
            match wanted {
                None => {
                    if let Some((_, prev)) = &found
                        && *prev != q
                    {
                        return Err(format!(
                            "medium: {} can't be used if container requests multiple huge page sizes",
                            medium.name()
                        ));
                    }
                    found = Some((size.to_string(), q));
                }
                Some(w) if w == q => found = Some((size.to_string(), q)),
                Some(_) => {}
            }
        }
    }
    found.map(|(s, _)| s).ok_or_else(|| {
        format!(
            "medium {}: hugePages storage requested, but there is no resource request for huge pages",
            medium.name()
        )
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};

    fn c(mem: Option<&str>, restart: Option<&str>) -> Container {
        Container {
            name: "c".into(),
            restart_policy: restart.map(String::from),
            resources: Some(ResourceRequirements {
                limits: mem
                    .map(|m| BTreeMap::from([("memory".to_string(), ApiQuantity(m.into()))])),
                requests: Some(BTreeMap::from([(
                    "hugepages-2Mi".to_string(),
                    ApiQuantity("4Mi".into()),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod(init: Vec<Container>, regular: Vec<Container>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                init_containers: Some(init),
                containers: regular,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn media() {
        assert_eq!(Medium::parse(None), Ok(Medium::Default));
        assert_eq!(Medium::parse(Some("Memory")), Ok(Medium::Memory));
        assert_eq!(
            Medium::parse(Some("HugePages-2Mi")),
            Ok(Medium::HugePages(Some("2Mi".into())))
        );
        assert_eq!(
            Medium::parse(Some("Disk")).unwrap_err(),
            "unknown storage medium \"Disk\""
        );
    }

    #[test]
    fn pod_limits_with_sidecars_and_init() {
        let p = pod(
            vec![c(Some("100Mi"), Some("Always")), c(Some("500Mi"), None)],
            vec![c(Some("64Mi"), None), c(Some("64Mi"), None)],
        );
        // init peak: 100Mi sidecar + 500Mi = 600Mi > 228Mi.
        assert_eq!(pod_memory_limit(&p), Some(600 * 1024 * 1024));
        let p = pod(vec![], vec![c(Some("64Mi"), None), c(None, None)]);
        assert_eq!(pod_memory_limit(&p), None);
    }

    #[test]
    fn memory_size_is_the_smallest_positive() {
        let alloc = BTreeMap::from([("memory".to_string(), ApiQuantity("1Gi".into()))]);
        let limited = pod(vec![], vec![c(Some("256Mi"), None)]);
        let unlimited = pod(vec![], vec![c(None, None)]);
        assert_eq!(memory_size_limit(&unlimited, None, &alloc), Some(1 << 30));
        assert_eq!(memory_size_limit(&limited, None, &alloc), Some(256 << 20));
        let small = ApiQuantity("16Mi".into());
        assert_eq!(
            memory_size_limit(&limited, Some(&small), &alloc),
            Some(16 << 20)
        );
        let big = ApiQuantity("2Gi".into());
        assert_eq!(
            memory_size_limit(&limited, Some(&big), &alloc),
            Some(256 << 20)
        );
        assert_eq!(memory_size_limit(&unlimited, None, &BTreeMap::new()), None);
    }

    #[test]
    fn hugepage_sizes() {
        let p = pod(vec![], vec![c(None, None)]);
        assert_eq!(page_size(&Medium::HugePages(None), &p).unwrap(), "2Mi");
        assert_eq!(
            page_size(&Medium::HugePages(Some("2Mi".into())), &p).unwrap(),
            "2Mi"
        );
        assert!(page_size(&Medium::HugePages(Some("1Gi".into())), &p).is_err());
    }
}

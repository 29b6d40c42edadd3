//! Per-pod resource records kept across restarts, in kubelet's own files
//! and format (`pkg/kubelet/allocation/state/{checkpoint,state_checkpoint}.go`:
//! `allocated_pods_state` of the allocation manager, `actuated_pods_state`
//! of `kuberuntime_manager.go`, both in the root directory): for each pod
//! UID, the resources of each container and the pod-level resources.
//!
//! The file is kubelet's checkpoint, `{"data": "<JSON>", "checksum": N}`,
//! the data being `{"entries": {"<uid>": {"ContainerResources": {...},
//! "PodLevelResources": ...}}}` and the checksum FNV-32a over spew's `%#v`
//! of the data string (`checkpointmanager/checksum`, `util/hash`:
//! `(string)<data>`). So a keelson that takes over from kubelet on its
//! root dir (`keelson migrate --from-kubelet`) starts from kubelet's
//! allocations, and a kubelet started again on that root dir reads
//! keelson's: kubelet panics on a checkpoint it cannot read or whose
//! checksum is wrong (`allocation_manager.go` `newStateImpl`), and
//! refuses to start on such an actuated state. keelson's earlier plain
//! map is still read.
//!
//! Written through a temporary file and a rename, so a crash leaves the
//! previous file; an unreadable file is logged and started over from the
//! pod specs (where kubelet stops).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use k8s_openapi::api::core::v1::ResourceRequirements;
use serde::{Deserialize, Deserializer, Serialize};

use crate::pod::fnv::fnv32a;

/// One pod's record (kubelet's `state.PodResourceInfo`, whose fields have
/// no JSON tags: Go's names).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PodResources {
    /// Container name → resources.
    #[serde(
        rename = "ContainerResources",
        alias = "containers",
        default,
        deserialize_with = "null_as_default"
    )]
    pub containers: BTreeMap<String, ResourceRequirements>,
    /// Pod-level `spec.resources` (`null` when none, as Go writes a nil
    /// pointer).
    #[serde(rename = "PodLevelResources", alias = "pod", default)]
    pub pod: Option<ResourceRequirements>,
}

fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// kubelet's `state.Checkpoint`: the serialized entries and their checksum.
#[derive(Debug, Serialize, Deserialize)]
struct FileFormat {
    data: String,
    checksum: u64,
}

/// kubelet's `state.PodResourceCheckpointInfo`.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Entries {
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "null_as_default"
    )]
    entries: BTreeMap<String, PodResources>,
}

/// `checksum.New(data)` of a string: FNV-32a of `(string)<data>`.
fn checksum(data: &str) -> u64 {
    let mut rendered = Vec::with_capacity(data.len() + 8);
    rendered.extend_from_slice(b"(string)");
    rendered.extend_from_slice(data.as_bytes());
    u64::from(fnv32a(&rendered))
}

/// The file's bytes for `pods`, as kubelet's checkpoint manager writes them.
fn encode(pods: &BTreeMap<String, PodResources>) -> Vec<u8> {
    let data = serde_json::to_string(&Entries {
        entries: pods.clone(),
    })
    .unwrap_or_default();
    let file = FileFormat {
        checksum: checksum(&data),
        data,
    };
    serde_json::to_vec(&file).unwrap_or_default()
}

/// Reads kubelet's checkpoint (checksum verified) or keelson's earlier
/// plain map.
/// Why a checkpoint file is not used.
#[derive(Debug, thiserror::Error)]
enum CheckpointError {
    /// The data does not match its checksum (a torn or edited file).
    #[error("checksum {found} does not match the data's {want}")]
    Checksum {
        /// The checksum in the file.
        found: u64,
        /// The data's.
        want: u64,
    },
    /// Not JSON of either format.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

fn decode(bytes: &[u8]) -> Result<BTreeMap<String, PodResources>, CheckpointError> {
    if let Ok(file) = serde_json::from_slice::<FileFormat>(bytes) {
        let want = checksum(&file.data);
        if file.checksum != want {
            return Err(CheckpointError::Checksum {
                found: file.checksum,
                want,
            });
        }
        return Ok(serde_json::from_str::<Entries>(&file.data).map(|e| e.entries)?);
    }
    Ok(serde_json::from_slice(bytes)?)
}

fn load(p: &Path) -> Option<BTreeMap<String, PodResources>> {
    let bytes = match std::fs::read(p) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(path = %p.display(), error = %e, "resource checkpoint unreadable; starting from pod specs");
            return None;
        }
    };
    match decode(&bytes) {
        Ok(m) => Some(m),
        Err(e) => {
            tracing::warn!(path = %p.display(), error = %e, "resource checkpoint unreadable; starting from pod specs");
            None
        }
    }
}

/// A checkpointed map of pod UID → [`PodResources`].
#[derive(Debug)]
pub struct Checkpoint {
    path: Option<PathBuf>,
    pods: Mutex<BTreeMap<String, PodResources>>,
}

impl Checkpoint {
    /// Loads `path` (missing: empty); `None` keeps it in memory only.
    pub fn open(path: Option<PathBuf>) -> Self {
        let pods = path.as_deref().and_then(load).unwrap_or_default();
        Checkpoint {
            path,
            pods: Mutex::new(pods),
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, PodResources>> {
        self.pods.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn save(&self, pods: &BTreeMap<String, PodResources>) {
        let Some(path) = &self.path else { return };
        let write = || -> std::io::Result<()> {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, encode(pods))?;
            std::fs::rename(&tmp, path)
        };
        if let Err(e) = write() {
            tracing::warn!(path = %path.display(), error = %e, "writing the resource checkpoint failed");
        }
    }

    /// One pod's record.
    pub fn get(&self, uid: &str) -> Option<PodResources> {
        self.lock().get(uid).cloned()
    }

    /// Replaces one pod's record.
    pub fn set(&self, uid: &str, r: PodResources) {
        let mut pods = self.lock();
        if pods.get(uid) == Some(&r) {
            return;
        }
        pods.insert(uid.to_string(), r);
        self.save(&pods);
    }

    /// Sets one container's resources.
    pub fn set_container(&self, uid: &str, name: &str, r: ResourceRequirements) {
        let mut pods = self.lock();
        let entry = pods.entry(uid.to_string()).or_default();
        if entry.containers.get(name) == Some(&r) {
            return;
        }
        entry.containers.insert(name.to_string(), r);
        self.save(&pods);
    }

    /// Sets the pod-level resources.
    pub fn set_pod_level(&self, uid: &str, r: Option<ResourceRequirements>) {
        let mut pods = self.lock();
        let entry = pods.entry(uid.to_string()).or_default();
        if entry.pod == r {
            return;
        }
        entry.pod = r;
        self.save(&pods);
    }

    /// Forgets a pod.
    pub fn remove(&self, uid: &str) {
        let mut pods = self.lock();
        if pods.remove(uid).is_some() {
            self.save(&pods);
        }
    }

    /// Forgets every pod not in `keep`.
    pub fn retain(&self, keep: &BTreeSet<String>) {
        let mut pods = self.lock();
        let before = pods.len();
        pods.retain(|uid, _| keep.contains(uid));
        if pods.len() != before {
            self.save(&pods);
        }
    }

    /// The UIDs recorded.
    pub fn uids(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn survives_a_restart() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("allocated_pods_state");
        let c = Checkpoint::open(Some(path.clone()));
        let r: ResourceRequirements =
            serde_json::from_value(serde_json::json!({"requests": {"cpu": "1"}})).expect("rr");
        c.set_container("u1", "app", r.clone());
        c.set_container("u2", "app", r.clone());
        c.retain(&BTreeSet::from(["u1".to_string()]));
        let again = Checkpoint::open(Some(path.clone()));
        assert_eq!(again.get("u1").expect("u1").containers["app"], r);
        assert!(again.get("u2").is_none());
        std::fs::write(&path, "garbage").expect("w");
        assert!(Checkpoint::open(Some(path)).uids().is_empty());
    }

    /// kubelet's own checkpoint (the content and checksum of
    /// `Test_stateCheckpoint_formatUpgraded`, pkg/kubelet/allocation/state/
    /// state_checkpoint_test.go) is read; a wrong checksum is refused.
    #[test]
    fn reads_kubelets_checkpoint() {
        let kubelet = r#"{"data":"{\"entries\":{\"pod1\":{\"ContainerResources\":{\"container1\":{\"requests\":{\"cpu\":\"1Ki\",\"memory\":\"1Ki\"}}}}}}","checksum":1178570812}"#;
        let pods = decode(kubelet.as_bytes()).expect("kubelet's file");
        let c = &pods["pod1"].containers["container1"];
        let requests = c.requests.as_ref().expect("requests");
        assert_eq!(requests["cpu"].0, "1Ki");
        assert_eq!(requests["memory"].0, "1Ki");
        assert_eq!(pods["pod1"].pod, None);
        let tampered = kubelet.replace("1178570812", "1178570813");
        assert!(decode(tampered.as_bytes()).is_err());
    }

    /// What keelson writes is kubelet's format: the same checksum kubelet
    /// computes over the data, Go's field names, `null` for no pod-level
    /// resources; an empty map leaves `entries` out (Go's omitempty).
    #[test]
    fn writes_kubelets_format() {
        let mut pods = BTreeMap::new();
        let r: ResourceRequirements = serde_json::from_value(
            serde_json::json!({"requests": {"cpu": "1Ki", "memory": "1Ki"}}),
        )
        .expect("rr");
        pods.insert(
            "pod1".to_string(),
            PodResources {
                containers: BTreeMap::from([("container1".to_string(), r)]),
                pod: None,
            },
        );
        let bytes = encode(&pods);
        let file: serde_json::Value = serde_json::from_slice(&bytes).expect("json");
        assert_eq!(
            file["data"],
            r#"{"entries":{"pod1":{"ContainerResources":{"container1":{"requests":{"cpu":"1Ki","memory":"1Ki"}}},"PodLevelResources":null}}}"#
        );
        let data = file["data"].as_str().expect("data");
        assert_eq!(file["checksum"], checksum(data));
        assert_eq!(decode(&bytes).expect("round trip"), pods);
        // Without PodLevelResources the data is kubelet's test content
        // byte for byte, hence its checksum.
        assert_eq!(
            checksum(
                r#"{"entries":{"pod1":{"ContainerResources":{"container1":{"requests":{"cpu":"1Ki","memory":"1Ki"}}}}}}"#
            ),
            1_178_570_812
        );
        let empty = encode(&BTreeMap::new());
        assert_eq!(
            String::from_utf8(empty).expect("utf8"),
            format!(r#"{{"data":"{{}}","checksum":{}}}"#, checksum("{}"))
        );
    }

    /// keelson's earlier plain map is still read.
    #[test]
    fn reads_the_earlier_plain_map() {
        let old = r#"{"u1":{"containers":{"app":{"requests":{"cpu":"1"}}}}}"#;
        let pods = decode(old.as_bytes()).expect("plain map");
        assert!(pods["u1"].containers.contains_key("app"));
    }
}

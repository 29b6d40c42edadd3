//! Static pods (kubelet's file source): every manifest (YAML or JSON, one
//! Pod per file, hidden files skipped) in `staticPodPath`, re-read every
//! `fileCheckFrequency`. A manifest that does not parse is logged and
//! skipped; the others keep running.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::SourceEvent;
use super::defaults::apply_static_defaults;
use crate::pod::podutil;
use crate::pods::store::PodStore;

/// A manifest read from disk.
#[derive(Debug, Clone)]
pub struct Manifest {
    /// The file.
    pub path: PathBuf,
    /// The pod, defaulted.
    pub pod: Pod,
}

/// Why a static pod manifest was not read as a pod.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// Not YAML, or not a Pod's fields.
    #[error(transparent)]
    Yaml(#[from] serde_yaml::Error),
    /// Another kind of object.
    #[error("kind is {0:?}, expected \"Pod\"")]
    NotAPod(String),
}

/// Parses one manifest (YAML, of which JSON is a subset).
pub fn parse_manifest(text: &str) -> Result<Pod, ManifestError> {
    let value: serde_yaml::Value = serde_yaml::from_str(text)?;
    let kind = value
        .get("kind")
        .and_then(|k| k.as_str())
        .unwrap_or_default();
    if kind != "Pod" {
        return Err(ManifestError::NotAPod(kind.to_string()));
    }
    Ok(serde_yaml::from_value::<Pod>(value)?)
}

/// The stable UID of a manifest: a hash of its content, the node and the file.
pub fn manifest_uid(text: &str, node_name: &str, path: &Path) -> String {
    let mut h = Sha256::new();
    h.update(text.as_bytes());
    h.update(format!("host:{node_name}").as_bytes());
    h.update(format!("file:{}", path.display()).as_bytes());
    hex::encode(&h.finalize()[..16])
}

/// Reads every manifest in `dir`.
pub fn read_dir(dir: &Path, node_name: &str, seen: &mut HashMap<String, String>) -> Vec<Manifest> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(path = %dir.display(), error = %e, "cannot read staticPodPath");
            }
            return Vec::new();
        }
    };
    let mut paths: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file() || t.is_symlink()))
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| e.path())
        .collect();
    paths.sort();
    let mut out = Vec::new();
    for path in paths {
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot read static pod manifest");
                continue;
            }
        };
        let mut pod = match parse_manifest(&text) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "invalid static pod manifest; skipped");
                continue;
            }
        };
        let uid = manifest_uid(&text, node_name, &path);
        let first_seen = seen
            .entry(uid.clone())
            .or_insert_with(|| jiff::Timestamp::now().to_string())
            .clone();
        apply_static_defaults(&mut pod, node_name, &uid, &first_seen);
        out.push(Manifest { path, pod });
    }
    out
}

/// Polls `dir` until `stop`, keeping the static pods of `store` in sync.
pub async fn run(
    dir: Option<PathBuf>,
    node_name: String,
    period: Duration,
    store: PodStore,
    tx: mpsc::UnboundedSender<SourceEvent>,
    stop: CancellationToken,
) {
    let Some(dir) = dir else {
        let _ = tx.send(SourceEvent::StaticSynced);
        return;
    };
    let mut seen: HashMap<String, String> = HashMap::new();
    let mut current: HashMap<String, Pod> = HashMap::new();
    let mut first = true;
    loop {
        let manifests = {
            let dir = dir.clone();
            let node = node_name.clone();
            let mut s = std::mem::take(&mut seen);
            let r = tokio::task::spawn_blocking(move || {
                let m = read_dir(&dir, &node, &mut s);
                (m, s)
            })
            .await;
            match r {
                Ok((m, s)) => {
                    seen = s;
                    m
                }
                Err(e) => {
                    tracing::error!(error = %e, "static pod reader failed");
                    Vec::new()
                }
            }
        };
        let mut next: HashMap<String, Pod> = HashMap::new();
        for m in manifests {
            next.insert(podutil::uid(&m.pod).to_string(), m.pod);
        }
        for (uid, pod) in &current {
            if !next.contains_key(uid) {
                store.remove(pod);
                let _ = tx.send(SourceEvent::Remove(pod.clone()));
            }
        }
        for (uid, pod) in &next {
            if current.get(uid).is_none_or(|old| old.spec != pod.spec) {
                store.upsert(pod.clone());
                let _ = tx.send(SourceEvent::Upsert(pod.clone()));
            }
        }
        seen.retain(|uid, _| next.contains_key(uid));
        current = next;
        if first {
            first = false;
            let _ = tx.send(SourceEvent::StaticSynced);
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_manifests_and_skips_bad_and_hidden_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("web.yaml"),
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: c\n    image: busybox:1\n",
        )
        .expect("w");
        std::fs::write(dir.path().join("bad.yaml"), "kind: Pod\nspec: [").expect("w");
        std::fs::write(
            dir.path().join(".hidden.yaml"),
            "kind: Pod\nmetadata: {name: x}\n",
        )
        .expect("w");
        std::fs::write(
            dir.path().join("svc.json"),
            r#"{"kind": "Service", "metadata": {"name": "s"}}"#,
        )
        .expect("w");
        let mut seen = HashMap::new();
        let m = read_dir(dir.path(), "n1", &mut seen);
        assert_eq!(m.len(), 1);
        let p = &m[0].pod;
        assert_eq!(p.metadata.name.as_deref(), Some("web-n1"));
        assert!(podutil::is_static(p));
        // Stable identity across reads.
        let again = read_dir(dir.path(), "n1", &mut seen);
        assert_eq!(podutil::uid(&again[0].pod), podutil::uid(p));
        assert_eq!(
            again[0]
                .pod
                .metadata
                .annotations
                .as_ref()
                .map(|a| a["kubernetes.io/config.seen"].clone()),
            p.metadata
                .annotations
                .as_ref()
                .map(|a| a["kubernetes.io/config.seen"].clone())
        );
    }
}

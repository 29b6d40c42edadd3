//! Mount points for volumes mounted inside other volumes (kubelet's
//! `MakeNestedMountpoints`): when a container mounts volume A at `/etc/app`
//! and volume B at `/etc/app/extra`, the directory `extra` is created in A
//! beforehand, since A (a read-only projection) cannot get it later.

use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::{Pod, VolumeMount};

/// Lexical clean of an absolute container path (`/a/./b/../c` → `/a/c`).
fn clean(path: &str) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in Path::new(path).components() {
        match c {
            Component::Normal(s) => out.push(s),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}

/// Relative directories to create in volume `name` for every container.
pub fn nested_mount_points(name: &str, pod: &Pod) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(out);
    };
    let mut check = |mounts: &[VolumeMount]| -> Result<(), String> {
        if mounts
            .iter()
            .any(|m| m.name == name && m.mount_path.starts_with("../"))
        {
            return Err("invalid container mount point".to_string());
        }
        let mut all: Vec<PathBuf> = mounts.iter().map(|m| clean(&m.mount_path)).collect();
        all.sort();
        for mine in mounts
            .iter()
            .filter(|m| m.name == name)
            .map(|m| clean(&m.mount_path))
        {
            let mut prev: Option<PathBuf> = None;
            for mp in &all {
                let Ok(rel) = mp.strip_prefix(&mine) else {
                    continue;
                };
                if rel.as_os_str().is_empty() {
                    continue;
                }
                if prev.as_ref().is_some_and(|p| mp.starts_with(p)) {
                    continue;
                }
                prev = Some(mp.clone());
                out.push(rel.to_path_buf());
            }
        }
        Ok(())
    };
    for c in spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
    {
        check(c.volume_mounts.as_deref().unwrap_or_default())?;
    }
    for c in spec.ephemeral_containers.iter().flatten() {
        check(c.volume_mounts.as_deref().unwrap_or_default())?;
    }
    Ok(out)
}

/// Creates the nested mount points of volume `name` in `base` (0755).
pub fn make_nested_mount_points(name: &str, base: &Path, pod: &Pod) -> Result<(), String> {
    for dir in nested_mount_points(name, pod)? {
        std::fs::create_dir_all(base.join(&dir))
            .map_err(|e| format!("unable to create nested volume mountpoints: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn finds_first_level_nested_points() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "spec": {"containers": [{"name": "c", "volumeMounts": [
                {"name": "cfg", "mountPath": "/etc/app"},
                {"name": "x", "mountPath": "/etc/app/extra"},
                {"name": "y", "mountPath": "/etc/app/extra/deeper"},
                {"name": "z", "mountPath": "/etc/application"},
                {"name": "w", "mountPath": "/etc/app/./other/"}
            ]}]}
        }))
        .unwrap();
        let got = nested_mount_points("cfg", &pod).unwrap();
        assert_eq!(got, vec![PathBuf::from("extra"), PathBuf::from("other")]);
        assert!(nested_mount_points("z", &pod).unwrap().is_empty());
    }
}

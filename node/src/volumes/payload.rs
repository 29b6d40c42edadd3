//! What configMap, secret and downwardAPI sources project: kubelet's
//! `MakePayload` / `CollectData`, shared by the plain volumes and the
//! projected volume's sources.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, DownwardAPIVolumeFile, KeyToPath, Pod, Secret};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use super::atomic_writer::{FileProjection, Payload};
use crate::downward;

/// Mode of projected files when neither `defaultMode` nor `mode` is set
/// (the API server defaults `defaultMode` to this).
pub const DEFAULT_MODE: i32 = 0o644;

fn mode(m: Option<i32>, default: i32) -> u32 {
    (m.unwrap_or(default) as u32) & 0o7777
}

/// Files of a ConfigMap: every key of `data` and `binaryData`, or the
/// listed `items`. A listed key that does not exist is an error unless the
/// source is optional.
pub fn config_map(
    items: Option<&[KeyToPath]>,
    cm: Option<&ConfigMap>,
    default_mode: i32,
    optional: bool,
) -> Result<Payload, String> {
    let empty = BTreeMap::new();
    let data = cm.and_then(|c| c.data.as_ref()).unwrap_or(&empty);
    let empty_bin = BTreeMap::new();
    let binary = cm
        .and_then(|c| c.binary_data.as_ref())
        .unwrap_or(&empty_bin);
    let mut payload = Payload::new();
    match items.filter(|i| !i.is_empty()) {
        None => {
            for (k, v) in data {
                payload.insert(
                    k.clone(),
                    file(v.as_bytes().to_vec(), mode(None, default_mode)),
                );
            }
            for (k, v) in binary {
                payload.insert(k.clone(), file(v.0.clone(), mode(None, default_mode)));
            }
        }
        Some(items) => {
            for item in items {
                let content = if let Some(v) = data.get(&item.key) {
                    v.as_bytes().to_vec()
                } else if let Some(v) = binary.get(&item.key) {
                    v.0.clone()
                } else if optional {
                    continue;
                } else {
                    return Err(format!(
                        "configmap references non-existent config key: {}",
                        item.key
                    ));
                };
                payload.insert(
                    item.path.clone(),
                    file(content, mode(item.mode, default_mode)),
                );
            }
        }
    }
    Ok(payload)
}

/// Files of a Secret: every key of `data`, or the listed `items`.
pub fn secret(
    items: Option<&[KeyToPath]>,
    secret: Option<&Secret>,
    default_mode: i32,
    optional: bool,
) -> Result<Payload, String> {
    let empty = BTreeMap::new();
    let data = secret.and_then(|s| s.data.as_ref()).unwrap_or(&empty);
    let mut payload = Payload::new();
    match items.filter(|i| !i.is_empty()) {
        None => {
            for (k, v) in data {
                payload.insert(k.clone(), file(v.0.clone(), mode(None, default_mode)));
            }
        }
        Some(items) => {
            for item in items {
                let Some(v) = data.get(&item.key) else {
                    if optional {
                        continue;
                    }
                    return Err(format!("references non-existent secret key: {}", item.key));
                };
                payload.insert(
                    item.path.clone(),
                    file(v.0.clone(), mode(item.mode, default_mode)),
                );
            }
        }
    }
    Ok(payload)
}

/// Files of downwardAPI items. Every item is computed; errors are
/// aggregated as kubelet does and fail the whole volume.
pub fn downward_api(
    items: &[DownwardAPIVolumeFile],
    pod: &Pod,
    allocatable: &BTreeMap<String, ApiQuantity>,
    default_mode: i32,
) -> Result<Payload, String> {
    let mut payload = Payload::new();
    let mut errors = Vec::new();
    for item in items {
        let value = if let Some(f) = &item.field_ref {
            downward::metadata_field(pod, &f.field_path)
        } else if let Some(r) = &item.resource_field_ref {
            downward::container_resource(pod, None, r, allocatable)
        } else {
            Ok(String::new())
        };
        let data = match value {
            Ok(v) => v.into_bytes(),
            Err(e) => {
                errors.push(e.to_string());
                Vec::new()
            }
        };
        payload.insert(item.path.clone(), file(data, mode(item.mode, default_mode)));
    }
    if errors.is_empty() {
        Ok(payload)
    } else {
        Err(aggregate(&errors))
    }
}

fn file(data: Vec<u8>, mode: u32) -> FileProjection {
    FileProjection {
        data,
        mode,
        fs_user: None,
    }
}

/// Joins errors as `utilerrors.NewAggregate` prints them: one error alone,
/// several as `[a, b]`.
pub fn aggregate(errors: &[String]) -> String {
    match errors {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::{ObjectFieldSelector, ResourceFieldSelector};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn cm() -> ConfigMap {
        ConfigMap {
            data: Some(BTreeMap::from([
                ("a".into(), "1".into()),
                ("b".into(), "2".into()),
            ])),
            binary_data: Some(BTreeMap::from([("bin".into(), ByteString(vec![0, 1]))])),
            ..Default::default()
        }
    }

    fn ktp(key: &str, path: &str, mode: Option<i32>) -> KeyToPath {
        KeyToPath {
            key: key.into(),
            path: path.into(),
            mode,
        }
    }

    #[test]
    fn config_map_all_keys_and_items() {
        let all = config_map(None, Some(&cm()), 0o600, false).unwrap();
        assert_eq!(all.len(), 3);
        assert_eq!(all["bin"].data, vec![0, 1]);
        assert_eq!(all["a"].mode, 0o600);
        let items = [ktp("a", "dir/x", Some(0o400)), ktp("bin", "y", None)];
        let some = config_map(Some(&items), Some(&cm()), 0o644, false).unwrap();
        assert_eq!(some.keys().collect::<Vec<_>>(), ["dir/x", "y"]);
        assert_eq!(some["dir/x"].mode, 0o400);
        assert_eq!(some["y"].mode, 0o644);
        let missing = [ktp("zz", "z", None)];
        assert_eq!(
            config_map(Some(&missing), Some(&cm()), 0o644, false).unwrap_err(),
            "configmap references non-existent config key: zz"
        );
        assert!(
            config_map(Some(&missing), Some(&cm()), 0o644, true)
                .unwrap()
                .is_empty()
        );
        assert!(config_map(None, None, 0o644, true).unwrap().is_empty());
    }

    #[test]
    fn secret_items() {
        let s = Secret {
            data: Some(BTreeMap::from([("k".into(), ByteString(b"v".to_vec()))])),
            ..Default::default()
        };
        assert_eq!(
            secret(None, Some(&s), 0o644, false).unwrap()["k"].data,
            b"v"
        );
        assert_eq!(
            secret(Some(&[ktp("x", "x", None)]), Some(&s), 0o644, false).unwrap_err(),
            "references non-existent secret key: x"
        );
    }

    #[test]
    fn downward_items_and_aggregated_errors() {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                labels: Some(BTreeMap::from([("app".into(), "web".into())])),
                ..Default::default()
            },
            ..Default::default()
        };
        let item = |path: &str, field: &str| DownwardAPIVolumeFile {
            path: path.into(),
            field_ref: Some(ObjectFieldSelector {
                api_version: Some("v1".into()),
                field_path: field.into(),
            }),
            ..Default::default()
        };
        let ok = downward_api(
            &[
                item("labels", "metadata.labels"),
                item("name", "metadata.name"),
            ],
            &pod,
            &BTreeMap::new(),
            0o644,
        )
        .unwrap();
        assert_eq!(ok["labels"].data, b"app=\"web\"");
        let bad = downward_api(
            &[item("x", "spec.nodeName"), item("y", "status.podIP")],
            &pod,
            &BTreeMap::new(),
            0o644,
        )
        .unwrap_err();
        assert_eq!(
            bad,
            "[unsupported fieldPath: spec.nodeName, unsupported fieldPath: status.podIP]"
        );
        let res = DownwardAPIVolumeFile {
            path: "cpu".into(),
            resource_field_ref: Some(ResourceFieldSelector {
                container_name: Some("missing".into()),
                resource: "limits.cpu".into(),
                divisor: None,
            }),
            ..Default::default()
        };
        assert_eq!(
            downward_api(&[res], &pod, &BTreeMap::new(), 0o644).unwrap_err(),
            "container missing not found"
        );
    }
}

//! Strings the CRI runtime hands back that reach host paths: a container's
//! labels and annotations (node/src/pod/labels.rs) and the legacy log
//! symlink name built from them and the container id
//! (node/src/pods/runtime/sync.rs `legacy_log_name`), which keelson joins
//! under /var/log/containers to create and to remove a symlink.
//! Holds: no panic; the name, when there is one, is a single path component
//! (joined under the directory it stays there) of at most 255 bytes, the
//! longest file name ext4 takes, ending in `.log`.
#![no_main]

use std::collections::HashMap;
use std::path::{Component, Path};

use keelson_node::pod::labels::{container_info_from_annotations, container_info_from_labels};
use keelson_node::pods::runtime::sync::legacy_log_name;
use libfuzzer_sys::fuzz_target;

const KEYS: [&str; 12] = [
    "io.kubernetes.container.name",
    "io.kubernetes.pod.name",
    "io.kubernetes.pod.namespace",
    "io.kubernetes.pod.uid",
    "io.kubernetes.container.hash",
    "io.kubernetes.container.restartCount",
    "io.kubernetes.pod.deletionGracePeriod",
    "io.kubernetes.pod.terminationGracePeriod",
    "io.kubernetes.container.terminationMessagePath",
    "io.kubernetes.container.preStopHandler",
    "io.kubernetes.container.ports",
    "io.kubernetes.container.type",
];

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut fields = text.split('\u{1}');
    let id = fields.next().unwrap_or_default();
    let map: HashMap<String, String> = KEYS
        .iter()
        .zip(fields)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let info = container_info_from_labels(&map);
    let _ = container_info_from_annotations(&map);
    let Some(name) = legacy_log_name(
        &info.pod_name,
        &info.pod_namespace,
        &info.container_name,
        id,
    ) else {
        return;
    };
    assert!(name.len() <= 255, "{} bytes", name.len());
    assert!(name.ends_with(".log"));
    let dir = Path::new("/var/log/containers");
    let link = dir.join(&name);
    assert_eq!(link.parent(), Some(dir), "{name:?} leaves the directory");
    assert!(matches!(
        link.components().next_back(),
        Some(Component::Normal(_))
    ));
});

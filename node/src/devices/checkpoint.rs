//! The device manager's checkpoint, `<root>/device-plugins/kubelet_internal_checkpoint`,
//! in kubelet's format (`pkg/kubelet/cm/devicemanager/checkpoint/checkpoint.go`,
//! `checkpointmanager/checksum/checksum.go`), so kubelet and keelson read
//! each other's allocations after a migration:
//!
//! ```json
//! {"Data":{"PodDeviceEntries":[{"PodUID":"..","ContainerName":"..","ResourceName":"..",
//!   "DeviceIDs":{"-1":["Dev-1"]},"AllocResp":"<base64 of the protobuf ContainerAllocateResponse>"}],
//!   "RegisteredDevices":{"example.com/resource":["Dev-1","Dev-2"]}},"Checksum":1234}
//! ```
//!
//! The checksum is FNV-32a over spew's `%#v` rendering of the Go value of
//! `Data` (`hashutil.DeepHashObject` with `dump.ForHash`: sorted map keys,
//! types printed for non-element values), reproduced by [`spew_rendering`].

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::pod::fnv::fnv32a;

/// The checkpoint's file name (`kubeletDeviceManagerCheckpoint`).
pub(crate) const FILE_NAME: &str = "kubelet_internal_checkpoint";

/// One container's devices of one resource (`PodDevicesEntry`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Entry {
    #[serde(rename = "PodUID")]
    pub(crate) pod_uid: String,
    #[serde(rename = "ContainerName")]
    pub(crate) container_name: String,
    #[serde(rename = "ResourceName")]
    pub(crate) resource_name: String,
    /// Device IDs per NUMA node (`-1`: devices without topology).
    #[serde(rename = "DeviceIDs")]
    pub(crate) device_ids: BTreeMap<i64, Vec<String>>,
    /// The plugin's `ContainerAllocateResponse`, protobuf-encoded.
    #[serde(rename = "AllocResp", with = "base64_bytes")]
    pub(crate) alloc_resp: Vec<u8>,
}

/// `checkpointData`. `None` lists are Go's nil slices (JSON `null`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Data {
    #[serde(rename = "PodDeviceEntries")]
    pub(crate) entries: Option<Vec<Entry>>,
    #[serde(rename = "RegisteredDevices")]
    pub(crate) registered: Option<BTreeMap<String, Vec<String>>>,
}

#[derive(Serialize, Deserialize)]
struct File {
    #[serde(rename = "Data")]
    data: Data,
    #[serde(rename = "Checksum")]
    checksum: u64,
}

/// Why the checkpoint could not be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CheckpointError {
    /// Reading or writing the file failed.
    #[error("checkpoint {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    /// The file is not kubelet's JSON.
    #[error("checkpoint {path} is not valid: {source}")]
    Parse {
        path: String,
        source: serde_json::Error,
    },
    /// `CorruptCheckpointError`.
    #[error("checkpoint is corrupted (checksum {actual} != {expected})")]
    Corrupt { actual: u64, expected: u64 },
}

mod base64_bytes {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        // encoding/json writes a nil []byte as null.
        let s: Option<String> = Option::deserialize(d)?;
        match s {
            None => Ok(Vec::new()),
            Some(s) => base64::engine::general_purpose::STANDARD
                .decode(s)
                .map_err(serde::de::Error::custom),
        }
    }
}

/// spew's rendering of `checkpoint.checkpointData` as `dump.ForHash` writes it.
pub(crate) fn spew_rendering(d: &Data) -> String {
    fn list(out: &mut String, items: &[String]) {
        out.push('[');
        for (i, s) in items.iter().enumerate() {
            if i > 0 {
                out.push(' ');
            }
            out.push_str(s);
        }
        out.push(']');
    }
    let mut out = String::from("(checkpoint.checkpointData){PodDeviceEntries:");
    out.push_str("([]checkpoint.PodDevicesEntry)");
    match &d.entries {
        None => out.push_str("<nil>"),
        Some(entries) => {
            out.push('[');
            for (i, e) in entries.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                let _ = write!(
                    out,
                    "{{PodUID:(string){} ContainerName:(string){} ResourceName:(string){} DeviceIDs:(checkpoint.DevicesPerNUMA)map[",
                    e.pod_uid, e.container_name, e.resource_name
                );
                for (j, (numa, ids)) in e.device_ids.iter().enumerate() {
                    if j > 0 {
                        out.push(' ');
                    }
                    let _ = write!(out, "{numa}:");
                    list(&mut out, ids);
                }
                out.push_str("] AllocResp:([]uint8)");
                // proto.Marshal of an empty message is a nil slice.
                if e.alloc_resp.is_empty() {
                    out.push_str("<nil>");
                } else {
                    let bytes: Vec<String> = e.alloc_resp.iter().map(|b| b.to_string()).collect();
                    list(&mut out, &bytes);
                }
                out.push('}');
            }
            out.push(']');
        }
    }
    out.push_str(" RegisteredDevices:(map[string][]string)");
    match &d.registered {
        None => out.push_str("<nil>"),
        Some(reg) => {
            out.push_str("map[");
            for (i, (name, ids)) in reg.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                let _ = write!(out, "{name}:");
                list(&mut out, ids);
            }
            out.push(']');
        }
    }
    out.push('}');
    out
}

/// `checksum.New(data)`.
pub(crate) fn checksum(d: &Data) -> u64 {
    u64::from(fnv32a(spew_rendering(d).as_bytes()))
}

/// The file's bytes (`MarshalCheckpoint`).
pub(crate) fn encode(d: &Data) -> Vec<u8> {
    let file = File {
        data: d.clone(),
        checksum: checksum(d),
    };
    serde_json::to_vec(&file).unwrap_or_default()
}

/// Parses and verifies a checkpoint (`UnmarshalCheckpoint` + `VerifyChecksum`).
pub(crate) fn decode(path: &Path, bytes: &[u8]) -> Result<Data, CheckpointError> {
    let file: File = serde_json::from_slice(bytes).map_err(|source| CheckpointError::Parse {
        path: path.display().to_string(),
        source,
    })?;
    let actual = checksum(&file.data);
    if actual != file.checksum {
        return Err(CheckpointError::Corrupt {
            actual,
            expected: file.checksum,
        });
    }
    Ok(file.data)
}

/// Reads the checkpoint; `Ok(None)` when there is none.
pub(crate) fn read(path: &Path) -> Result<Option<Data>, CheckpointError> {
    match std::fs::read(path) {
        Ok(bytes) => decode(path, &bytes).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(CheckpointError::Io {
            path: path.display().to_string(),
            source,
        }),
    }
}

/// Writes the checkpoint through a temporary file renamed over it (the
/// checkpoint manager's file store writes the same way).
pub(crate) fn write(path: &Path, d: &Data) -> Result<(), CheckpointError> {
    let io = |source| CheckpointError::Io {
        path: path.display().to_string(),
        source,
    };
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, encode(d)).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// base64 as encoding/json writes a `[]byte` (standard, padded).
#[cfg(test)]
fn b64(v: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Data {
        Data {
            entries: Some(vec![Entry {
                pod_uid: "uid-1".into(),
                container_name: "c".into(),
                resource_name: "example.com/resource".into(),
                device_ids: BTreeMap::from([(-1, vec!["Dev-1".into()])]),
                alloc_resp: vec![18, 3, 10, 1, 47],
            }]),
            registered: Some(BTreeMap::from([(
                "example.com/resource".into(),
                vec!["Dev-1".into(), "Dev-2".into()],
            )])),
        }
    }

    #[test]
    fn renders_as_spew_for_hash() {
        assert_eq!(
            spew_rendering(&sample()),
            "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)[{PodUID:(string)uid-1 \
             ContainerName:(string)c ResourceName:(string)example.com/resource \
             DeviceIDs:(checkpoint.DevicesPerNUMA)map[-1:[Dev-1]] AllocResp:([]uint8)[18 3 10 1 47]}] \
             RegisteredDevices:(map[string][]string)map[example.com/resource:[Dev-1 Dev-2]]}"
        );
        assert_eq!(
            spew_rendering(&Data {
                entries: None,
                registered: Some(BTreeMap::new())
            }),
            "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)<nil> \
             RegisteredDevices:(map[string][]string)map[]}"
        );
    }

    #[test]
    fn round_trips_and_detects_corruption() {
        let d = sample();
        let bytes = encode(&d);
        let text = String::from_utf8(bytes.clone()).unwrap_or_default();
        assert!(text.contains(&format!("\"AllocResp\":\"{}\"", b64(&[18, 3, 10, 1, 47]))));
        assert!(text.contains("\"DeviceIDs\":{\"-1\":[\"Dev-1\"]}"));
        assert_eq!(decode(Path::new("x"), &bytes).ok(), Some(d));
        let tampered = text.replace("Dev-2", "Dev-3");
        assert!(matches!(
            decode(Path::new("x"), tampered.as_bytes()),
            Err(CheckpointError::Corrupt { .. })
        ));
    }

    #[test]
    fn reads_an_empty_checkpoint_kubelet_wrote() {
        // A fresh kubelet v1.36 node with no device plugin writes this file
        // (nil entries, empty registered devices); its checksum is the
        // FNV-32a of the rendering above.
        let d = Data {
            entries: None,
            registered: Some(BTreeMap::new()),
        };
        let text = format!(
            "{{\"Data\":{{\"PodDeviceEntries\":null,\"RegisteredDevices\":{{}}}},\"Checksum\":{}}}",
            checksum(&d)
        );
        assert_eq!(decode(Path::new("x"), text.as_bytes()).ok(), Some(d));
    }
}

//! `status.nodeInfo`: machine and boot ids, kernel, OS image, the runtime's
//! `<name>://<version>`, the Kubernetes version keelson implements, OS and
//! architecture, swap capacity. Version strings are normalised the way
//! kubelet parses the runtime's version (`v1.6.20` and `1.6.20~ds1` both
//! become `1.6.20`; an unparsable version is reported as `Unknown`).

use k8s_openapi::api::core::v1::{NodeSwapStatus, NodeSystemInfo};

use super::conditions::NodeEvent;
use super::host::{MachineInfo, VersionInfo};

/// Parses a version the way apimachinery's `ParseSemantic`, then
/// `ParseGeneric`, do, and prints it as their `String()` does.
pub fn normalize_runtime_version(text: &str) -> Option<String> {
    let t = text.trim_start();
    let t = t.strip_prefix('v').unwrap_or(t);
    let end = t
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_digit() || *c == '.'))
        .map(|(i, _)| i)
        .unwrap_or(t.len());
    let (mut numbers, mut extra) = t.split_at(end);
    // The numeric part must end on a digit; a trailing '.' belongs to "extra".
    while numbers.ends_with('.') {
        numbers = &numbers[..numbers.len() - 1];
        extra = &t[numbers.len()..];
    }
    if numbers.is_empty() {
        return None;
    }
    let components: Vec<&str> = numbers.split('.').collect();
    let valid_number = |i: usize, c: &str, semver: bool| {
        !c.is_empty()
            && c.parse::<u64>().is_ok()
            && !((i == 0 || semver) && c.starts_with('0') && c != "0")
    };
    // Semantic: exactly three components and a valid pre-release/build suffix.
    if components.len() == 3
        && components
            .iter()
            .enumerate()
            .all(|(i, c)| valid_number(i, c, true))
        && let Some(suffix) = semver_suffix(extra)
    {
        return Some(format!("{}{suffix}", components.join(".")));
    }
    // Generic: at least two components; anything after them is ignored.
    if components.len() >= 2
        && components
            .iter()
            .enumerate()
            .all(|(i, c)| valid_number(i, c, false))
    {
        let printed: Vec<String> = components
            .iter()
            .map(|c| c.parse::<u64>().map(|n| n.to_string()).unwrap_or_default())
            .collect();
        return Some(printed.join("."));
    }
    None
}

/// `-pre.release+build.meta` (each part optional), trailing spaces allowed;
/// returns the text to print, or `None` when `extra` is not such a suffix.
fn semver_suffix(extra: &str) -> Option<String> {
    let extra = extra.trim_end();
    if extra.is_empty() {
        return Some(String::new());
    }
    let ident_list = |s: &str| {
        !s.is_empty()
            && s.split('.')
                .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
    };
    let (pre, build) = match extra.split_once('+') {
        Some((p, b)) => (p, Some(b)),
        None => (extra, None),
    };
    let pre = if pre.is_empty() {
        None
    } else {
        let p = pre.strip_prefix('-')?;
        if !ident_list(p) {
            return None;
        }
        Some(p)
    };
    if let Some(b) = build
        && !ident_list(b)
    {
        return None;
    }
    let mut out = String::new();
    if let Some(p) = pre {
        out.push('-');
        out.push_str(p);
    }
    if let Some(b) = build {
        out.push('+');
        out.push_str(b);
    }
    Some(out)
}

/// The runtime as CRI Version reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeVersion {
    /// `runtime_name` (e.g. `containerd`).
    pub name: String,
    /// `runtime_version` as reported.
    pub version: String,
}

/// `containerRuntimeVersion`: `<name>://<version>`, `Unknown` for a version
/// kubelet could not parse or a Version call that failed.
pub fn container_runtime_version(name: &str, version: Option<&str>) -> String {
    let v = version
        .and_then(normalize_runtime_version)
        .unwrap_or_else(|| "Unknown".to_string());
    format!("{name}://{v}")
}

/// Inputs of the nodeInfo setters.
#[derive(Debug, Clone)]
pub struct NodeInfoInputs<'a> {
    /// This node's name (for the reboot event).
    pub node_name: &'a str,
    /// Machine facts, when readable.
    pub machine: Option<&'a MachineInfo>,
    /// Kernel/OS facts, when readable.
    pub version: Option<&'a VersionInfo>,
    /// Runtime name known from a past Version call (`None`: never answered).
    pub runtime_name: Option<&'a str>,
    /// Runtime version from this round's Version call (`None`: it failed).
    pub runtime_version: Option<&'a str>,
    /// The Kubernetes version reported as `kubeletVersion`.
    pub kubelet_version: &'a str,
}

/// Applies the MachineInfo (identity part), VersionInfo and GoRuntime
/// setters to `info`; returns the `NodeRebooted` event when the boot id changed.
pub fn set_node_info(info: &mut NodeSystemInfo, inputs: &NodeInfoInputs<'_>) -> Option<NodeEvent> {
    let mut event = None;
    if let Some(m) = inputs.machine {
        info.machine_id = m.machine_id.clone();
        info.system_uuid = m.system_uuid.clone();
        if !info.boot_id.is_empty() && info.boot_id != m.boot_id {
            event = Some(NodeEvent {
                warning: true,
                reason: "Rebooted",
                message: Some(format!(
                    "Node {} has been rebooted, boot id: {}",
                    inputs.node_name, m.boot_id
                )),
            });
        }
        info.boot_id = m.boot_id.clone();
        // kubelet's MachineInfo setter (pkg/kubelet/nodestatus/setters.go)
        // writes swap only when the host has some: the API server refuses
        // `capacity: 0`. A value written earlier is left as it is.
        if m.swap_capacity != 0 {
            info.swap = Some(NodeSwapStatus {
                capacity: Some(i64::try_from(m.swap_capacity).unwrap_or(i64::MAX)),
            });
        }
    }
    if let Some(v) = inputs.version {
        info.kernel_version = v.kernel_version.clone();
        info.os_image = v.os_image.clone();
        if let Some(name) = inputs.runtime_name {
            info.container_runtime_version =
                container_runtime_version(name, inputs.runtime_version);
        }
        info.kubelet_version = inputs.kubelet_version.to_string();
    }
    info.operating_system = std::env::consts::OS.to_string();
    info.architecture = keelson_common::version::go_arch().to_string();
    event
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_versions_as_kubelet_parses_them() {
        let cases = [
            ("v1.6.20", Some("1.6.20")),
            ("1.6.20", Some("1.6.20")),
            ("1.6.20~ds1", Some("1.6.20")),
            ("1.7.0-rc.1", Some("1.7.0-rc.1")),
            ("1.7.0-rc.1+abc", Some("1.7.0-rc.1+abc")),
            ("2.0", Some("2.0")),
            ("1.30.1.4", Some("1.30.1.4")),
            ("keelson-fake", None),
            ("1", None),
            ("01.2.3", None),
        ];
        for (input, want) in cases {
            assert_eq!(normalize_runtime_version(input).as_deref(), want, "{input}");
        }
        assert_eq!(
            container_runtime_version("containerd", Some("1.6.20~ds1")),
            "containerd://1.6.20"
        );
        assert_eq!(
            container_runtime_version("containerd", None),
            "containerd://Unknown"
        );
    }

    #[test]
    fn node_info_and_reboot_event() {
        let m = MachineInfo {
            num_cores: 1,
            memory_capacity: 1,
            hugepages: vec![],
            machine_id: "mid".into(),
            system_uuid: "uuid".into(),
            boot_id: "boot-2".into(),
            swap_capacity: 0,
        };
        let v = VersionInfo {
            kernel_version: "6.1".into(),
            os_image: "Debian GNU/Linux 12 (bookworm)".into(),
        };
        let mut info = NodeSystemInfo {
            boot_id: "boot-1".into(),
            ..Default::default()
        };
        let ev = set_node_info(
            &mut info,
            &NodeInfoInputs {
                node_name: "n1",
                machine: Some(&m),
                version: Some(&v),
                runtime_name: Some("containerd"),
                runtime_version: Some("v1.6.20"),
                kubelet_version: "v1.36.0",
            },
        )
        .expect("reboot event");
        assert!(ev.warning);
        assert_eq!(ev.reason, "Rebooted");
        assert_eq!(
            ev.message.as_deref(),
            Some("Node n1 has been rebooted, boot id: boot-2")
        );
        assert_eq!(info.boot_id, "boot-2");
        assert_eq!(info.machine_id, "mid");
        assert_eq!(info.container_runtime_version, "containerd://1.6.20");
        assert_eq!(info.kubelet_version, "v1.36.0");
        assert_eq!(info.operating_system, "linux");
        assert_eq!(info.kube_proxy_version, "");
        assert_eq!(info.swap, None, "no swap: the field is left out");

        let with_swap = MachineInfo {
            swap_capacity: 1 << 30,
            ..m
        };
        let inputs = NodeInfoInputs {
            node_name: "n1",
            machine: Some(&with_swap),
            version: None,
            runtime_name: None,
            runtime_version: None,
            kubelet_version: "v1.36.0",
        };
        set_node_info(&mut info, &inputs);
        assert_eq!(info.swap.as_ref().and_then(|s| s.capacity), Some(1 << 30));
        // Swap gone later: kubelet leaves the last value (it never clears it).
        let without = MachineInfo {
            swap_capacity: 0,
            ..with_swap.clone()
        };
        set_node_info(
            &mut info,
            &NodeInfoInputs {
                machine: Some(&without),
                ..inputs
            },
        );
        assert_eq!(info.swap.and_then(|s| s.capacity), Some(1 << 30));
    }
}

//! Which cgroup driver the container runtime uses, and whether keelson's
//! agrees. kubelet ≥ 1.34 asks the runtime (CRI `RuntimeConfig`, three
//! tries 2 s apart) and follows its answer; a runtime without the call
//! (containerd < 2.0) leaves kubelet's `cgroupDriver` in force
//! (`cmd/kubelet/app/server.go` `getCgroupDriverFromCRI`). A mismatch then
//! shows only when the first sandbox fails with a runtime error about its
//! cgroup path. keelson checks at start instead: when the runtime does not
//! answer `RuntimeConfig`, containerd's own configuration in a verbose
//! `Status` (`SystemdCgroup` of its default runtime's options) says which
//! driver it uses, and a mismatch stops the node role with both named.

use std::time::Duration;

use keelson_cri::{RuntimeClient, api};

use crate::config::CgroupDriver;

/// Where the runtime's driver was learnt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeDriver {
    /// CRI `RuntimeConfig` answered.
    Reported(CgroupDriver),
    /// Read from containerd's configuration in a verbose `Status`.
    FromStatus(CgroupDriver),
    /// The runtime said nothing usable (or could not be reached).
    Unknown,
}

/// keelson and the runtime disagree.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DriverError {
    /// The configured driver is not the runtime's.
    #[error(
        "cgroup driver mismatch: keelson is configured with {configured:?} (node.cgroupDriver) but the container runtime uses {runtime:?} ({origin}); set node.cgroupDriver: {runtime} (or cgroupDriver: {runtime} in the KubeletConfiguration)"
    )]
    Mismatch {
        /// keelson's `cgroupDriver`.
        configured: &'static str,
        /// The runtime's.
        runtime: &'static str,
        /// Where the runtime's came from.
        origin: &'static str,
    },
}

/// The driver's name as configured and as the runtime reports it.
pub fn name(d: CgroupDriver) -> &'static str {
    match d {
        CgroupDriver::Cgroupfs => "cgroupfs",
        CgroupDriver::Systemd => "systemd",
    }
}

/// The driver in containerd's CRI configuration (`info["config"]` of a
/// verbose Status): `SystemdCgroup` in the options of the default runtime.
pub fn driver_from_containerd_config(json: &str) -> Option<CgroupDriver> {
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    let ctrd = v.get("containerd")?;
    let default = ctrd.get("defaultRuntimeName")?.as_str()?;
    let opts = ctrd.get("runtimes")?.get(default)?.get("options")?;
    let systemd = match opts.get("SystemdCgroup") {
        Some(serde_json::Value::Bool(b)) => *b,
        // runc's default: cgroupfs.
        None | Some(serde_json::Value::Null) => false,
        Some(_) => return None,
    };
    Some(if systemd {
        CgroupDriver::Systemd
    } else {
        CgroupDriver::Cgroupfs
    })
}

/// Asks the runtime, as kubelet does, then falls back to containerd's
/// configuration. Errors other than Unimplemented are retried 3 times, 2 s
/// apart, as kubelet does; a runtime that is not up at all (no socket) is
/// `Unknown` at once: keelson's node role starts without its runtime and
/// waits for it, where kubelet exits.
pub async fn runtime_driver(cri: &RuntimeClient) -> RuntimeDriver {
    for attempt in 0..3 {
        match cri.runtime_config().await {
            Ok(r) => {
                return match r.linux.map(|l| l.cgroup_driver) {
                    Some(d) if d == api::CgroupDriver::Systemd as i32 => {
                        RuntimeDriver::Reported(CgroupDriver::Systemd)
                    }
                    Some(d) if d == api::CgroupDriver::Cgroupfs as i32 => {
                        RuntimeDriver::Reported(CgroupDriver::Cgroupfs)
                    }
                    _ => RuntimeDriver::Unknown,
                };
            }
            Err(e) if e.is_unimplemented() => {
                tracing::info!(
                    "CRI implementation should be updated to support RuntimeConfig. Falling back to using cgroupDriver from kubelet config."
                );
                break;
            }
            Err(keelson_cri::CriError::Unavailable { .. }) => return RuntimeDriver::Unknown,
            Err(e) => {
                tracing::debug!(error = %e, attempt, "RuntimeConfig failed; retrying");
                if attempt < 2 {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            }
        }
    }
    match cri.status_verbose(true).await {
        Ok(s) => s
            .info
            .get("config")
            .and_then(|c| driver_from_containerd_config(c))
            .map_or(RuntimeDriver::Unknown, RuntimeDriver::FromStatus),
        Err(_) => RuntimeDriver::Unknown,
    }
}

/// The driver the node role uses, or why it cannot start.
pub fn decide(
    configured: CgroupDriver,
    runtime: RuntimeDriver,
) -> Result<CgroupDriver, DriverError> {
    match runtime {
        RuntimeDriver::Reported(d) => {
            if d != configured {
                tracing::info!(
                    cgroup_driver = name(d),
                    "using cgroup driver setting received from the CRI runtime"
                );
            }
            Ok(d)
        }
        RuntimeDriver::FromStatus(d) if d != configured => Err(DriverError::Mismatch {
            configured: name(configured),
            runtime: name(d),
            origin: "containerd's configuration, SystemdCgroup",
        }),
        RuntimeDriver::FromStatus(d) => {
            tracing::info!(
                cgroup_driver = name(d),
                "the container runtime's configuration uses the same cgroup driver"
            );
            Ok(configured)
        }
        RuntimeDriver::Unknown => {
            tracing::info!(
                cgroup_driver = name(configured),
                "the container runtime does not say which cgroup driver it uses; using the configured one"
            );
            Ok(configured)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CTRD: &str = r#"{"containerd":{"defaultRuntimeName":"runc","runtimes":{"runc":{"runtimeType":"io.containerd.runc.v2","options":{"BinaryName":"","SystemdCgroup":true}}}}}"#;

    #[test]
    fn containerd_configuration_is_read() {
        assert_eq!(
            driver_from_containerd_config(CTRD),
            Some(CgroupDriver::Systemd)
        );
        let cgroupfs = CTRD.replace("true", "false");
        assert_eq!(
            driver_from_containerd_config(&cgroupfs),
            Some(CgroupDriver::Cgroupfs)
        );
        let unset = CTRD.replace(",\"SystemdCgroup\":true", "");
        assert_eq!(
            driver_from_containerd_config(&unset),
            Some(CgroupDriver::Cgroupfs)
        );
        assert_eq!(driver_from_containerd_config("{}"), None);
        assert_eq!(driver_from_containerd_config("not json"), None);
    }

    #[test]
    fn decisions_follow_kubelet_and_name_both_sides() {
        use CgroupDriver::*;
        assert_eq!(
            decide(Cgroupfs, RuntimeDriver::Reported(Cgroupfs)),
            Ok(Cgroupfs)
        );
        // The runtime's answer wins, as kubelet ≥ 1.34.
        assert_eq!(
            decide(Cgroupfs, RuntimeDriver::Reported(Systemd)),
            Ok(Systemd)
        );
        assert_eq!(
            decide(Systemd, RuntimeDriver::Reported(Cgroupfs)),
            Ok(Cgroupfs)
        );
        assert_eq!(decide(Cgroupfs, RuntimeDriver::Unknown), Ok(Cgroupfs));
        assert_eq!(
            decide(Cgroupfs, RuntimeDriver::FromStatus(Cgroupfs)),
            Ok(Cgroupfs)
        );
        let err = decide(Cgroupfs, RuntimeDriver::FromStatus(Systemd)).expect_err("mismatch");
        let text = err.to_string();
        assert!(
            text.contains("\"cgroupfs\" (node.cgroupDriver)")
                && text.contains("uses \"systemd\"")
                && text.contains("set node.cgroupDriver: systemd"),
            "{text}"
        );
    }
}

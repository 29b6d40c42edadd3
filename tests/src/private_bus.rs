//! A private `dbus-daemon` for a test: its own configuration and socket in
//! a temp dir, stopped by PID when dropped; never the host's system bus.
//! The doubles of systemd and logind serve on one.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::wait_for;

/// The `dbus-daemon` binary, when installed.
pub fn dbus_daemon() -> Option<PathBuf> {
    ["/usr/bin/dbus-daemon", "/bin/dbus-daemon"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// The policy of a test's private bus: any local client (root in tests)
/// may connect, own any name and call anything.
pub const BUS_POLICY: &str = r#"  <policy context="default">
    <allow user="*"/>
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>"#;

fn bus_config(socket: &Path) -> String {
    // No <user>, <pidfile>, <servicedir>, <includedir> or <syslog/>: the
    // daemon writes nothing but its socket, activates nothing, and lets
    // any local client (root in tests) own and call anything.
    format!(
        r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>keelson-test</type>
  <listen>unix:path={}</listen>
  <auth>EXTERNAL</auth>
{}
</busconfig>
"#,
        socket.display(),
        BUS_POLICY
    )
}

/// The running daemon.
pub struct PrivateBus {
    dir: tempfile::TempDir,
    daemon: Option<Child>,
    address: String,
}

impl std::fmt::Debug for PrivateBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrivateBus")
            .field("address", &self.address)
            .field("pid", &self.daemon.as_ref().map(Child::id))
            .finish()
    }
}

impl PrivateBus {
    /// Starts the daemon and returns it with a connection to it.
    pub async fn start() -> Result<(PrivateBus, zbus::Connection), String> {
        let bin = dbus_daemon().ok_or("dbus-daemon is not installed")?;
        let dir = tempfile::Builder::new()
            .prefix("keelson-dbus-")
            .tempdir()
            .map_err(|e| format!("temp dir: {e}"))?;
        let socket = dir.path().join("bus");
        let config = dir.path().join("bus.conf");
        std::fs::write(&config, bus_config(&socket)).map_err(|e| format!("bus.conf: {e}"))?;
        let daemon = Command::new(bin)
            .arg(format!("--config-file={}", config.display()))
            .args(["--nofork", "--nopidfile", "--nosyslog"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // Its own complaints stay visible (as root without
            // CAP_SYS_RESOURCE it says once that it cannot raise its fd
            // limit, which is harmless).
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("starting dbus-daemon: {e}"))?;
        let address = format!("unix:path={}", socket.display());
        // From here on, a failure drops `bus`, which stops the daemon.
        let bus = PrivateBus {
            dir,
            daemon: Some(daemon),
            address,
        };
        let conn = wait_for(
            "the private dbus-daemon to accept connections",
            Duration::from_secs(30),
            Duration::from_millis(50),
            || async {
                if !socket.exists() {
                    return Err("no socket yet".to_string());
                }
                zbus::connection::Builder::address(bus.address.as_str())
                    .build()
                    .await
                    .map_err(|e| e.to_string())
            },
        )
        .await
        .map_err(|e| e.to_string())?;
        Ok((bus, conn))
    }

    /// The bus's address.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The directory of the bus's socket and configuration.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for PrivateBus {
    fn drop(&mut self) {
        if let Some(mut c) = self.daemon.take() {
            // SIGKILL to this child's PID only, then reap it.
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

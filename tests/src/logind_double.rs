//! A double of systemd-logind for graceful node shutdown's tests, on a
//! private `dbus-daemon` ([`PrivateBus`]), never the host's logind.
//!
//! It answers as logind does (`org.freedesktop.login1.Manager` at
//! `/org/freedesktop/login1`): the `InhibitDelayMaxUSec` property, and
//! `Inhibit(what, who, why, mode)` returning a file descriptor whose
//! closing releases the lock (the double keeps the other end of a socket
//! pair and sees it close). The test sends `PrepareForShutdown`. It also
//! answers the one systemd call the node makes
//! (`org.freedesktop.systemd1.Manager.KillUnit`): SIGHUP to
//! `systemd-logind.service` makes the double read `InhibitDelayMaxSec=`
//! from the `*.conf` drop-ins of its configuration directory again, as
//! logind reads `/etc/systemd/logind.conf.d` on SIGHUP.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use zbus::object_server::SignalEmitter;

use crate::private_bus::PrivateBus;

/// One inhibitor lock the double handed out.
#[derive(Debug)]
pub struct Inhibitor {
    /// `what`, `who`, `why`, `mode` as asked.
    pub args: [String; 4],
    held: UnixStream,
}

impl Inhibitor {
    /// Whether the caller still holds it (its descriptor is open).
    pub fn is_held(&self) -> bool {
        let mut buf = [0u8; 1];
        if self.held.set_nonblocking(true).is_err() {
            return false;
        }
        match (&self.held).read(&mut buf) {
            Ok(0) => false,
            Ok(_) => true,
            Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
        }
    }
}

#[derive(Debug, Default)]
struct State {
    delay_usec: u64,
    inhibitors: Vec<Inhibitor>,
    kill_unit_calls: Vec<(String, String, i32)>,
}

type Shared = Arc<Mutex<State>>;

fn lock(s: &Shared) -> std::sync::MutexGuard<'_, State> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

struct Login {
    state: Shared,
}

#[zbus::interface(name = "org.freedesktop.login1.Manager")]
impl Login {
    async fn inhibit(
        &self,
        what: String,
        who: String,
        why: String,
        mode: String,
    ) -> zbus::fdo::Result<zbus::OwnedFd> {
        let (given, kept) =
            UnixStream::pair().map_err(|e| zbus::fdo::Error::Failed(e.to_string()))?;
        lock(&self.state).inhibitors.push(Inhibitor {
            args: [what, who, why, mode],
            held: kept,
        });
        Ok(zbus::OwnedFd::from(std::os::fd::OwnedFd::from(given)))
    }

    #[zbus(property, name = "InhibitDelayMaxUSec")]
    async fn inhibit_delay_max_usec(&self) -> u64 {
        lock(&self.state).delay_usec
    }

    #[zbus(signal)]
    async fn prepare_for_shutdown(emitter: &SignalEmitter<'_>, start: bool) -> zbus::Result<()>;
}

struct Systemd {
    state: Shared,
    conf_dir: PathBuf,
}

/// `InhibitDelayMaxSec=` of the last drop-in (in name order) that sets it.
fn configured_delay(dir: &Path) -> Option<u64> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "conf"))
        .collect();
    files.sort();
    files
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|text| {
            text.lines()
                .filter_map(|l| l.trim().strip_prefix("InhibitDelayMaxSec="))
                .filter_map(|v| v.trim().parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .last()
}

#[zbus::interface(name = "org.freedesktop.systemd1.Manager")]
impl Systemd {
    async fn kill_unit(&self, name: String, who: String, signal: i32) -> zbus::fdo::Result<()> {
        let mut s = lock(&self.state);
        s.kill_unit_calls.push((name.clone(), who, signal));
        if name == "systemd-logind.service"
            && signal == 1
            && let Some(secs) = configured_delay(&self.conf_dir)
        {
            s.delay_usec = secs * 1_000_000;
        }
        Ok(())
    }
}

/// The private bus and the double on it.
pub struct LogindDouble {
    bus: PrivateBus,
    conn: zbus::Connection,
    state: Shared,
    conf_dir: PathBuf,
}

impl std::fmt::Debug for LogindDouble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogindDouble")
            .field("bus", &self.bus)
            .finish_non_exhaustive()
    }
}

const LOGIN_PATH: &str = "/org/freedesktop/login1";

impl LogindDouble {
    /// Starts the bus and the double with logind's maximum delay at
    /// `delay_secs`; drop-ins are read from `<bus dir>/logind.conf.d`.
    pub async fn start(delay_secs: u64) -> Result<LogindDouble, String> {
        let (bus, conn) = PrivateBus::start().await?;
        let conf_dir = bus.dir().join("logind.conf.d");
        let state: Shared = Arc::new(Mutex::new(State {
            delay_usec: delay_secs * 1_000_000,
            ..State::default()
        }));
        let server = conn.object_server();
        server
            .at(
                LOGIN_PATH,
                Login {
                    state: state.clone(),
                },
            )
            .await
            .map_err(|e| format!("serving login1: {e}"))?;
        server
            .at(
                "/org/freedesktop/systemd1",
                Systemd {
                    state: state.clone(),
                    conf_dir: conf_dir.clone(),
                },
            )
            .await
            .map_err(|e| format!("serving systemd1: {e}"))?;
        for name in ["org.freedesktop.login1", "org.freedesktop.systemd1"] {
            conn.request_name(name)
                .await
                .map_err(|e| format!("owning {name}: {e}"))?;
        }
        Ok(LogindDouble {
            bus,
            conn,
            state,
            conf_dir,
        })
    }

    /// The bus's address (keelson's `logind_bus`).
    pub fn address(&self) -> &str {
        self.bus.address()
    }

    /// Where the node is to write logind's drop-in (`logind_conf_dir`).
    pub fn conf_dir(&self) -> &Path {
        &self.conf_dir
    }

    /// logind's current maximum delay, in seconds.
    pub fn delay_secs(&self) -> u64 {
        lock(&self.state).delay_usec / 1_000_000
    }

    /// The `KillUnit` calls so far: unit, who, signal.
    pub fn kill_unit_calls(&self) -> Vec<(String, String, i32)> {
        lock(&self.state).kill_unit_calls.clone()
    }

    /// Every lock handed out, in order: its arguments and whether it is held.
    pub fn inhibitors(&self) -> Vec<([String; 4], bool)> {
        lock(&self.state)
            .inhibitors
            .iter()
            .map(|i| (i.args.clone(), i.is_held()))
            .collect()
    }

    /// Sends `PrepareForShutdown(start)`, as logind does when a shutdown
    /// is scheduled (`true`) or cancelled (`false`).
    pub async fn prepare_for_shutdown(&self, start: bool) -> Result<(), String> {
        let iface = self
            .conn
            .object_server()
            .interface::<_, Login>(LOGIN_PATH)
            .await
            .map_err(|e| format!("login1 interface: {e}"))?;
        Login::prepare_for_shutdown(iface.signal_emitter(), start)
            .await
            .map_err(|e| format!("PrepareForShutdown: {e}"))
    }
}

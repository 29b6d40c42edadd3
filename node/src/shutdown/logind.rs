//! systemd-logind over the system D-Bus, as kubelet talks to it for
//! graceful node shutdown (pkg/kubelet/nodeshutdown/systemd/inhibit_linux.go):
//! the `InhibitDelayMaxUSec` property, a `delay` inhibitor lock on
//! `shutdown` (a file descriptor: the lock holds while it is open), the
//! `PrepareForShutdown` signal, and raising logind's maximum delay with a
//! drop-in (`99-kubelet.conf`) that logind reads again on SIGHUP, sent by
//! systemd's `KillUnit`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;

/// Where kubelet writes its logind drop-in (`logindConfigDirectory`).
pub const CONF_DIR: &str = "/etc/systemd/logind.conf.d";
/// The drop-in's name (`kubeletLogindConf`).
pub const CONF_FILE: &str = "99-kubelet.conf";

/// A D-Bus call that failed, with what was asked.
#[derive(Debug, thiserror::Error)]
pub enum LogindError {
    /// No connection to the bus.
    #[error("cannot connect to the system bus at {address}: {message}")]
    Connect {
        /// The bus address.
        address: String,
        /// The D-Bus error.
        message: String,
    },
    /// A call to logind or systemd failed.
    #[error("{what}: {message}")]
    Call {
        /// What was asked (kubelet's wording).
        what: &'static str,
        /// The D-Bus error.
        message: String,
    },
    /// The drop-in could not be written.
    #[error("failed writing logind shutdown inhibit override file {path}: {source}")]
    Override {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

#[zbus::proxy(
    interface = "org.freedesktop.login1.Manager",
    default_service = "org.freedesktop.login1",
    default_path = "/org/freedesktop/login1"
)]
trait Login {
    fn inhibit(&self, what: &str, who: &str, why: &str, mode: &str) -> zbus::Result<zbus::OwnedFd>;

    #[zbus(signal)]
    fn prepare_for_shutdown(&self, start: bool) -> zbus::Result<()>;

    #[zbus(property, name = "InhibitDelayMaxUSec")]
    fn inhibit_delay_max_usec(&self) -> zbus::Result<u64>;
}

#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1"
)]
trait Systemd {
    fn kill_unit(&self, name: &str, who: &str, signal: i32) -> zbus::Result<()>;
}

/// An inhibitor lock: logind delays the shutdown while it is held; dropping
/// it closes the descriptor and releases it.
#[derive(Debug)]
pub struct InhibitLock(#[allow(dead_code)] zbus::OwnedFd);

/// A connection to logind (and systemd, to reload logind).
pub struct Logind {
    conn: zbus::Connection,
    login: LoginProxy<'static>,
    conf_dir: PathBuf,
}

impl std::fmt::Debug for Logind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Logind").finish_non_exhaustive()
    }
}

/// `PrepareForShutdown` as a stream of its argument (`true`: the shutdown
/// starts, `false`: it was cancelled); ends when the connection does.
pub type ShutdownEvents = std::pin::Pin<Box<dyn futures::Stream<Item = bool> + Send>>;

impl Logind {
    /// Connects to the bus at `address` (`None`: the system bus,
    /// `DBUS_SYSTEM_BUS_ADDRESS` or the well-known socket); the drop-in goes
    /// to `conf_dir`.
    pub async fn connect(address: Option<&str>, conf_dir: &Path) -> Result<Logind, LogindError> {
        let shown = address.unwrap_or("system bus").to_string();
        let fail = |e: zbus::Error| LogindError::Connect {
            address: shown.clone(),
            message: e.to_string(),
        };
        let conn = match address {
            Some(a) => zbus::connection::Builder::address(a)
                .build()
                .await
                .map_err(fail)?,
            None => zbus::Connection::system().await.map_err(fail)?,
        };
        let login = LoginProxy::builder(&conn)
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await
            .map_err(fail)?;
        Ok(Logind {
            conn,
            login,
            conf_dir: conf_dir.to_path_buf(),
        })
    }

    /// logind's maximum inhibit delay (`CurrentInhibitDelay`).
    pub async fn inhibit_delay(&self) -> Result<Duration, LogindError> {
        let usec = self
            .login
            .inhibit_delay_max_usec()
            .await
            .map_err(|e| LogindError::Call {
                what: "failed reading InhibitDelayMaxUSec property from logind",
                message: e.to_string(),
            })?;
        Ok(Duration::from_micros(usec))
    }

    /// Takes a `delay` lock on `shutdown` (`InhibitShutdown`).
    pub async fn inhibit_shutdown(&self) -> Result<InhibitLock, LogindError> {
        self.login
            .inhibit(
                "shutdown",
                "kubelet",
                "Kubelet needs time to handle node shutdown",
                "delay",
            )
            .await
            .map(InhibitLock)
            .map_err(|e| LogindError::Call {
                what: "failed creating systemd inhibitor",
                message: e.to_string(),
            })
    }

    /// The `PrepareForShutdown` signals from now on (`MonitorShutdown`).
    pub async fn shutdown_events(&self) -> Result<ShutdownEvents, LogindError> {
        let stream = self
            .login
            .receive_prepare_for_shutdown()
            .await
            .map_err(|e| LogindError::Call {
                what: "failed to monitor shutdown",
                message: e.to_string(),
            })?;
        Ok(Box::pin(stream.filter_map(|signal| async move {
            match signal.args() {
                Ok(a) => Some(a.start),
                Err(e) => {
                    tracing::error!(error = %e, "Failed obtaining shutdown event, PrepareForShutdown event was not bool type as expected");
                    None
                }
            }
        })))
    }

    /// Writes the drop-in raising logind's maximum delay to `delay`
    /// (`OverrideInhibitDelay`).
    pub fn override_inhibit_delay(&self, delay: Duration) -> Result<PathBuf, LogindError> {
        let path = self.conf_dir.join(CONF_FILE);
        let fail = |source| LogindError::Override {
            path: path.display().to_string(),
            source,
        };
        std::fs::create_dir_all(&self.conf_dir).map_err(fail)?;
        let text = format!(
            "# Kubelet logind override\n[Login]\nInhibitDelayMaxSec={}\n",
            delay.as_secs_f64().round()
        );
        std::fs::write(&path, text).map_err(fail)?;
        Ok(path)
    }

    /// Has systemd send SIGHUP to logind, which reads its configuration
    /// again (`ReloadLogindConf`; asynchronous).
    pub async fn reload_logind_conf(&self) -> Result<(), LogindError> {
        let fail = |e: zbus::Error| LogindError::Call {
            what: "unable to reload logind conf",
            message: e.to_string(),
        };
        let systemd = SystemdProxy::new(&self.conn).await.map_err(fail)?;
        systemd
            .kill_unit("systemd-logind.service", "all", 1)
            .await
            .map_err(fail)
    }
}

//! systemd's unit manager over D-Bus (zbus), as libcontainer's
//! `dbusConnManager` talks to it (`opencontainers/cgroups/systemd/dbus.go`,
//! `common.go`): the system bus (`DBUS_SYSTEM_BUS_ADDRESS`, else
//! `/run/dbus/system_bus_socket`), `StartTransientUnit` and `StopUnit`
//! followed by waiting for the job's `JobRemoved` signal (30 s), a failed
//! start reset with `ResetFailedUnit`, and a broken connection made again
//! on the next call.
//!
//! The cgroup driver's callers are synchronous (they also write cgroup
//! files), and some run on the async runtime's threads; zbus is async. So
//! the connection lives on a thread of its own with a single-threaded
//! runtime, and each call is a message to it answered over a channel:
//! callable from anywhere, never nesting runtimes.

use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::mpsc;

use super::properties::{PropValue, Property};
use super::units::{UnitError, UnitManager, parse_version};

/// How long a job may take (libcontainer's timeout).
pub const JOB_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a caller waits for the connection thread (a job plus a reconnect).
const CALL_TIMEOUT: Duration = Duration::from_secs(75);

#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1"
)]
trait Manager {
    fn start_transient_unit(
        &self,
        name: &str,
        mode: &str,
        properties: &[(&str, zbus::Variant<'_>)],
        aux: &[(&str, &[(&str, zbus::Variant<'_>)])],
    ) -> zbus::Result<zbus::OwnedObjectPath>;

    fn stop_unit(&self, name: &str, mode: &str) -> zbus::Result<zbus::OwnedObjectPath>;

    fn set_unit_properties(
        &self,
        name: &str,
        runtime: bool,
        properties: &[(&str, zbus::Variant<'_>)],
    ) -> zbus::Result<()>;

    fn reset_failed_unit(&self, name: &str) -> zbus::Result<()>;

    #[zbus(signal)]
    fn job_removed(
        &self,
        id: u32,
        job: zbus::ObjectPath<'_>,
        unit: &str,
        result: &str,
    ) -> zbus::Result<()>;

    #[zbus(property(emits_changed_signal = "const"))]
    fn version(&self) -> zbus::Result<String>;
}

enum Op {
    Version,
    Start(String, Vec<Property>),
    Set(String, Vec<Property>),
    Stop(String),
    Reset(String),
}

impl Op {
    fn method(&self) -> &'static str {
        match self {
            Op::Version => "Version",
            Op::Start(..) => "StartTransientUnit",
            Op::Set(..) => "SetUnitProperties",
            Op::Stop(_) => "StopUnit",
            Op::Reset(_) => "ResetFailedUnit",
        }
    }

    fn unit(&self) -> &str {
        match self {
            Op::Version => "",
            Op::Start(u, _) | Op::Set(u, _) | Op::Stop(u) | Op::Reset(u) => u,
        }
    }
}

struct Call {
    op: Op,
    reply: std_mpsc::SyncSender<Result<i64, UnitError>>,
}

/// systemd reached over D-Bus; cheap to share (calls go to one thread).
#[derive(Debug)]
pub struct DbusUnits {
    tx: mpsc::UnboundedSender<Call>,
    address: String,
}

impl DbusUnits {
    /// Talks to systemd on the system bus (`DBUS_SYSTEM_BUS_ADDRESS`, else
    /// the well-known socket). Nothing is connected until the first call.
    pub fn system() -> Result<DbusUnits, UnitError> {
        let address = zbus::Address::system().map_err(|e| UnitError::Connect {
            address: "system bus".into(),
            message: e.to_string(),
        })?;
        Self::at(&address.to_string())
    }

    /// Talks to systemd on the bus at `address` (a D-Bus address such as
    /// `unix:path=/run/dbus/system_bus_socket`).
    pub fn at(address: &str) -> Result<DbusUnits, UnitError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let addr = address.to_string();
        std::thread::Builder::new()
            .name("systemd-dbus".into())
            .spawn(move || serve(addr, rx))
            .map_err(|e| UnitError::Connect {
                address: address.to_string(),
                message: format!("starting the D-Bus thread: {e}"),
            })?;
        Ok(DbusUnits {
            tx,
            address: address.to_string(),
        })
    }

    /// The bus address.
    pub fn address(&self) -> &str {
        &self.address
    }

    fn call(&self, op: Op) -> Result<i64, UnitError> {
        let (method, unit) = (op.method(), op.unit().to_string());
        let (reply, rx) = std_mpsc::sync_channel(1);
        let gone = || UnitError::Connect {
            address: self.address.clone(),
            message: "the D-Bus thread is gone".into(),
        };
        self.tx.send(Call { op, reply }).map_err(|_| gone())?;
        match rx.recv_timeout(CALL_TIMEOUT) {
            Ok(r) => r,
            Err(std_mpsc::RecvTimeoutError::Timeout) => Err(UnitError::Call {
                method,
                unit,
                name: "timeout".into(),
                message: format!("no answer within {}s", CALL_TIMEOUT.as_secs()),
            }),
            Err(std_mpsc::RecvTimeoutError::Disconnected) => Err(gone()),
        }
    }
}

impl UnitManager for DbusUnits {
    fn version(&self) -> Result<i64, UnitError> {
        self.call(Op::Version)
    }

    fn start_transient_unit(&self, name: &str, props: &[Property]) -> Result<(), UnitError> {
        self.call(Op::Start(name.to_string(), props.to_vec()))
            .map(drop)
    }

    fn set_unit_properties(&self, name: &str, props: &[Property]) -> Result<(), UnitError> {
        self.call(Op::Set(name.to_string(), props.to_vec()))
            .map(drop)
    }

    fn stop_unit(&self, name: &str) -> Result<(), UnitError> {
        self.call(Op::Stop(name.to_string())).map(drop)
    }

    fn reset_failed_unit(&self, name: &str) -> Result<(), UnitError> {
        self.call(Op::Reset(name.to_string())).map(drop)
    }
}

/// The connection thread: one call at a time, reconnecting when the
/// connection broke.
fn serve(address: String, mut rx: mpsc::UnboundedReceiver<Call>) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let err = UnitError::Connect {
                address,
                message: format!("runtime: {e}"),
            };
            while let Some(c) = rx.blocking_recv() {
                let _ = c.reply.send(Err(err.clone()));
            }
            return;
        }
    };
    rt.block_on(async move {
        let mut conn: Option<ManagerProxy<'static>> = None;
        while let Some(call) = rx.recv().await {
            let mut result = Err(UnitError::Connect {
                address: address.clone(),
                message: "not attempted".into(),
            });
            // A stale connection (systemd or the bus restarted) is made
            // again once, as libcontainer's retryOnDisconnect.
            for _ in 0..2 {
                let proxy = match &conn {
                    Some(p) => p.clone(),
                    None => match connect(&address).await {
                        Ok(p) => {
                            conn = Some(p.clone());
                            p
                        }
                        Err(e) => {
                            result = Err(e);
                            break;
                        }
                    },
                };
                result = run(&proxy, &call.op).await;
                match &result {
                    Err(UnitError::Connect { .. }) => conn = None,
                    _ => break,
                }
            }
            let _ = call.reply.send(result);
        }
    });
}

async fn connect(address: &str) -> Result<ManagerProxy<'static>, UnitError> {
    let fail = |e: zbus::Error| UnitError::Connect {
        address: address.to_string(),
        message: e.to_string(),
    };
    let conn = zbus::connection::Builder::address(address)
        .build()
        .await
        .map_err(fail)?;
    ManagerProxy::builder(&conn)
        .cache_properties(zbus::proxy::CacheProperties::No)
        .build()
        .await
        .map_err(fail)
}

fn variant(v: &PropValue) -> zbus::Variant<'_> {
    match v {
        PropValue::Bool(b) => zbus::Variant::from(*b),
        PropValue::U64(n) => zbus::Variant::from(*n),
        PropValue::Str(s) => zbus::Variant::from(s.as_str()),
        PropValue::Strs(l) => zbus::Variant::from(l.iter().map(String::as_str).collect::<Vec<_>>()),
        PropValue::U32s(l) => zbus::Variant::from(l.clone()),
    }
}

fn call_error(method: &'static str, unit: &str, e: zbus::Error) -> UnitError {
    match e {
        zbus::Error::MethodError(name, message, _) => UnitError::Call {
            method,
            unit: unit.to_string(),
            name: name.to_string(),
            message: message.unwrap_or_default(),
        },
        zbus::Error::FDO(fdo) => {
            let text = fdo.to_string();
            let (name, message) = text
                .split_once(": ")
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .unwrap_or((text.clone(), String::new()));
            UnitError::Call {
                method,
                unit: unit.to_string(),
                name,
                message,
            }
        }
        other => UnitError::Connect {
            address: "system bus".into(),
            message: format!("{method} {unit}: {other}"),
        },
    }
}

async fn run(proxy: &ManagerProxy<'static>, op: &Op) -> Result<i64, UnitError> {
    let method = op.method();
    match op {
        Op::Version => {
            let v = proxy
                .version()
                .await
                .map_err(|e| call_error(method, "", e))?;
            parse_version(&v).ok_or_else(|| UnitError::Call {
                method,
                unit: String::new(),
                name: "unparsable".into(),
                message: format!("systemd version {v:?}"),
            })
        }
        Op::Start(unit, props) => {
            let vs: Vec<(&str, zbus::Variant<'_>)> = props
                .iter()
                .map(|(k, v)| (k.as_str(), variant(v)))
                .collect();
            let mut removed = proxy
                .receive_job_removed()
                .await
                .map_err(|e| call_error(method, unit, e))?;
            let job = proxy
                .start_transient_unit(unit, "replace", &vs, &[])
                .await
                .map_err(|e| call_error(method, unit, e))?;
            match wait_job(&mut removed, &job).await {
                Some(r) if r == "done" => Ok(0),
                Some(r) => {
                    let _ = proxy.reset_failed_unit(unit).await;
                    Err(UnitError::JobFailed {
                        unit: unit.clone(),
                        result: r,
                    })
                }
                None => {
                    let _ = proxy.reset_failed_unit(unit).await;
                    Err(UnitError::Timeout {
                        action: "create",
                        unit: unit.clone(),
                    })
                }
            }
        }
        Op::Set(unit, props) => {
            let vs: Vec<(&str, zbus::Variant<'_>)> = props
                .iter()
                .map(|(k, v)| (k.as_str(), variant(v)))
                .collect();
            proxy
                .set_unit_properties(unit, true, &vs)
                .await
                .map_err(|e| call_error(method, unit, e))?;
            Ok(0)
        }
        Op::Stop(unit) => {
            let mut removed = proxy
                .receive_job_removed()
                .await
                .map_err(|e| call_error(method, unit, e))?;
            let job = proxy
                .stop_unit(unit, "replace")
                .await
                .map_err(|e| call_error(method, unit, e))?;
            match wait_job(&mut removed, &job).await {
                Some(r) if r == "done" => Ok(0),
                Some(r) => {
                    tracing::warn!(unit = %unit, result = %r, "error removing unit; continuing");
                    Ok(0)
                }
                None => Err(UnitError::Timeout {
                    action: "remove",
                    unit: unit.clone(),
                }),
            }
        }
        Op::Reset(unit) => {
            proxy
                .reset_failed_unit(unit)
                .await
                .map_err(|e| call_error(method, unit, e))?;
            Ok(0)
        }
    }
}

/// The result of `job` from its `JobRemoved` signal, or `None` after
/// [`JOB_TIMEOUT`].
async fn wait_job(removed: &mut JobRemovedStream, job: &zbus::OwnedObjectPath) -> Option<String> {
    let wait = async {
        while let Some(signal) = removed.next().await {
            let Ok(args) = signal.args() else { continue };
            if args.job.as_str() == job.as_str() {
                return Some(args.result.to_string());
            }
        }
        None
    };
    tokio::time::timeout(JOB_TIMEOUT, wait).await.ok().flatten()
}

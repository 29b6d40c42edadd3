//! A double of systemd's unit manager for the `systemd` cgroup driver's
//! tests: `org.freedesktop.systemd1` on a private `dbus-daemon` the test
//! starts (its own configuration and socket in a temp dir, stopped by PID
//! on drop), never the host's system bus or systemd.
//!
//! It answers the calls keelson makes as systemd does
//! (`org.freedesktop.systemd1.Manager`): `StartTransientUnit` (an existing
//! unit is `org.freedesktop.systemd1.UnitExists`), `SetUnitProperties`,
//! `StopUnit` (an unknown unit is `org.freedesktop.systemd1.NoSuchUnit`),
//! `ResetFailedUnit`, the `Version` property, and a `JobRemoved` signal
//! with result `done` for each job. It records every call with its
//! properties, keeps the units that are up with their properties, and
//! makes and removes a slice's directory in a test-owned cgroup tree where
//! systemd would make and remove the cgroup (`a-b.slice` at
//! `<tree>/a.slice/a-b.slice`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use keelson::node::cgroups::systemd::name::expand_slice;
use keelson::node::cgroups::systemd::properties::{PropValue, Property};
use zbus::object_server::SignalEmitter;
use zbus::{ObjectPath, OwnedObjectPath, OwnedVariant, Variant};

use crate::private_bus::PrivateBus;

/// The version the double reports (Debian 12's systemd).
pub const VERSION: &str = "252.38-1~deb12u1";

/// One call the double answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitCall {
    /// The D-Bus method (`StartTransientUnit`, `SetUnitProperties`, ...).
    pub method: &'static str,
    /// The unit.
    pub unit: String,
    /// The properties sent (start and set).
    pub properties: Vec<Property>,
}

#[derive(Debug, Default)]
struct State {
    units: BTreeMap<String, Vec<Property>>,
    calls: Vec<UnitCall>,
}

/// The private bus and the double serving on it.
pub struct SystemdDouble {
    bus: PrivateBus,
    state: Arc<Mutex<State>>,
    _conn: zbus::Connection,
}

impl std::fmt::Debug for SystemdDouble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SystemdDouble")
            .field("bus", &self.bus)
            .finish_non_exhaustive()
    }
}

pub use crate::private_bus::{BUS_POLICY, dbus_daemon};

impl SystemdDouble {
    /// Starts a private `dbus-daemon` and the double on it. With
    /// `cgroup_tree`, slices get directories there as systemd would make
    /// their cgroups.
    pub async fn start(cgroup_tree: Option<PathBuf>) -> Result<SystemdDouble, String> {
        let (bus, conn) = PrivateBus::start().await?;
        let state = Arc::new(Mutex::new(State::default()));
        let manager = Manager {
            state: state.clone(),
            tree: cgroup_tree,
            jobs: AtomicU32::new(0),
        };
        conn.object_server()
            .at("/org/freedesktop/systemd1", manager)
            .await
            .map_err(|e| format!("serving the manager: {e}"))?;
        conn.request_name("org.freedesktop.systemd1")
            .await
            .map_err(|e| format!("owning org.freedesktop.systemd1: {e}"))?;
        Ok(SystemdDouble {
            bus,
            state,
            _conn: conn,
        })
    }

    /// The private bus's address (keelson's `systemd_bus`).
    pub fn address(&self) -> &str {
        self.bus.address()
    }

    /// The directory of the bus's socket and configuration.
    pub fn dir(&self) -> &Path {
        self.bus.dir()
    }

    /// The units that are up (started, not stopped), by name.
    pub fn units(&self) -> Vec<String> {
        self.lock().units.keys().cloned().collect()
    }

    /// A unit's property as last set, if the unit is up.
    pub fn property(&self, unit: &str, name: &str) -> Option<PropValue> {
        self.lock()
            .units
            .get(unit)?
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<UnitCall> {
        self.lock().calls.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[derive(Debug, zbus::DBusError)]
#[zbus(prefix = "org.freedesktop.systemd1")]
enum SystemdError {
    #[zbus(error)]
    ZBus(zbus::Error),
    UnitExists(String),
    NoSuchUnit(String),
}

struct Manager {
    state: Arc<Mutex<State>>,
    tree: Option<PathBuf>,
    jobs: AtomicU32,
}

fn prop_value(v: &Variant<'_>) -> PropValue {
    match v {
        Variant::Bool(b) => PropValue::Bool(*b),
        Variant::U64(n) => PropValue::U64(*n),
        Variant::Str(s) => PropValue::Str(s.to_string()),
        Variant::Variant(inner) => prop_value(inner),
        Variant::Array(a) => {
            let items: Vec<&Variant<'_>> = a.iter().collect();
            if items.iter().all(|i| matches!(i, Variant::U32(_))) && !items.is_empty() {
                PropValue::U32s(
                    items
                        .iter()
                        .filter_map(|i| match i {
                            Variant::U32(n) => Some(*n),
                            _ => None,
                        })
                        .collect(),
                )
            } else {
                PropValue::Strs(
                    items
                        .iter()
                        .map(|i| match i {
                            Variant::Str(s) => s.to_string(),
                            other => format!("{other:?}"),
                        })
                        .collect(),
                )
            }
        }
        // Nothing keelson sends; kept visible in assertions.
        other => PropValue::Str(format!("unexpected D-Bus type: {other:?}")),
    }
}

fn properties(props: &[(String, OwnedVariant)]) -> Vec<Property> {
    props
        .iter()
        .map(|(k, v)| (k.clone(), prop_value(v)))
        .collect()
}

impl Manager {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn cgroup_dir(&self, unit: &str) -> Option<PathBuf> {
        let tree = self.tree.as_ref()?;
        let path = expand_slice(unit).ok()?;
        Some(tree.join(path.trim_start_matches('/')))
    }

    fn next_job(&self) -> Result<OwnedObjectPath, SystemdError> {
        let id = self.jobs.fetch_add(1, Ordering::SeqCst) + 1;
        ObjectPath::try_from(format!("/org/freedesktop/systemd1/job/{id}"))
            .map(OwnedObjectPath::from)
            .map_err(SystemdError::ZBus)
    }

    async fn job_done(
        &self,
        emitter: &SignalEmitter<'_>,
        job: &OwnedObjectPath,
        unit: &str,
    ) -> Result<(), SystemdError> {
        let id = job
            .as_str()
            .rsplit('/')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        Manager::job_removed(emitter, id, job.as_ref(), unit, "done").await?;
        Ok(())
    }
}

#[zbus::interface(name = "org.freedesktop.systemd1.Manager")]
impl Manager {
    async fn start_transient_unit(
        &self,
        name: String,
        _mode: String,
        properties_in: Vec<(String, OwnedVariant)>,
        _aux: Vec<(String, Vec<(String, OwnedVariant)>)>,
        #[zbus(signal_emitter)] emitter: SignalEmitter<'_>,
    ) -> Result<OwnedObjectPath, SystemdError> {
        let props = properties(&properties_in);
        {
            let mut st = self.lock();
            st.calls.push(UnitCall {
                method: "StartTransientUnit",
                unit: name.clone(),
                properties: props.clone(),
            });
            if st.units.contains_key(&name) {
                return Err(SystemdError::UnitExists(format!(
                    "Unit {name} was already loaded or has a fragment file."
                )));
            }
            st.units.insert(name.clone(), props);
        }
        if let Some(dir) = self.cgroup_dir(&name) {
            std::fs::create_dir_all(&dir)
                .map_err(|e| SystemdError::ZBus(zbus::Error::Failure(e.to_string())))?;
        }
        let job = self.next_job()?;
        self.job_done(&emitter, &job, &name).await?;
        Ok(job)
    }

    async fn set_unit_properties(
        &self,
        name: String,
        _runtime: bool,
        properties_in: Vec<(String, OwnedVariant)>,
    ) -> Result<(), SystemdError> {
        let props = properties(&properties_in);
        let mut st = self.lock();
        st.calls.push(UnitCall {
            method: "SetUnitProperties",
            unit: name.clone(),
            properties: props.clone(),
        });
        let Some(unit) = st.units.get_mut(&name) else {
            return Err(SystemdError::NoSuchUnit(format!("Unit {name} not loaded.")));
        };
        for (k, v) in props {
            unit.retain(|(n, _)| *n != k);
            unit.push((k, v));
        }
        Ok(())
    }

    async fn stop_unit(
        &self,
        name: String,
        _mode: String,
        #[zbus(signal_emitter)] emitter: SignalEmitter<'_>,
    ) -> Result<OwnedObjectPath, SystemdError> {
        {
            let mut st = self.lock();
            st.calls.push(UnitCall {
                method: "StopUnit",
                unit: name.clone(),
                properties: Vec::new(),
            });
            if st.units.remove(&name).is_none() {
                return Err(SystemdError::NoSuchUnit(format!("Unit {name} not loaded.")));
            }
        }
        if let Some(dir) = self.cgroup_dir(&name) {
            remove_cgroup_dir(&dir);
        }
        let job = self.next_job()?;
        self.job_done(&emitter, &job, &name).await?;
        Ok(job)
    }

    async fn reset_failed_unit(&self, name: String) -> Result<(), SystemdError> {
        self.lock().calls.push(UnitCall {
            method: "ResetFailedUnit",
            unit: name,
            properties: Vec::new(),
        });
        Ok(())
    }

    #[zbus(property(emits_changed_signal = "const"))]
    fn version(&self) -> String {
        VERSION.to_string()
    }

    #[zbus(signal)]
    async fn job_removed(
        emitter: &SignalEmitter<'_>,
        id: u32,
        job: ObjectPath<'_>,
        unit: &str,
        result: &str,
    ) -> zbus::Result<()>;
}

/// Removes a stopped slice's directory as systemd removes its cgroup: the
/// fake tree's control files are plain files and go with it; a directory
/// that still holds cgroups (directories) stays, as a real rmdir fails.
fn remove_cgroup_dir(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let entries: Vec<_> = entries.flatten().collect();
    if entries.iter().any(|e| e.path().is_dir()) {
        return;
    }
    for e in entries {
        let _ = std::fs::remove_file(e.path());
    }
    let _ = std::fs::remove_dir(dir);
}

//! The narrow interface to systemd's unit manager (`org.freedesktop.systemd1.Manager`)
//! the systemd cgroup driver uses. The real implementation talks D-Bus
//! ([`super::dbus::DbusUnits`]); unit tests use an in-memory one.

use super::properties::Property;

/// A call to systemd failed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum UnitError {
    /// systemd could not be reached.
    #[error("cannot reach systemd over D-Bus ({address}): {message}")]
    Connect {
        /// The bus address tried.
        address: String,
        /// Why.
        message: String,
    },
    /// systemd answered with a D-Bus error.
    #[error("systemd {method} {unit}: {name}: {message}")]
    Call {
        /// The method.
        method: &'static str,
        /// The unit.
        unit: String,
        /// The D-Bus error name (e.g. `org.freedesktop.systemd1.NoSuchUnit`).
        name: String,
        /// Its message.
        message: String,
    },
    /// The unit's job did not end with `done`.
    #[error("error creating systemd unit `{unit}`: got `{result}`")]
    JobFailed {
        /// The unit.
        unit: String,
        /// The job's result (`failed`, `timeout`, `canceled`, ...).
        result: String,
    },
    /// The unit's job did not end in time.
    #[error("timed out waiting for systemd to {action} {unit}")]
    Timeout {
        /// `create` or `remove`.
        action: &'static str,
        /// The unit.
        unit: String,
    },
}

impl UnitError {
    /// True when systemd says the unit exists already.
    pub fn is_unit_exists(&self) -> bool {
        matches!(self, UnitError::Call { name, .. } if name.ends_with(".UnitExists"))
    }

    /// True when systemd does not know the unit.
    pub fn is_no_such_unit(&self) -> bool {
        matches!(self, UnitError::Call { name, .. } if name.ends_with(".NoSuchUnit"))
    }
}

/// What the systemd cgroup driver asks of systemd.
pub trait UnitManager: Send + Sync + std::fmt::Debug {
    /// systemd's version number (`Version` of the manager, e.g. `252` from
    /// "252.38-1~deb12u1").
    fn version(&self) -> Result<i64, UnitError>;

    /// `StartTransientUnit(name, "replace", props, [])` and waits (30 s) for
    /// its job to end; a job that does not end with `done` is an error
    /// ([`UnitError::JobFailed`]). A unit that exists already is
    /// [`UnitError::Call`] with `UnitExists`.
    fn start_transient_unit(&self, name: &str, props: &[Property]) -> Result<(), UnitError>;

    /// `SetUnitProperties(name, runtime = true, props)`.
    fn set_unit_properties(&self, name: &str, props: &[Property]) -> Result<(), UnitError>;

    /// `StopUnit(name, "replace")` and waits (30 s) for its job.
    fn stop_unit(&self, name: &str) -> Result<(), UnitError>;

    /// `ResetFailedUnit(name)`.
    fn reset_failed_unit(&self, name: &str) -> Result<(), UnitError>;
}

/// The leading number of a systemd version string (libcontainer's
/// `systemdVersionAtoi`: `"v245.4-1.fc32"`, `"245"`, `"252.38-1~deb12u1"`).
pub fn parse_version(text: &str) -> Option<i64> {
    let t = text.trim_start_matches(['"', 'v']);
    let digits: String = t.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

#[cfg(test)]
pub(crate) mod memory {
    //! An in-memory unit manager for unit tests.

    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use super::*;

    /// Units and their properties, as set.
    #[derive(Debug, Default)]
    pub struct MemoryUnits {
        pub units: Mutex<BTreeMap<String, Vec<Property>>>,
        pub calls: Mutex<Vec<String>>,
    }

    impl UnitManager for MemoryUnits {
        fn version(&self) -> Result<i64, UnitError> {
            Ok(252)
        }
        fn start_transient_unit(&self, name: &str, props: &[Property]) -> Result<(), UnitError> {
            self.calls
                .lock()
                .expect("lock")
                .push(format!("start {name}"));
            let mut u = self.units.lock().expect("lock");
            if u.contains_key(name) {
                return Err(UnitError::Call {
                    method: "StartTransientUnit",
                    unit: name.into(),
                    name: "org.freedesktop.systemd1.UnitExists".into(),
                    message: format!("Unit {name} already exists."),
                });
            }
            u.insert(name.to_string(), props.to_vec());
            Ok(())
        }
        fn set_unit_properties(&self, name: &str, props: &[Property]) -> Result<(), UnitError> {
            self.calls.lock().expect("lock").push(format!("set {name}"));
            let mut u = self.units.lock().expect("lock");
            let entry = u.entry(name.to_string()).or_default();
            for (k, v) in props {
                entry.retain(|(n, _)| n != k);
                entry.push((k.clone(), v.clone()));
            }
            Ok(())
        }
        fn stop_unit(&self, name: &str) -> Result<(), UnitError> {
            self.calls
                .lock()
                .expect("lock")
                .push(format!("stop {name}"));
            match self.units.lock().expect("lock").remove(name) {
                Some(_) => Ok(()),
                None => Err(UnitError::Call {
                    method: "StopUnit",
                    unit: name.into(),
                    name: "org.freedesktop.systemd1.NoSuchUnit".into(),
                    message: format!("Unit {name} not loaded."),
                }),
            }
        }
        fn reset_failed_unit(&self, name: &str) -> Result<(), UnitError> {
            self.calls
                .lock()
                .expect("lock")
                .push(format!("reset {name}"));
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_like_libcontainer() {
        assert_eq!(parse_version("252.38-1~deb12u1"), Some(252));
        assert_eq!(parse_version("v245.4-1.fc32"), Some(245));
        assert_eq!(parse_version("\"245\""), Some(245));
        assert_eq!(parse_version("nope"), None);
    }
}

//! Eviction thresholds as KubeletConfiguration spells them
//! (`evictionHard: {memory.available: 100Mi, nodefs.available: "10%"}`),
//! parsed and checked at start so a typo fails loudly instead of disabling
//! eviction.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use super::FieldError;
use super::duration::KubeDuration;
use keelson_common::quantity::Quantity;

/// An eviction signal kubelet knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Signal {
    /// `memory.available`: capacity minus the node's working set.
    MemoryAvailable,
    /// `allocatableMemory.available`: allocatable minus the pods' working set.
    AllocatableMemoryAvailable,
    /// `nodefs.available`: free bytes on the filesystem of the root dir.
    NodeFsAvailable,
    /// `nodefs.inodesFree`: free inodes there.
    NodeFsInodesFree,
    /// `imagefs.available`: free bytes where the runtime keeps images.
    ImageFsAvailable,
    /// `imagefs.inodesFree`: free inodes there.
    ImageFsInodesFree,
    /// `containerfs.available`: free bytes where writable layers live.
    ContainerFsAvailable,
    /// `containerfs.inodesFree`: free inodes there.
    ContainerFsInodesFree,
    /// `pid.available`: pid_max minus running processes.
    PidAvailable,
}

impl Signal {
    /// Every signal, in a stable order.
    pub const ALL: [Signal; 9] = [
        Signal::MemoryAvailable,
        Signal::AllocatableMemoryAvailable,
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
        Signal::ImageFsAvailable,
        Signal::ImageFsInodesFree,
        Signal::ContainerFsAvailable,
        Signal::ContainerFsInodesFree,
        Signal::PidAvailable,
    ];

    /// The name used in configuration, metrics and messages.
    pub fn name(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::AllocatableMemoryAvailable => "allocatableMemory.available",
            Signal::NodeFsAvailable => "nodefs.available",
            Signal::NodeFsInodesFree => "nodefs.inodesFree",
            Signal::ImageFsAvailable => "imagefs.available",
            Signal::ImageFsInodesFree => "imagefs.inodesFree",
            Signal::ContainerFsAvailable => "containerfs.available",
            Signal::ContainerFsInodesFree => "containerfs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }

    /// Looks a signal up by its configuration name.
    pub fn from_name(name: &str) -> Option<Signal> {
        Signal::ALL.into_iter().find(|s| s.name() == name)
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A threshold value: an absolute quantity or a share of capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ThresholdValue {
    /// An absolute amount (bytes, inodes, pids).
    Quantity(Quantity),
    /// A fraction of the signal's capacity, 0.0..=1.0.
    Percentage(f64),
}

/// Why an eviction threshold or minimum reclaim does not parse (kubelet's
/// `parseThresholdStatement` texts).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ThresholdError {
    /// `N%` with N not a number.
    #[error("invalid percentage {0:?}")]
    Percentage(String),
    /// A percentage outside 0-100.
    #[error("eviction percentage threshold {0:?} must be >= 0% and <= 100%")]
    PercentageRange(String),
    /// Not a quantity.
    #[error(transparent)]
    Quantity(#[from] keelson_common::quantity::QuantityError),
    /// A negative quantity.
    #[error("eviction threshold {0:?} must be positive")]
    Negative(String),
}

impl ThresholdValue {
    /// Parses `100Mi` or `10%`.
    pub fn parse(text: &str) -> Result<ThresholdValue, ThresholdError> {
        let t = text.trim();
        if let Some(p) = t.strip_suffix('%') {
            let v: f64 = p
                .trim()
                .parse()
                .map_err(|_| ThresholdError::Percentage(text.to_string()))?;
            if !(0.0..=100.0).contains(&v) {
                return Err(ThresholdError::PercentageRange(text.to_string()));
            }
            return Ok(ThresholdValue::Percentage(v / 100.0));
        }
        let q = Quantity::parse(t)?;
        if q.is_negative() {
            return Err(ThresholdError::Negative(text.to_string()));
        }
        Ok(ThresholdValue::Quantity(q))
    }

    /// The absolute amount this value stands for, given the signal's capacity.
    pub fn resolve(self, capacity: u64) -> u64 {
        match self {
            ThresholdValue::Quantity(q) => q.value_u64(),
            ThresholdValue::Percentage(p) => (capacity as f64 * p).round() as u64,
        }
    }

    /// True for a threshold that can never trigger (0 or 0%).
    pub fn is_zero(self) -> bool {
        match self {
            ThresholdValue::Quantity(q) => q == Quantity::ZERO,
            ThresholdValue::Percentage(p) => p == 0.0,
        }
    }
}

impl fmt::Display for ThresholdValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ThresholdValue::Quantity(q) => f.write_str(&q.to_bytes_string()),
            ThresholdValue::Percentage(p) => write!(f, "{}%", p * 100.0),
        }
    }
}

/// One eviction threshold: signal < value, hard (grace 0) or soft.
#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    /// The signal observed.
    pub signal: Signal,
    /// Eviction starts when the signal's value drops below this.
    pub value: ThresholdValue,
    /// How long the threshold must hold before acting (zero for hard thresholds).
    pub grace_period: Duration,
    /// Extra amount to reclaim beyond the threshold once acting.
    pub min_reclaim: Option<ThresholdValue>,
    /// True for evictionHard thresholds.
    pub hard: bool,
}

/// kubelet's default `evictionHard`.
pub fn default_eviction_hard() -> BTreeMap<String, String> {
    [
        ("memory.available", "100Mi"),
        ("nodefs.available", "10%"),
        ("nodefs.inodesFree", "5%"),
        ("imagefs.available", "15%"),
        ("imagefs.inodesFree", "5%"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Parses and checks the four eviction maps of the node section. Errors
/// carry field paths such as `node.evictionSoft["memory.available"]`.
pub fn parse_thresholds(
    hard: &BTreeMap<String, String>,
    soft: &BTreeMap<String, String>,
    soft_grace: &BTreeMap<String, KubeDuration>,
    min_reclaim: &BTreeMap<String, String>,
) -> Result<Vec<Threshold>, Vec<FieldError>> {
    let mut errors = Vec::new();
    let mut out = Vec::new();
    let signal_of = |field: &str, key: &str, errors: &mut Vec<FieldError>| {
        let s = Signal::from_name(key);
        if s.is_none() {
            errors.push(FieldError::new(
                format!("node.{field}[{key:?}]"),
                format!(
                    "unknown eviction signal (known: {})",
                    Signal::ALL.map(Signal::name).join(", ")
                ),
            ));
        }
        s
    };
    let mut reclaim = BTreeMap::new();
    for (key, text) in min_reclaim {
        if let Some(sig) = signal_of("evictionMinimumReclaim", key, &mut errors) {
            match ThresholdValue::parse(text) {
                Ok(v) => {
                    reclaim.insert(sig, v);
                }
                Err(e) => errors.push(FieldError::new(
                    format!("node.evictionMinimumReclaim[{key:?}]"),
                    e,
                )),
            }
        }
    }
    for (key, text) in hard {
        if let Some(sig) = signal_of("evictionHard", key, &mut errors) {
            match ThresholdValue::parse(text) {
                Ok(v) if v.is_zero() => {}
                Ok(v) => out.push(Threshold {
                    signal: sig,
                    value: v,
                    grace_period: Duration::ZERO,
                    min_reclaim: reclaim.get(&sig).copied(),
                    hard: true,
                }),
                Err(e) => errors.push(FieldError::new(format!("node.evictionHard[{key:?}]"), e)),
            }
        }
    }
    for (key, text) in soft {
        let Some(sig) = signal_of("evictionSoft", key, &mut errors) else {
            continue;
        };
        let value = match ThresholdValue::parse(text) {
            Ok(v) => v,
            Err(e) => {
                errors.push(FieldError::new(format!("node.evictionSoft[{key:?}]"), e));
                continue;
            }
        };
        let Some(grace) = soft_grace.get(key) else {
            errors.push(FieldError::new(
                format!("node.evictionSoftGracePeriod[{key:?}]"),
                "no grace period specified for soft eviction threshold".to_string(),
            ));
            continue;
        };
        if value.is_zero() {
            continue;
        }
        out.push(Threshold {
            signal: sig,
            value,
            grace_period: grace.get(),
            min_reclaim: reclaim.get(&sig).copied(),
            hard: false,
        });
    }
    for key in soft_grace.keys() {
        if !soft.contains_key(key) {
            errors.push(FieldError::new(
                format!("node.evictionSoftGracePeriod[{key:?}]"),
                "grace period specified for a signal without a soft eviction threshold".to_string(),
            ));
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_parse() {
        let t = parse_thresholds(
            &default_eviction_hard(),
            &BTreeMap::new(),
            &BTreeMap::new(),
            &BTreeMap::new(),
        )
        .expect("defaults are valid");
        // pkg/kubelet/eviction/defaults_linux.go: five hard thresholds.
        assert_eq!(t.len(), 5);
        assert!(t.iter().any(|t| t.signal == Signal::ImageFsInodesFree));
        let mem = t
            .iter()
            .find(|t| t.signal == Signal::MemoryAvailable)
            .expect("memory threshold");
        assert_eq!(mem.value.resolve(0), 100 * 1024 * 1024);
        let nodefs = t
            .iter()
            .find(|t| t.signal == Signal::NodeFsAvailable)
            .expect("nodefs threshold");
        assert_eq!(nodefs.value.resolve(1000), 100);
    }

    #[test]
    fn soft_needs_grace_and_known_signals() {
        let errs = parse_thresholds(
            &map(&[("memory.avail", "1Gi")]),
            &map(&[("memory.available", "1Gi")]),
            &BTreeMap::new(),
            &map(&[("nodefs.available", "-1")]),
        )
        .expect_err("must fail");
        let paths: Vec<_> = errs.iter().map(|e| e.path.as_str()).collect();
        assert!(
            paths.contains(&"node.evictionHard[\"memory.avail\"]"),
            "{paths:?}"
        );
        assert!(
            paths.contains(&"node.evictionSoftGracePeriod[\"memory.available\"]"),
            "{paths:?}"
        );
        assert!(
            paths.contains(&"node.evictionMinimumReclaim[\"nodefs.available\"]"),
            "{paths:?}"
        );
    }

    #[test]
    fn percentages_bounded() {
        assert!(ThresholdValue::parse("101%").is_err());
        assert!(ThresholdValue::parse("-1%").is_err());
        assert_eq!(
            ThresholdValue::parse("50%").ok(),
            Some(ThresholdValue::Percentage(0.5))
        );
    }

    #[test]
    fn zero_threshold_disables() {
        let t = parse_thresholds(
            &map(&[("memory.available", "0%")]),
            &BTreeMap::new(),
            &BTreeMap::new(),
            &BTreeMap::new(),
        )
        .expect("valid");
        assert!(t.is_empty());
    }
}

//! The node conditions kubelet owns — MemoryPressure, DiskPressure,
//! PIDPressure and Ready — with kubelet's reasons, messages and events, and
//! its time rules: `lastHeartbeatTime` is now on every computation,
//! `lastTransitionTime` moves only when the status changes. Conditions other
//! writers add (NetworkUnavailable, node-problem-detector's) are left alone.

use k8s_openapi::api::core::v1::NodeCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::capacity::ResourceList;

/// An event about the node to record, as kubelet's `recordNodeStatusEvent`
/// does (`Node <name> status is now: <reason>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEvent {
    /// `true` for Warning, `false` for Normal.
    pub warning: bool,
    /// Event reason (`NodeReady`, `NodeHasSufficientMemory`, ...).
    pub reason: &'static str,
    /// A message; `None` means kubelet's `Node <name> status is now: <reason>`.
    pub message: Option<String>,
}

impl NodeEvent {
    fn status(reason: &'static str) -> Self {
        NodeEvent {
            warning: false,
            reason,
            message: None,
        }
    }
}

/// Joins errors as apimachinery's `NewAggregate(...).Error()` does: one
/// error alone, else `[a, b]`, duplicates dropped.
pub fn aggregate(errors: &[String]) -> Option<String> {
    let mut seen: Vec<&str> = Vec::new();
    for e in errors {
        if !seen.contains(&e.as_str()) {
            seen.push(e);
        }
    }
    match seen.len() {
        0 => None,
        1 => Some(seen[0].to_string()),
        _ => Some(format!("[{}]", seen.join(", "))),
    }
}

/// Which pressure condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pressure {
    /// `MemoryPressure`.
    Memory,
    /// `DiskPressure`.
    Disk,
    /// `PIDPressure`.
    Pid,
}

struct PressureText {
    kind: &'static str,
    true_reason: &'static str,
    true_message: &'static str,
    true_event: &'static str,
    false_reason: &'static str,
    false_message: &'static str,
    false_event: &'static str,
}

impl Pressure {
    fn text(self) -> PressureText {
        match self {
            Pressure::Memory => PressureText {
                kind: "MemoryPressure",
                true_reason: "KubeletHasInsufficientMemory",
                true_message: "kubelet has insufficient memory available",
                true_event: "NodeHasInsufficientMemory",
                false_reason: "KubeletHasSufficientMemory",
                false_message: "kubelet has sufficient memory available",
                false_event: "NodeHasSufficientMemory",
            },
            Pressure::Disk => PressureText {
                kind: "DiskPressure",
                true_reason: "KubeletHasDiskPressure",
                true_message: "kubelet has disk pressure",
                true_event: "NodeHasDiskPressure",
                false_reason: "KubeletHasNoDiskPressure",
                false_message: "kubelet has no disk pressure",
                false_event: "NodeHasNoDiskPressure",
            },
            Pressure::Pid => PressureText {
                kind: "PIDPressure",
                true_reason: "KubeletHasInsufficientPID",
                true_message: "kubelet has insufficient PID available",
                true_event: "NodeHasInsufficientPID",
                false_reason: "KubeletHasSufficientPID",
                false_message: "kubelet has sufficient PID available",
                false_event: "NodeHasSufficientPID",
            },
        }
    }

    /// The condition type.
    pub fn condition_type(self) -> &'static str {
        self.text().kind
    }
}

/// Updates (or appends) one pressure condition.
pub fn set_pressure(
    conditions: &mut Vec<NodeCondition>,
    which: Pressure,
    under_pressure: bool,
    now: &Time,
) -> Option<NodeEvent> {
    let t = which.text();
    let idx = match conditions.iter().position(|c| c.type_ == t.kind) {
        Some(i) => i,
        None => {
            conditions.push(NodeCondition {
                type_: t.kind.to_string(),
                status: "Unknown".to_string(),
                ..NodeCondition::default()
            });
            conditions.len() - 1
        }
    };
    let c = &mut conditions[idx];
    c.last_heartbeat_time = Some(now.clone());
    let (status, reason, message, event) = if under_pressure {
        ("True", t.true_reason, t.true_message, t.true_event)
    } else {
        ("False", t.false_reason, t.false_message, t.false_event)
    };
    if c.status == status {
        return None;
    }
    c.status = status.to_string();
    c.reason = Some(reason.to_string());
    c.message = Some(message.to_string());
    c.last_transition_time = Some(now.clone());
    Some(NodeEvent::status(event))
}

/// Resources without which the node is not Ready.
pub const REQUIRED_CAPACITIES: [&str; 4] = ["cpu", "memory", "pods", "ephemeral-storage"];

/// Updates (or appends) the Ready condition from the errors of the runtime,
/// network and storage, and the capacity just computed.
pub fn set_ready(
    conditions: &mut Vec<NodeCondition>,
    mut errors: Vec<String>,
    capacity: &ResourceList,
    now: &Time,
) -> Option<NodeEvent> {
    let missing: Vec<&str> = REQUIRED_CAPACITIES
        .iter()
        .copied()
        .filter(|r| !capacity.contains_key(*r))
        .collect();
    if !missing.is_empty() {
        errors.push(format!(
            "missing node capacity for resources: {}",
            missing.join(", ")
        ));
    }
    let mut new = match aggregate(&errors) {
        None => NodeCondition {
            type_: "Ready".to_string(),
            status: "True".to_string(),
            reason: Some("KubeletReady".to_string()),
            message: Some("kubelet is posting ready status".to_string()),
            last_heartbeat_time: Some(now.clone()),
            ..NodeCondition::default()
        },
        Some(message) => NodeCondition {
            type_: "Ready".to_string(),
            status: "False".to_string(),
            reason: Some("KubeletNotReady".to_string()),
            message: Some(message),
            last_heartbeat_time: Some(now.clone()),
            ..NodeCondition::default()
        },
    };
    match conditions.iter_mut().find(|c| c.type_ == "Ready") {
        Some(old) => {
            let changed = old.status != new.status;
            new.last_transition_time = if changed {
                Some(now.clone())
            } else {
                old.last_transition_time.clone()
            };
            *old = new.clone();
            if !changed {
                return None;
            }
            if new.status == "True" {
                Some(NodeEvent::status("NodeReady"))
            } else {
                tracing::info!(message = ?new.message, "node became not ready");
                Some(NodeEvent::status("NodeNotReady"))
            }
        }
        None => {
            new.last_transition_time = Some(now.clone());
            conditions.push(new);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn t(secs: i64) -> Time {
        Time(jiff::Timestamp::from_second(secs).expect("ts"))
    }

    fn full_capacity() -> ResourceList {
        REQUIRED_CAPACITIES
            .iter()
            .map(|r| (r.to_string(), Quantity("1".into())))
            .collect()
    }

    #[test]
    fn aggregate_like_apimachinery() {
        assert_eq!(aggregate(&[]), None);
        assert_eq!(aggregate(&["a".into()]), Some("a".into()));
        assert_eq!(aggregate(&["a".into(), "a".into()]), Some("a".into()));
        assert_eq!(
            aggregate(&["a".into(), "b".into(), "a".into()]),
            Some("[a, b]".into())
        );
    }

    #[test]
    fn ready_transitions_keep_time_until_status_changes() {
        let mut conds = Vec::new();
        assert_eq!(
            set_ready(&mut conds, vec![], &full_capacity(), &t(100)),
            None
        );
        assert_eq!(conds[0].status, "True");
        assert_eq!(conds[0].reason.as_deref(), Some("KubeletReady"));
        assert_eq!(
            conds[0].message.as_deref(),
            Some("kubelet is posting ready status")
        );
        assert_eq!(conds[0].last_transition_time, Some(t(100)));

        // Same status: heartbeat moves, transition does not, no event.
        assert_eq!(
            set_ready(&mut conds, vec![], &full_capacity(), &t(110)),
            None
        );
        assert_eq!(conds[0].last_heartbeat_time, Some(t(110)));
        assert_eq!(conds[0].last_transition_time, Some(t(100)));

        // Runtime down: NotReady with the runtime's message, event NodeNotReady.
        let ev = set_ready(
            &mut conds,
            vec!["container runtime not ready: RuntimeReady=false reason:X message:Y".into()],
            &full_capacity(),
            &t(120),
        );
        assert_eq!(ev.map(|e| e.reason), Some("NodeNotReady"));
        assert_eq!(conds[0].status, "False");
        assert_eq!(conds[0].reason.as_deref(), Some("KubeletNotReady"));
        assert_eq!(
            conds[0].message.as_deref(),
            Some("container runtime not ready: RuntimeReady=false reason:X message:Y")
        );
        assert_eq!(conds[0].last_transition_time, Some(t(120)));

        let ev = set_ready(&mut conds, vec![], &full_capacity(), &t(130));
        assert_eq!(ev.map(|e| e.reason), Some("NodeReady"));
        assert_eq!(conds[0].last_transition_time, Some(t(130)));
    }

    #[test]
    fn missing_capacity_is_not_ready() {
        let mut conds = Vec::new();
        let mut cap = full_capacity();
        cap.remove("ephemeral-storage");
        cap.remove("memory");
        set_ready(&mut conds, vec!["net".into()], &cap, &t(1));
        assert_eq!(
            conds[0].message.as_deref(),
            Some("[net, missing node capacity for resources: memory, ephemeral-storage]")
        );
    }

    #[test]
    fn pressure_conditions() {
        let mut conds = Vec::new();
        let ev = set_pressure(&mut conds, Pressure::Memory, false, &t(1));
        assert_eq!(ev.map(|e| e.reason), Some("NodeHasSufficientMemory"));
        assert_eq!(conds[0].type_, "MemoryPressure");
        assert_eq!(
            conds[0].reason.as_deref(),
            Some("KubeletHasSufficientMemory")
        );
        assert_eq!(
            set_pressure(&mut conds, Pressure::Memory, false, &t(2)),
            None
        );
        assert_eq!(conds[0].last_heartbeat_time, Some(t(2)));
        assert_eq!(conds[0].last_transition_time, Some(t(1)));
        let ev = set_pressure(&mut conds, Pressure::Memory, true, &t(3));
        assert_eq!(ev.map(|e| e.reason), Some("NodeHasInsufficientMemory"));
        assert_eq!(conds[0].status, "True");
        assert_eq!(
            conds[0].message.as_deref(),
            Some("kubelet has insufficient memory available")
        );
        assert_eq!(conds[0].last_transition_time, Some(t(3)));

        set_pressure(&mut conds, Pressure::Disk, true, &t(4));
        set_pressure(&mut conds, Pressure::Pid, false, &t(4));
        assert_eq!(conds[1].reason.as_deref(), Some("KubeletHasDiskPressure"));
        assert_eq!(conds[2].reason.as_deref(), Some("KubeletHasSufficientPID"));
    }
}

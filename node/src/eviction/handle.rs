//! What the rest of the node reads from the eviction manager: the pressure
//! conditions (for Node status) and kubelet's eviction admission check for
//! new pods (under memory pressure only BestEffort pods are refused, unless
//! they tolerate `node.kubernetes.io/memory-pressure`; under disk or PID
//! pressure every pod is; critical pods always pass).

use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::{Pod, Taint, Toleration};

use super::message::node_condition_message;
use super::pods::{REASON_EVICTED, is_critical};
use crate::pod::qos::{QosClass, pod_qos};
use crate::status::{PressureFlags, PressureSource};

/// Why a pod was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmitRejection {
    /// `Evicted`.
    pub reason: String,
    /// `The node had condition: [MemoryPressure]. `
    pub message: String,
}

/// The eviction manager's read side; cheap to clone.
#[derive(Clone, Default)]
pub struct EvictionHandle {
    conditions: Arc<RwLock<Vec<&'static str>>>,
}

impl std::fmt::Debug for EvictionHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EvictionHandle")
            .field("conditions", &self.node_conditions())
            .finish()
    }
}

/// kubelet's `TolerationsTolerateTaint` for a taint without value.
fn tolerates(tolerations: &[Toleration], key: &str, effect: &str) -> bool {
    let taint = Taint {
        key: key.to_string(),
        effect: effect.to_string(),
        ..Default::default()
    };
    tolerations
        .iter()
        .any(|t| crate::pod::podutil::tolerates(t, &taint))
}

impl EvictionHandle {
    /// The pressure conditions now (`MemoryPressure`, `DiskPressure`, `PIDPressure`).
    pub fn node_conditions(&self) -> Vec<&'static str> {
        self.conditions
            .read()
            .map(|c| c.clone())
            .unwrap_or_default()
    }

    pub(crate) fn set_node_conditions(&self, conditions: Vec<&'static str>) {
        if let Ok(mut c) = self.conditions.write() {
            *c = conditions;
        }
    }

    /// kubelet's eviction `Admit`.
    pub fn admit(&self, pod: &Pod) -> Result<(), AdmitRejection> {
        let conditions = self.node_conditions();
        if conditions.is_empty() || is_critical(pod) {
            return Ok(());
        }
        if conditions == ["MemoryPressure"] {
            if pod_qos(pod) != QosClass::BestEffort {
                return Ok(());
            }
            let tolerations = pod
                .spec
                .as_ref()
                .and_then(|s| s.tolerations.clone())
                .unwrap_or_default();
            if tolerates(
                &tolerations,
                "node.kubernetes.io/memory-pressure",
                "NoSchedule",
            ) {
                return Ok(());
            }
        }
        tracing::info!(
            pod = %format!("{}/{}", pod.metadata.namespace.as_deref().unwrap_or_default(), pod.metadata.name.as_deref().unwrap_or_default()),
            conditions = ?conditions,
            "failed to admit pod to node"
        );
        Err(AdmitRejection {
            reason: REASON_EVICTED.to_string(),
            message: node_condition_message(&conditions),
        })
    }
}

impl PressureSource for EvictionHandle {
    fn pressure(&self) -> PressureFlags {
        let c = self.node_conditions();
        PressureFlags {
            memory: c.contains(&"MemoryPressure"),
            disk: c.contains(&"DiskPressure"),
            pid: c.contains(&"PIDPressure"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

    fn pod(best_effort: bool, tolerations: Vec<Toleration>) -> Pod {
        let resources = (!best_effort).then(|| ResourceRequirements {
            requests: Some([("memory".to_string(), ApiQuantity("64Mi".into()))].into()),
            ..Default::default()
        });
        Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    resources,
                    ..Default::default()
                }],
                tolerations: Some(tolerations),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn admission_under_pressure() {
        let h = EvictionHandle::default();
        assert!(h.admit(&pod(true, vec![])).is_ok());
        h.set_node_conditions(vec!["MemoryPressure"]);
        assert_eq!(
            h.pressure(),
            PressureFlags {
                memory: true,
                disk: false,
                pid: false
            }
        );
        let e = h
            .admit(&pod(true, vec![]))
            .expect_err("best effort refused");
        assert_eq!(e.reason, "Evicted");
        assert_eq!(e.message, "The node had condition: [MemoryPressure]. ");
        assert!(h.admit(&pod(false, vec![])).is_ok(), "burstable admitted");
        let tolerate = Toleration {
            key: Some("node.kubernetes.io/memory-pressure".into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        };
        assert!(h.admit(&pod(true, vec![tolerate])).is_ok());
        let everything = Toleration {
            operator: Some("Exists".into()),
            ..Default::default()
        };
        assert!(h.admit(&pod(true, vec![everything])).is_ok());
        h.set_node_conditions(vec!["MemoryPressure", "DiskPressure"]);
        let e = h
            .admit(&pod(false, vec![]))
            .expect_err("disk pressure refuses all");
        assert_eq!(
            e.message,
            "The node had condition: [MemoryPressure DiskPressure]. "
        );
        let mut critical = pod(true, vec![]);
        if let Some(s) = critical.spec.as_mut() {
            s.priority = Some(2_000_001_000);
        }
        assert!(h.admit(&critical).is_ok());
    }
}

//! kubelet's pod admission (`HandlePodAdditions` → allocation manager
//! `AddPod` → `canAdmitPod`, `pkg/kubelet/kubelet.go` and
//! `pkg/kubelet/allocation/allocation_manager.go`): every pod new to the
//! node, in creation order and one at a time, goes through the admit
//! handlers in kubelet's order against the pods already admitted; the
//! first refusal wins, and the pod then ends `Failed` with that reason and
//! `Pod was rejected: <message>` and never runs.
//!
//! Handlers, in kubelet's order (`NewMainKubelet`):
//! 1. eviction (`Evicted` under node pressure), passed in by the node role;
//! 2. sysctls (`SysctlForbidden`, [`sysctl`]);
//! 3. predicates (`lifecycle/predicate.go`): `kubernetes.io/os` label and
//!    `spec.os`, `supplementalGroupsPolicy: Strict`, resource fit
//!    (`OutOfcpu`, `OutOfmemory`, `OutOfpods`, ... [`fit`]), node affinity
//!    and selector, node name, host ports, `NoExecute` taints
//!    ([`predicates`]); node affinity alone failing re-reads the Node first;
//! 4. AppArmor ([`apparmor`]);
//! 5. pod-level resources (supported: PodLevelResources is on in v1.36);
//! 6. node-declared features ([`features`]);
//! 7. graceful node shutdown (`NodeShutdown` while the node shuts down),
//!    passed in by the node role.
//!
//! Not done: kubelet lets a critical pod that does not fit preempt other
//! pods (`preemption.CriticalPodAdmissionHandler`); keelson refuses it
//! with the resource reason instead.

pub mod apparmor;
pub mod features;
pub mod fit;
pub mod node;
pub mod predicates;
pub mod shutdown;
pub mod sysctl;

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use prometheus::IntCounterVec;

pub use crate::eviction::AdmitRejection;
use crate::pod::podutil;

use self::apparmor::AppArmorAdmission;
use self::fit::NodeResources;
use self::node::NodeSource;
use self::sysctl::SysctlAllowlist;

/// kubelet's `UnexpectedAdmissionError` (`cm/admission/errors.go`).
pub const UNEXPECTED_ADMISSION_ERROR: &str = "UnexpectedAdmissionError";

/// The outcome of one handler.
pub type Verdict = Result<(), AdmitRejection>;

/// Decides whether a pod new to this node may run (an extra handler such
/// as the eviction manager's).
pub type AdmitFn = Arc<dyn Fn(&Pod) -> Verdict + Send + Sync>;

/// Node allocatable as the node computes it (before the Node exists).
pub type AllocatableFn = crate::volumes::AllocatableFn;

pub(crate) fn rejection(reason: &str, message: String) -> AdmitRejection {
    AdmitRejection {
        reason: reason.to_string(),
        message,
    }
}

/// What admission is asked about (`lifecycle.Operation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// A pod new to the node.
    Add,
    /// A running pod's resources changed (in-place resize).
    Resize,
}

/// kubelet's `admissionRejectionReasons`: reasons counted under their own
/// label; other `OutOf*` count as `OutOfExtendedResources`, the rest as
/// `Other`.
const COUNTED_REASONS: &[&str] = &[
    "AppArmor",
    "PodOSSelectorNodeLabelDoesNotMatch",
    "PodOSNotSupported",
    "InvalidNodeInfo",
    "InitContainerRestartPolicyForbidden",
    "SupplementalGroupsPolicyNotSupported",
    "UnexpectedAdmissionError",
    "UnknownReason",
    "UnexpectedPredicateFailureType",
    "OutOfcpu",
    "OutOfmemory",
    "OutOfephemeral-storage",
    "OutOfpods",
    "PodLevelResourcesNotSupported",
    "PodFeatureUnsupported",
    predicates::TAINT_TOLERATION_REASON,
    "Evicted",
    sysctl::FORBIDDEN_REASON,
    "TopologyAffinityError",
    shutdown::REASON,
    "VolumeAttachmentLimitExceeded",
];

/// The metric label of a rejection reason (`recordAdmissionRejection`).
pub fn metric_reason(reason: &str) -> &str {
    if COUNTED_REASONS.contains(&reason) {
        reason
    } else if reason.starts_with("OutOf") {
        "OutOfExtendedResources"
    } else {
        "Other"
    }
}

/// What admission is built from.
pub struct AdmitterParts {
    /// This node's name.
    pub node_name: String,
    /// The Node.
    pub node: Arc<dyn NodeSource>,
    /// The node's own allocatable (for the stand-in Node).
    pub allocatable: AllocatableFn,
    /// `maxPods` (for the stand-in Node).
    pub max_pods: i32,
    /// The eviction manager's handler, first in line.
    pub eviction: Option<AdmitFn>,
    /// Safe and allowed unsafe sysctls.
    pub sysctls: SysctlAllowlist,
    /// AppArmor support of the host.
    pub apparmor: AppArmorAdmission,
    /// `kubelet_admission_rejections_total`.
    pub rejections: IntCounterVec,
    /// The device manager (`None`: no device plugins).
    pub devices: Option<crate::devices::DeviceManager>,
    /// The graceful node shutdown manager's handler, last in line.
    pub shutdown: Option<AdmitFn>,
}

/// The admit handlers in kubelet's order.
pub struct Admitter {
    p: AdmitterParts,
}

impl std::fmt::Debug for Admitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admitter")
            .field("node", &self.p.node_name)
            .finish_non_exhaustive()
    }
}

/// A predicate failure (`PredicateFailureReason`).
enum Failure {
    Resource(fit::Insufficient),
    Predicate(&'static str, &'static str),
}

impl Admitter {
    /// Admission from its parts.
    pub fn new(parts: AdmitterParts) -> Self {
        Admitter { p: parts }
    }

    fn stand_in_node(&self) -> Node {
        node::initial_node(&self.p.node_name, (self.p.allocatable)(), self.p.max_pods)
    }

    /// `canAdmitPod`: runs every handler; `others` are the pods already
    /// admitted (the pod itself is skipped if present).
    pub async fn admit(&self, pod: &Pod, others: &[Arc<Pod>], op: Operation) -> Verdict {
        let uid = podutil::uid(pod);
        let others: Vec<Arc<Pod>> = others
            .iter()
            .filter(|p| podutil::uid(p) != uid)
            .cloned()
            .collect();
        let verdict = self.run_handlers(pod, &others).await;
        if let Err(r) = &verdict {
            tracing::info!(pod = %podutil::key(pod), uid, reason = %r.reason, message = %r.message, operation = ?op, "pod admission denied");
            if op == Operation::Add {
                self.p
                    .rejections
                    .with_label_values(&[metric_reason(&r.reason)])
                    .inc();
            }
        }
        verdict
    }

    async fn run_handlers(&self, pod: &Pod, others: &[Arc<Pod>]) -> Verdict {
        if let Some(e) = &self.p.eviction {
            e(pod)?;
        }
        self.p.sysctls.admit(pod)?;
        self.allocate_devices(pod, others).await?;
        self.predicates(pod, others).await?;
        self.p.apparmor.admit(pod)?;
        features::admit(pod)?;
        if let Some(s) = &self.p.shutdown {
            s(pod)?;
        }
        Ok(())
    }

    /// The container manager's resource allocation handler (kubelet's
    /// topology manager with the `none` policy, `scope.admitPolicyNone`,
    /// `cm/admission/errors.go`): the device manager allocates each init
    /// and regular container's devices; a failure refuses the pod.
    async fn allocate_devices(&self, pod: &Pod, others: &[Arc<Pod>]) -> Verdict {
        let Some(devices) = &self.p.devices else {
            return Ok(());
        };
        let mut active: std::collections::BTreeSet<String> =
            others.iter().map(|p| podutil::uid(p).to_string()).collect();
        active.insert(podutil::uid(pod).to_string());
        let spec = podutil::spec(pod);
        let init = spec.init_containers.iter().flatten().map(|c| (c, true));
        for (c, is_init) in init.chain(spec.containers.iter().map(|c| (c, false))) {
            let restartable = c.restart_policy.as_deref() == Some("Always");
            if let Err(e) = devices
                .allocate(pod, c, is_init, restartable, Some(&active))
                .await
            {
                return Err(rejection(
                    UNEXPECTED_ADMISSION_ERROR,
                    format!("Allocate failed due to {e}, which is unexpected"),
                ));
            }
        }
        Ok(())
    }

    /// `predicateAdmitHandler.Admit`.
    async fn predicates(&self, pod: &Pod, others: &[Arc<Pod>]) -> Verdict {
        let mut node = self.p.node.cached().unwrap_or_else(|| self.stand_in_node());
        // `UpdatePluginResources`: devices already allocated to this pod
        // count as allocatable.
        if let Some(devices) = &self.p.devices {
            let allocatable = node
                .status
                .get_or_insert_with(Default::default)
                .allocatable
                .get_or_insert_with(Default::default);
            let raise = devices.sanitize_allocatable(podutil::uid(pod), |r| {
                allocatable.get(r).and_then(|q| {
                    keelson_common::quantity::Quantity::parse(&q.0)
                        .ok()
                        .and_then(|v| i64::try_from(v.value()).ok())
                })
            });
            for (r, n) in raise {
                allocatable.insert(
                    r,
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity(n.to_string()),
                );
            }
        }
        if predicates::os_label_mismatch(pod) {
            return Err(rejection(
                "PodOSSelectorNodeLabelDoesNotMatch",
                "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label"
                    .into(),
            ));
        }
        if predicates::os_field_mismatch(pod) {
            return Err(rejection(
                "PodOSNotSupported",
                "Failed to admit pod as the OS field doesn't match node OS".into(),
            ));
        }
        if predicates::supplemental_groups_unsupported(pod, &node) {
            return Err(rejection(
                "SupplementalGroupsPolicyNotSupported",
                "SupplementalGroupsPolicy=Strict is not supported in this node".into(),
            ));
        }
        let mut failures = general_filter(pod, &node, others);
        let only_affinity = !failures.is_empty()
            && failures.iter().all(
                |f| matches!(f, Failure::Predicate(_, r) if *r == predicates::NODE_AFFINITY_REASON),
            );
        if only_affinity && let Some(fresh) = self.p.node.fetch().await {
            node = fresh;
            failures = general_filter(pod, &node, others);
        }
        match failures.into_iter().next() {
            None => Ok(()),
            Some(Failure::Resource(r)) => Err(rejection(&r.reason(), r.message())),
            Some(Failure::Predicate(name, desc)) => {
                Err(rejection(name, format!("Predicate {name} failed: {desc}")))
            }
        }
    }
}

/// `generalFilter`: every failure, in kubelet's order.
fn general_filter(pod: &Pod, node: &Node, others: &[Arc<Pod>]) -> Vec<Failure> {
    let mut out: Vec<Failure> = NodeResources::new(node, others)
        .fits(pod)
        .into_iter()
        .map(Failure::Resource)
        .collect();
    if !predicates::matches_node_affinity(pod, node) {
        out.push(Failure::Predicate(
            predicates::NODE_AFFINITY,
            predicates::NODE_AFFINITY_REASON,
        ));
    }
    if !predicates::matches_node_name(pod, node) {
        out.push(Failure::Predicate(
            predicates::NODE_NAME,
            predicates::NODE_NAME_REASON,
        ));
    }
    let mut used = predicates::UsedPorts::default();
    for p in others {
        used.add_pod(p);
    }
    if !used.fits(pod) {
        out.push(Failure::Predicate(
            predicates::NODE_PORTS,
            predicates::NODE_PORTS_REASON,
        ));
    }
    if predicates::untolerated_no_execute(pod, node) {
        out.push(Failure::Predicate(
            predicates::TAINT_TOLERATION,
            predicates::TAINT_TOLERATION_REASON,
        ));
    }
    out
}

#[cfg(test)]
mod tests;

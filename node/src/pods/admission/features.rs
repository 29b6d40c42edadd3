//! kubelet's node-declared-features admission (`NodeDeclaredFeatures`,
//! beta and on in v1.36; `lifecycle.NewDeclaredFeaturesAdmitHandler`,
//! `k8s.io/component-helpers/nodedeclaredfeatures`): a pod that needs a
//! feature the node does not declare is refused with
//! `PodFeatureUnsupported`, and a pod update that needs one gets a
//! `FailedNodeDeclaredFeaturesCheck` warning.
//!
//! keelson declares exactly the features it implements, in the Node's
//! `status.declaredFeatures` too. Of upstream's registry, a pod can
//! require at scheduling time only `RestartAllContainersOnContainerExits`
//! (a container restart rule with action `RestartAllContainers`, which
//! keelson implements: `pods/restart_all.rs`) and
//! `UserNamespacesHostNetworkSupport` (host network with `hostUsers:
//! false`), which it does not: such pods are refused here as on a node
//! without it, never run with the field ignored.

use k8s_openapi::api::core::v1::Pod;

use super::Verdict;
use crate::pod::podutil;
use crate::status::features::DECLARED;

/// `lifecycle.PodFeatureUnsupported`.
pub const POD_FEATURE_UNSUPPORTED: &str = "PodFeatureUnsupported";
/// `events.FailedNodeDeclaredFeaturesCheck`.
pub const FAILED_CHECK_EVENT: &str = "FailedNodeDeclaredFeaturesCheck";

/// `InferForScheduling` of every registered feature, in registry order.
pub fn required_for_scheduling(pod: &Pod) -> Vec<&'static str> {
    let spec = podutil::spec(pod);
    let mut out = Vec::new();
    let restart_all = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| c.restart_policy_rules.iter().flatten())
        .any(|r| r.action == "RestartAllContainers");
    if restart_all {
        out.push("RestartAllContainersOnContainerExits");
    }
    if spec.host_network.unwrap_or(false) && spec.host_users == Some(false) {
        out.push("UserNamespacesHostNetworkSupport");
    }
    out
}

/// `InferForUpdate`: pod-level resources changed, or a non-sidecar init
/// container's resources changed.
pub fn required_for_update(old: &Pod, new: &Pod) -> Vec<&'static str> {
    let mut out = Vec::new();
    let (o, n) = (podutil::spec(old), podutil::spec(new));
    if (o.resources.is_some() || n.resources.is_some()) && o.resources != n.resources {
        out.push("InPlacePodLevelResourcesVerticalScaling");
    }
    let init_changed = podutil::init_containers(old)
        .iter()
        .zip(podutil::init_containers(new))
        .any(|(a, b)| !podutil::is_restartable_init(a) && a.resources != b.resources);
    if init_changed {
        out.push("InPlacePodVerticalScalingInitContainers");
    }
    out
}

/// Required features the node does not declare.
pub fn unsatisfied(required: Vec<&'static str>) -> Vec<&'static str> {
    required
        .into_iter()
        .filter(|f| !DECLARED.contains(f))
        .collect()
}

/// The admit handler.
pub fn admit(pod: &Pod) -> Verdict {
    let missing = unsatisfied(required_for_scheduling(pod));
    if missing.is_empty() {
        return Ok(());
    }
    Err(super::rejection(
        POD_FEATURE_UNSUPPORTED,
        format!(
            "Pod requires node features that are not available: {}",
            missing.join(", ")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).expect("pod")
    }

    #[test]
    fn restart_all_containers_is_declared() {
        let p = pod(serde_json::json!({"spec": {"containers": [{
            "name": "c", "restartPolicy": "Never",
            "restartPolicyRules": [{"action": "RestartAllContainers",
                                    "exitCodes": {"operator": "In", "values": [42]}}]}]}}));
        assert_eq!(
            required_for_scheduling(&p),
            vec!["RestartAllContainersOnContainerExits"]
        );
        assert!(admit(&p).is_ok());
    }

    #[test]
    fn user_namespaces_with_host_network_is_not_declared() {
        let p = pod(
            serde_json::json!({"spec": {"hostNetwork": true, "hostUsers": false,
                                                "containers": [{"name": "c"}]}}),
        );
        let e = admit(&p).expect_err("refused");
        assert_eq!(e.reason, "PodFeatureUnsupported");
        assert_eq!(
            e.message,
            "Pod requires node features that are not available: UserNamespacesHostNetworkSupport"
        );
    }
}

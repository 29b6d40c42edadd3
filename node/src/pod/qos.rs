//! Quality-of-service classes (`v1qos.GetPodQOS`) and the OOM score
//! adjustment kubelet gives each container (`GetContainerOOMScoreAdjust`).

use k8s_openapi::api::core::v1::{Container, Pod};

use super::podutil::{containers, init_containers, is_critical, is_restartable_init};
use super::resources::{container_requests, quantity_of};

/// A pod's QoS class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QosClass {
    /// Every container has equal cpu and memory requests and limits.
    Guaranteed,
    /// Some requests or limits, not Guaranteed.
    Burstable,
    /// No requests or limits at all.
    BestEffort,
}

impl QosClass {
    /// As the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        }
    }

    fn parse(s: &str) -> Option<QosClass> {
        match s {
            "Guaranteed" => Some(QosClass::Guaranteed),
            "Burstable" => Some(QosClass::Burstable),
            "BestEffort" => Some(QosClass::BestEffort),
            _ => None,
        }
    }
}

/// The pod's QoS class: the one in its status when set (it is immutable and
/// the API server fills it in), else computed from the spec.
pub fn pod_qos(pod: &Pod) -> QosClass {
    pod.status
        .as_ref()
        .and_then(|s| s.qos_class.as_deref())
        .and_then(QosClass::parse)
        .unwrap_or_else(|| compute_pod_qos(pod))
}

/// Computes the QoS class from requests and limits of every (init and
/// regular) container, considering cpu and memory only.
pub fn compute_pod_qos(pod: &Pod) -> QosClass {
    const SUPPORTED: [&str; 2] = ["cpu", "memory"];
    let mut requests = [0i128; 2];
    let mut limits = [0i128; 2];
    let mut has_request = [false; 2];
    let mut has_limit = [false; 2];
    let mut guaranteed = true;
    // Pod-level resources (PodLevelResources) decide the class when set.
    let pod_level = pod.spec.as_ref().and_then(|s| s.resources.as_ref());
    let sources: Vec<Option<&k8s_openapi::api::core::v1::ResourceRequirements>> = match pod_level {
        Some(r) => vec![Some(r)],
        None => containers(pod)
            .iter()
            .chain(init_containers(pod))
            .map(|c| c.resources.as_ref())
            .collect(),
    };
    for res in sources {
        let mut limits_found = 0;
        for (i, r) in SUPPORTED.iter().enumerate() {
            let req = quantity_of(res.and_then(|r| r.requests.as_ref()), r).milli_value();
            if req > 0 {
                requests[i] += req;
                has_request[i] = true;
            }
            let lim = quantity_of(res.and_then(|r| r.limits.as_ref()), r).milli_value();
            if lim > 0 {
                limits[i] += lim;
                has_limit[i] = true;
                limits_found += 1;
            }
        }
        let limits_set = res
            .and_then(|r| r.limits.as_ref())
            .is_some_and(|l| !l.is_empty());
        if limits_found != SUPPORTED.len() && (pod_level.is_none() || limits_set) {
            guaranteed = false;
        }
    }
    if !has_request.iter().any(|b| *b) && !has_limit.iter().any(|b| *b) {
        return QosClass::BestEffort;
    }
    if guaranteed {
        for i in 0..SUPPORTED.len() {
            if has_request[i] && requests[i] != limits[i] {
                guaranteed = false;
            }
        }
    }
    let n_req = has_request.iter().filter(|b| **b).count();
    let n_lim = has_limit.iter().filter(|b| **b).count();
    if guaranteed && n_req == n_lim {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}

/// OOM score adjustment of Guaranteed and critical containers.
pub const GUARANTEED_OOM_SCORE_ADJ: i64 = -997;
/// OOM score adjustment of BestEffort containers.
pub const BESTEFFORT_OOM_SCORE_ADJ: i64 = 1000;

/// kubelet's `GetContainerOOMScoreAdjust`: Guaranteed and critical pods
/// -997, BestEffort 1000, Burstable scaled by the share of node memory
/// requested (kept between 3 and 999), and a sidecar never scored above the
/// regular container most likely to be killed.
pub fn container_oom_score_adj(pod: &Pod, container: &Container, memory_capacity: i64) -> i64 {
    if is_critical(pod) {
        return GUARANTEED_OOM_SCORE_ADJ;
    }
    match pod_qos(pod) {
        QosClass::Guaranteed => return GUARANTEED_OOM_SCORE_ADJ,
        QosClass::BestEffort => return BESTEFFORT_OOM_SCORE_ADJ,
        QosClass::Burstable => {}
    }
    let capacity = i128::from(memory_capacity.max(1));
    let raw = |request: i64| -> i64 { 1000 - (1000i128 * i128::from(request) / capacity) as i64 };
    let mut adj = raw(container_requests(container).memory);
    if is_restartable_init(container) {
        // A sidecar is not killed before the regular container with the
        // smallest memory request: at most that container's score.
        if let Some(min_request) = containers(pod)
            .iter()
            .map(|c| container_requests(c).memory)
            .min()
        {
            adj = adj.min(raw(min_request));
        }
    }
    if adj < 1000 + GUARANTEED_OOM_SCORE_ADJ {
        return 1000 + GUARANTEED_OOM_SCORE_ADJ;
    }
    if adj == BESTEFFORT_OOM_SCORE_ADJ {
        return adj - 1;
    }
    adj
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(containers: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({"spec": {"containers": containers}}))
            .expect("pod")
    }

    #[test]
    fn classes() {
        let be = pod(serde_json::json!([{"name": "a"}]));
        assert_eq!(compute_pod_qos(&be), QosClass::BestEffort);
        let g = pod(serde_json::json!([{"name": "a", "resources": {
            "requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}}]));
        assert_eq!(compute_pod_qos(&g), QosClass::Guaranteed);
        let b = pod(serde_json::json!([{"name": "a", "resources": {"requests": {"cpu": "100m"}}}]));
        assert_eq!(compute_pod_qos(&b), QosClass::Burstable);
        let only_cpu_limit = pod(serde_json::json!([{"name": "a", "resources": {
            "requests": {"cpu": "1"}, "limits": {"cpu": "1"}}}]));
        assert_eq!(compute_pod_qos(&only_cpu_limit), QosClass::Burstable);
    }

    #[test]
    fn status_class_wins() {
        let mut p = pod(serde_json::json!([{"name": "a"}]));
        p.status = Some(k8s_openapi::api::core::v1::PodStatus {
            qos_class: Some("Burstable".into()),
            ..Default::default()
        });
        assert_eq!(pod_qos(&p), QosClass::Burstable);
    }

    #[test]
    fn oom_scores() {
        let cap = 4i64 << 30;
        let b =
            pod(serde_json::json!([{"name": "a", "resources": {"requests": {"memory": "1Gi"}}}]));
        assert_eq!(container_oom_score_adj(&b, &containers(&b)[0], cap), 750);
        let tiny =
            pod(serde_json::json!([{"name": "a", "resources": {"requests": {"cpu": "10m"}}}]));
        assert_eq!(
            container_oom_score_adj(&tiny, &containers(&tiny)[0], cap),
            999
        );
        let huge =
            pod(serde_json::json!([{"name": "a", "resources": {"requests": {"memory": "4Gi"}}}]));
        assert_eq!(
            container_oom_score_adj(&huge, &containers(&huge)[0], cap),
            3
        );
        let be = pod(serde_json::json!([{"name": "a"}]));
        assert_eq!(container_oom_score_adj(&be, &containers(&be)[0], cap), 1000);
    }
}

//! The limits of a pod's cgroup (kubelet's `ResourceConfigForPod`,
//! `pkg/kubelet/cm/helpers_linux.go`).

use k8s_openapi::api::core::v1::Pod;

use super::fs::ResourceConfig;
use super::shares::{MIN_SHARES, milli_cpu_to_quota, milli_cpu_to_shares};
use crate::pod::qos::{QosClass, pod_qos};
use crate::pod::resources::{
    Amounts, pod_level, pod_level_resources_set, pod_limits_list_with, pod_requests,
};
use keelson_common::quantity::Quantity;

/// Limits for the pod cgroup: shares from the summed CPU requests; quota
/// and memory limit only when every container declares that limit
/// (Guaranteed always does) or the pod-level resources set it; BestEffort
/// gets the minimum shares. `period` is the CFS period in µs;
/// `enforce_cpu_limits` false leaves quota at -1; `pids_limit` > 0 caps
/// the number of tasks.
pub fn resource_config_for_pod(
    pod: &Pod,
    enforce_cpu_limits: bool,
    period: u64,
    pids_limit: i64,
) -> ResourceConfig {
    let requests = pod_requests(pod);
    let mut cpu_limits_declared = true;
    let mut memory_limits_declared = true;
    let limits = Amounts::of(&pod_limits_list_with(pod, &mut |res, _| {
        let a = Amounts::of(res);
        if a.cpu_milli == 0 {
            cpu_limits_declared = false;
        }
        if a.memory == 0 {
            memory_limits_declared = false;
        }
    }));
    if pod_level_resources_set(pod) {
        let pl = pod_level(pod).and_then(|r| r.limits.as_ref());
        let of = |name: &str| {
            pl.and_then(|l| l.get(name))
                .and_then(|q| Quantity::parse(&q.0).ok())
                .unwrap_or_default()
        };
        if of("cpu") != Quantity::ZERO {
            cpu_limits_declared = true;
        }
        if of("memory") != Quantity::ZERO {
            memory_limits_declared = true;
        }
    }
    let shares = milli_cpu_to_shares(requests.cpu_milli);
    let quota = if enforce_cpu_limits {
        milli_cpu_to_quota(limits.cpu_milli, i64::try_from(period).unwrap_or(i64::MAX))
    } else {
        -1
    };
    let mut r = ResourceConfig::default();
    match pod_qos(pod) {
        QosClass::Guaranteed => {
            r.cpu_shares = Some(shares);
            r.cpu_quota = Some(quota);
            r.cpu_period = Some(period);
            r.memory = Some(limits.memory);
        }
        QosClass::Burstable => {
            r.cpu_shares = Some(shares);
            if cpu_limits_declared {
                r.cpu_quota = Some(quota);
                r.cpu_period = Some(period);
            }
            if memory_limits_declared {
                r.memory = Some(limits.memory);
            }
        }
        QosClass::BestEffort => {
            r.cpu_shares = Some(MIN_SHARES);
        }
    }
    if pids_limit > 0 {
        r.pids_limit = Some(pids_limit);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(containers: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({"spec": {"containers": containers}}))
            .expect("pod")
    }

    #[test]
    fn guaranteed_gets_everything() {
        let p = pod(serde_json::json!([{"name": "a", "resources": {
            "requests": {"cpu": "500m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "64Mi"}}}]));
        let r = resource_config_for_pod(&p, true, 100_000, 100);
        assert_eq!(r.cpu_shares, Some(512));
        assert_eq!(r.cpu_quota, Some(50_000));
        assert_eq!(r.cpu_period, Some(100_000));
        assert_eq!(r.memory, Some(64 << 20));
        assert_eq!(r.pids_limit, Some(100));
    }

    #[test]
    fn burstable_without_all_limits_gets_only_shares() {
        let p = pod(serde_json::json!([
            {"name": "a", "resources": {"requests": {"cpu": "250m"}, "limits": {"cpu": "1"}}},
            {"name": "b"}
        ]));
        let r = resource_config_for_pod(&p, true, 100_000, -1);
        assert_eq!(r.cpu_shares, Some(256));
        assert_eq!(r.cpu_quota, None);
        assert_eq!(r.memory, None);
        assert_eq!(r.pids_limit, None);
    }

    #[test]
    fn pod_level_limits_declare_the_pod_cgroup_limits() {
        let p: Pod = serde_json::from_value(serde_json::json!({"spec": {
            "resources": {"requests": {"cpu": "500m", "memory": "64Mi"},
                          "limits": {"cpu": "1", "memory": "128Mi"}},
            "containers": [{"name": "a"}, {"name": "b"}]}}))
        .expect("pod");
        let r = resource_config_for_pod(&p, true, 100_000, -1);
        assert_eq!(r.cpu_shares, Some(512));
        assert_eq!(r.cpu_quota, Some(100_000));
        assert_eq!(r.memory, Some(128 << 20));
    }

    #[test]
    fn best_effort_minimum_shares() {
        let r = resource_config_for_pod(&pod(serde_json::json!([{"name": "a"}])), true, 100_000, 0);
        assert_eq!(
            r,
            ResourceConfig {
                cpu_shares: Some(2),
                ..Default::default()
            }
        );
    }
}

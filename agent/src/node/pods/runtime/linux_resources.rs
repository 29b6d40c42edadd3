//! CRI Linux resources of containers and sandboxes (kubelet's
//! `calculateLinuxResources`, `generateLinuxContainerResources`,
//! `calculateSandboxResources`).

use k8s_openapi::api::core::v1::{Container, Pod};
use keelson_cri::api;

use crate::node::cgroups::shares::{milli_cpu_to_quota, milli_cpu_to_shares};
use crate::node::pods::qos::container_oom_score_adj;
use crate::node::pods::resources::{
    Amounts, container_limits, container_requests, pod_level, pod_level_resources_set, pod_limits,
    pod_requests,
};

/// CPU quota settings of the node.
#[derive(Debug, Clone, Copy)]
pub struct CpuQuota {
    /// `cpuCFSQuota`.
    pub enforce: bool,
    /// `cpuCFSQuotaPeriod` in µs.
    pub period_us: i64,
}

/// `calculateLinuxResources`: shares from the request (or the limit when
/// only a limit is set), quota and period from the limit when enforced,
/// the memory limit.
pub fn calculate(
    requests: Amounts,
    limits: Amounts,
    quota: CpuQuota,
) -> api::LinuxContainerResources {
    let shares = milli_cpu_to_shares(requests.cpu_milli);
    let mut r = api::LinuxContainerResources {
        cpu_shares: i64::try_from(shares).unwrap_or(i64::MAX),
        ..Default::default()
    };
    if limits.memory != 0 {
        r.memory_limit_in_bytes = limits.memory;
    }
    if quota.enforce {
        r.cpu_period = quota.period_us;
        r.cpu_quota = milli_cpu_to_quota(limits.cpu_milli, quota.period_us);
    }
    r
}

/// The resources of one container (`generateLinuxContainerResources`),
/// with its OOM score adjustment: with pod-level resources set, the pod's
/// cpu and memory limits stand in for the container's missing ones
/// (`getCPULimit`, `getMemoryLimit`); shares come from the cpu request
/// when one is given (even 0), else from the limit.
pub fn container_resources(
    pod: &Pod,
    c: &Container,
    quota: CpuQuota,
    memory_capacity: i64,
) -> api::LinuxContainerResources {
    let mut limits = container_limits(c);
    if pod_level_resources_set(pod) {
        let pl = crate::node::pods::resources::parse_list(
            pod_level(pod).and_then(|r| r.limits.as_ref()),
        );
        let pl = Amounts::of(&pl);
        if limits.cpu_milli == 0 {
            limits.cpu_milli = pl.cpu_milli;
        }
        if limits.memory == 0 {
            limits.memory = pl.memory;
        }
    }
    let mut requests = container_requests(c);
    let cpu_request_given = c
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .is_some_and(|r| r.contains_key("cpu"));
    if !cpu_request_given {
        // No request: shares follow the limit (the API server defaults
        // requests to limits for new containers; kubelet repeats it).
        requests.cpu_milli = limits.cpu_milli;
    }
    let mut r = calculate(requests, limits, quota);
    r.oom_score_adj = container_oom_score_adj(pod, c, memory_capacity);
    r
}

/// The sandbox's resources (the whole pod, overhead excluded) and its
/// overhead, for runtimes that size the sandbox.
pub fn sandbox_resources(
    pod: &Pod,
    quota: CpuQuota,
) -> (
    api::LinuxContainerResources,
    Option<api::LinuxContainerResources>,
) {
    let overhead = crate::node::pods::resources::quantity_of(
        pod.spec.as_ref().and_then(|s| s.overhead.as_ref()),
        "cpu",
    );
    let overhead_mem = crate::node::pods::resources::quantity_of(
        pod.spec.as_ref().and_then(|s| s.overhead.as_ref()),
        "memory",
    );
    let has_overhead = pod
        .spec
        .as_ref()
        .and_then(|s| s.overhead.as_ref())
        .is_some();
    let ov = Amounts {
        cpu_milli: i64::try_from(overhead.milli_value()).unwrap_or(0),
        memory: i64::try_from(overhead_mem.value()).unwrap_or(0),
    };
    let mut req = pod_requests(pod);
    req.cpu_milli -= ov.cpu_milli;
    req.memory -= ov.memory;
    let mut lim = pod_limits(pod);
    if lim.cpu_milli > 0 {
        lim.cpu_milli -= ov.cpu_milli;
    }
    if lim.memory > 0 {
        lim.memory -= ov.memory;
    }
    let res = calculate(req, lim, quota);
    let overhead = has_overhead.then(|| calculate(ov, ov, quota));
    (res, overhead)
}

#[cfg(test)]
mod tests {
    use super::*;

    const Q: CpuQuota = CpuQuota {
        enforce: true,
        period_us: 100_000,
    };

    #[test]
    fn limits_only_use_limit_for_shares() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "spec": {"containers": [
                {"name": "a", "resources": {"limits": {"cpu": "500m", "memory": "1Mi"}}},
                {"name": "b", "resources": {"requests": {"cpu": "0"}, "limits": {"cpu": "500m"}}}
            ]}
        }))
        .expect("pod");
        let cs = &pod.spec.as_ref().expect("s").containers;
        let r = container_resources(&pod, &cs[0], Q, 1 << 30);
        assert_eq!(r.cpu_shares, 512);
        assert_eq!(r.cpu_quota, 50_000);
        assert_eq!(r.cpu_period, 100_000);
        assert_eq!(r.memory_limit_in_bytes, 1 << 20);
        // An explicit zero request is the minimum, whatever the limit.
        assert_eq!(container_resources(&pod, &cs[1], Q, 1 << 30).cpu_shares, 2);
        let r = calculate(Amounts::default(), Amounts::default(), Q);
        assert_eq!(
            (r.cpu_shares, r.cpu_quota, r.memory_limit_in_bytes),
            (2, 0, 0)
        );
    }

    #[test]
    fn pod_level_limits_stand_in_for_the_containers() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "spec": {"resources": {"limits": {"cpu": "2", "memory": "1Gi"}},
                     "containers": [{"name": "a"}]}
        }))
        .expect("pod");
        let r = container_resources(
            &pod,
            &pod.spec.as_ref().expect("s").containers[0],
            Q,
            1 << 32,
        );
        assert_eq!(
            (r.cpu_quota, r.memory_limit_in_bytes, r.cpu_shares),
            (200_000, 1 << 30, 2048)
        );
    }

    #[test]
    fn container_gets_oom_score() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "spec": {"containers": [{"name": "a"}]}
        }))
        .expect("pod");
        let r = container_resources(
            &pod,
            &pod.spec.as_ref().expect("s").containers[0],
            Q,
            1 << 30,
        );
        assert_eq!(r.oom_score_adj, 1000);
    }
}

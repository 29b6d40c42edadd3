//! CRI Linux resources of containers and sandboxes (kubelet's
//! `calculateLinuxResources`, `generateLinuxContainerResources`,
//! `calculateSandboxResources`).

use k8s_openapi::api::core::v1::{Container, Pod};
use keelson_cri::api;

use crate::node::cgroups::shares::{milli_cpu_to_quota, milli_cpu_to_shares};
use crate::node::pods::qos::container_oom_score_adj;
use crate::node::pods::resources::{
    Amounts, container_limits, container_requests, pod_limits, pod_requests,
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
    let shares = if requests.cpu_milli == 0 && limits.cpu_milli != 0 {
        milli_cpu_to_shares(limits.cpu_milli)
    } else {
        milli_cpu_to_shares(requests.cpu_milli)
    };
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

/// The resources of one container, with its OOM score adjustment.
pub fn container_resources(
    pod: &Pod,
    c: &Container,
    quota: CpuQuota,
    memory_capacity: i64,
) -> api::LinuxContainerResources {
    let mut r = calculate(container_requests(c), container_limits(c), quota);
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
        let r = calculate(
            Amounts::default(),
            Amounts {
                cpu_milli: 500,
                memory: 1 << 20,
            },
            Q,
        );
        assert_eq!(r.cpu_shares, 512);
        assert_eq!(r.cpu_quota, 50_000);
        assert_eq!(r.cpu_period, 100_000);
        assert_eq!(r.memory_limit_in_bytes, 1 << 20);
        let r = calculate(Amounts::default(), Amounts::default(), Q);
        assert_eq!(
            (r.cpu_shares, r.cpu_quota, r.memory_limit_in_bytes),
            (2, 0, 0)
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

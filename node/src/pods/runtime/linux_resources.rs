//! CRI Linux resources of containers and sandboxes (kubelet's
//! `calculateLinuxResources`, `generateLinuxContainerResources`,
//! `GetHugepageLimitsFromResources`, `configureContainerSwapResources`
//! and `calculateSandboxResources`, in
//! pkg/kubelet/kuberuntime/kuberuntime_container_linux.go and
//! kuberuntime_sandbox_linux.go).

use k8s_openapi::api::core::v1::{Container, Pod};
use keelson_cri::api;

use super::linux_host::{LinuxHost, page_size_name};
use crate::cgroups::shares::{milli_cpu_to_quota, milli_cpu_to_shares};
use crate::pod::qos::container_oom_score_adj;
use crate::pod::resources::{
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
/// the memory limit, and on cgroup v2 `memory.oom.group=1` unless
/// `singleProcessOOMKill`.
pub fn calculate(
    requests: Amounts,
    limits: Amounts,
    quota: CpuQuota,
    host: &LinuxHost,
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
    if host.cgroup_v2 && !host.single_process_oom_kill {
        r.unified
            .insert("memory.oom.group".to_string(), "1".to_string());
    }
    r
}

/// `GetHugepageLimitsFromResources`: a limit for every page size of the
/// host, 0 unless the container (or else the pod, with pod-level
/// resources) limits `hugepages-<size>`.
fn hugepage_limits(pod: &Pod, c: &Container, host: &LinuxHost) -> Vec<api::HugepageLimit> {
    let mut wanted = std::collections::BTreeMap::new();
    let mut read = |list: Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >| {
        for (name, q) in crate::pod::resources::parse_list(list) {
            let Some(size) = name.strip_prefix("hugepages-") else {
                continue;
            };
            let Some(page) = keelson_common::quantity::Quantity::parse(size)
                .ok()
                .and_then(|s| u64::try_from(s.value()).ok())
                .and_then(page_size_name)
            else {
                tracing::info!(resource = %name, "failed to get hugepage size from resource");
                continue;
            };
            wanted.insert(page, q.value_u64());
        }
    };
    if pod_level_resources_set(pod) {
        read(pod_level(pod).and_then(|r| r.limits.as_ref()));
    }
    read(c.resources.as_ref().and_then(|r| r.limits.as_ref()));
    host.hugepage_sizes
        .iter()
        .map(|page| api::HugepageLimit {
            page_size: page.clone(),
            limit: wanted.get(page).copied().unwrap_or(0),
        })
        .collect()
}

/// `ConfigureNoSwap` (keelson's only swap behaviour, kubelet's default):
/// with a swap controller, the memory+swap limit equals the memory limit
/// on v1 and `memory.swap.max` is 0 on v2.
fn no_swap(r: &mut api::LinuxContainerResources, host: &LinuxHost) {
    if !host.swap_controller {
        return;
    }
    if host.cgroup_v2 {
        r.unified
            .insert("memory.swap.max".to_string(), "0".to_string());
    } else {
        r.memory_swap_limit_in_bytes = r.memory_limit_in_bytes;
    }
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
    host: &LinuxHost,
) -> api::LinuxContainerResources {
    let mut limits = container_limits(c);
    if pod_level_resources_set(pod) {
        let pl = crate::pod::resources::parse_list(pod_level(pod).and_then(|r| r.limits.as_ref()));
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
    let mut r = calculate(requests, limits, quota, host);
    r.oom_score_adj = container_oom_score_adj(pod, c, memory_capacity);
    r.hugepage_limits = hugepage_limits(pod, c, host);
    no_swap(&mut r, host);
    r
}

/// The sandbox's resources (the whole pod, overhead excluded) and its
/// overhead, for runtimes that size the sandbox.
pub fn sandbox_resources(
    pod: &Pod,
    quota: CpuQuota,
    host: &LinuxHost,
) -> (
    api::LinuxContainerResources,
    Option<api::LinuxContainerResources>,
) {
    let overhead = crate::pod::resources::quantity_of(
        pod.spec.as_ref().and_then(|s| s.overhead.as_ref()),
        "cpu",
    );
    let overhead_mem = crate::pod::resources::quantity_of(
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
    let res = calculate(req, lim, quota, host);
    let overhead = has_overhead.then(|| calculate(ov, ov, quota, host));
    (res, overhead)
}

#[cfg(test)]
mod tests {
    use super::*;

    const Q: CpuQuota = CpuQuota {
        enforce: true,
        period_us: 100_000,
    };

    const V1: LinuxHost = LinuxHost {
        cgroup_v2: false,
        swap_controller: false,
        hugepage_sizes: Vec::new(),
        single_process_oom_kill: true,
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
        let r = container_resources(&pod, &cs[0], Q, 1 << 30, &V1);
        assert_eq!(r.cpu_shares, 512);
        assert_eq!(r.cpu_quota, 50_000);
        assert_eq!(r.cpu_period, 100_000);
        assert_eq!(r.memory_limit_in_bytes, 1 << 20);
        // An explicit zero request is the minimum, whatever the limit.
        assert_eq!(
            container_resources(&pod, &cs[1], Q, 1 << 30, &V1).cpu_shares,
            2
        );
        let r = calculate(Amounts::default(), Amounts::default(), Q, &V1);
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
            &V1,
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
            &V1,
        );
        assert_eq!(r.oom_score_adj, 1000);
    }

    fn host(cgroup_v2: bool, swap_controller: bool) -> LinuxHost {
        LinuxHost {
            cgroup_v2,
            swap_controller,
            hugepage_sizes: vec!["2MB".into(), "1GB".into()],
            single_process_oom_kill: !cgroup_v2,
        }
    }

    #[test]
    fn hugepage_limits_cover_every_page_size() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "spec": {"resources": {"limits": {"hugepages-1Gi": "2Gi", "hugepages-2Mi": "8Mi"}},
                     "containers": [{"name": "a", "resources": {"limits": {"hugepages-2Mi": "4Mi", "memory": "1Gi"}}},
                                    {"name": "b"}]}
        }))
        .expect("pod");
        let cs = &pod.spec.as_ref().expect("s").containers;
        let limits = |r: api::LinuxContainerResources| {
            r.hugepage_limits
                .into_iter()
                .map(|h| (h.page_size, h.limit))
                .collect::<Vec<_>>()
        };
        // The container's own limit wins over the pod's for its page size.
        assert_eq!(
            limits(container_resources(
                &pod,
                &cs[0],
                Q,
                1 << 32,
                &host(false, true)
            )),
            vec![("2MB".into(), 4 << 20), ("1GB".into(), 2 << 30)]
        );
        assert_eq!(
            limits(container_resources(
                &pod,
                &cs[1],
                Q,
                1 << 32,
                &host(false, true)
            )),
            vec![("2MB".into(), 8 << 20), ("1GB".into(), 2 << 30)]
        );
        // Without pod-level resources, sizes not asked for are limited to 0.
        let mut plain = pod.clone();
        plain.spec.as_mut().expect("s").resources = None;
        assert_eq!(
            limits(container_resources(
                &plain,
                &cs[1],
                Q,
                1 << 32,
                &host(false, true)
            )),
            vec![("2MB".into(), 0), ("1GB".into(), 0)]
        );
    }

    #[test]
    fn no_swap_and_the_oom_group_follow_the_cgroup_version() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "spec": {"containers": [{"name": "a", "resources": {"limits": {"memory": "64Mi"}}}]}
        }))
        .expect("pod");
        let c = &pod.spec.as_ref().expect("s").containers[0];
        let v1 = container_resources(&pod, c, Q, 1 << 32, &host(false, true));
        assert_eq!(v1.memory_swap_limit_in_bytes, 64 << 20);
        assert!(v1.unified.is_empty(), "{:?}", v1.unified);
        let v2 = container_resources(&pod, c, Q, 1 << 32, &host(true, true));
        assert_eq!(v2.memory_swap_limit_in_bytes, 0);
        assert_eq!(
            v2.unified.get("memory.swap.max").map(String::as_str),
            Some("0")
        );
        assert_eq!(
            v2.unified.get("memory.oom.group").map(String::as_str),
            Some("1")
        );
        // No swap controller: nothing about swap.
        let none = container_resources(&pod, c, Q, 1 << 32, &host(true, false));
        assert!(!none.unified.contains_key("memory.swap.max"));
        let mut single = host(true, true);
        single.single_process_oom_kill = true;
        let s = container_resources(&pod, c, Q, 1 << 32, &single);
        assert!(!s.unified.contains_key("memory.oom.group"));
    }
}

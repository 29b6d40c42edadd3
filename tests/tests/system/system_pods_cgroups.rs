//! System test of the cgroup v1 implementation on this machine's real
//! hierarchies (cpu, memory, pids, cpuset mounted per controller): QoS
//! tiers and a pod cgroup with its limits, a process moved in and killed on
//! destroy, everything below a test-unique root removed at the end (also
//! on failure).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;
use std::sync::Arc;

use keelson::node::cgroups::{
    self, CgroupFs, CgroupMode, CgroupName, PodCgroups, QosCgroups, ResourceConfig,
};
use keelson_tests::support::require_root;

/// Removes the test's cgroup root from every hierarchy on drop.
struct Cleanup(Arc<dyn CgroupFs>, CgroupName);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = self.0.destroy(&self.1);
    }
}

#[test]
fn v1_qos_tiers_and_pod_cgroup_on_the_real_hierarchy() {
    if !require_root("v1_qos_tiers_and_pod_cgroup_on_the_real_hierarchy") {
        return;
    }
    let mode = cgroups::detect_mode(std::path::Path::new("/proc/self/mountinfo")).unwrap();
    let CgroupMode::V1 { mounts } = mode else {
        keelson_tests::support::skip(
            "v1_qos_tiers_and_pod_cgroup_on_the_real_hierarchy",
            "this host runs cgroup v2 only; v1 is tested where it exists",
        );
        return;
    };
    let fs: Arc<dyn CgroupFs> = Arc::new(cgroups::v1::V1::new(mounts.clone()));
    assert_eq!(fs.version(), "v1");
    let root = format!("/keelson-cgtest-{}", keelson_tests::netns::unique_suffix());
    let _cleanup = Cleanup(fs.clone(), CgroupName::from_cgroupfs(&root));

    let qos = QosCgroups::new(fs.clone(), &root);
    qos.setup(
        &ResourceConfig {
            cpu_shares: Some(2048),
            memory: Some(1 << 30),
            ..Default::default()
        },
        &[],
    )
    .unwrap();
    let cpu = &mounts["cpu"];
    let mem = &mounts["memory"];
    let kubepods = cpu.join(root.trim_start_matches('/')).join("kubepods");
    assert_eq!(
        std::fs::read_to_string(kubepods.join("cpu.shares"))
            .unwrap()
            .trim(),
        "2048"
    );
    assert_eq!(
        std::fs::read_to_string(
            mem.join(root.trim_start_matches('/'))
                .join("kubepods/memory.limit_in_bytes")
        )
        .unwrap()
        .trim(),
        (1u64 << 30).to_string()
    );
    assert_eq!(
        std::fs::read_to_string(kubepods.join("besteffort/cpu.shares"))
            .unwrap()
            .trim(),
        "2"
    );

    let pods = PodCgroups::new(Some(qos), &root, true, 100_000, 64);
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"uid": "0000-test"},
        "spec": {"containers": [{"name": "a", "resources": {
            "requests": {"cpu": "250m", "memory": "32Mi"}, "limits": {"cpu": "250m", "memory": "32Mi"}}}]}
    }))
    .unwrap();
    pods.ensure(&pod, &[Arc::new(pod.clone())]).unwrap();
    let name = pods.name_of(&pod);
    assert_eq!(name.to_cgroupfs(), format!("{root}/kubepods/pod0000-test"));
    let r = fs.read(&name).unwrap();
    assert_eq!(r.cpu_shares, Some(256));
    assert_eq!(r.cpu_quota, Some(25_000));
    assert_eq!(r.cpu_period, Some(100_000));
    assert_eq!(r.memory, Some(32 << 20));
    assert_eq!(r.pids_limit, Some(64));
    // cpuset inherited the parent's CPUs.
    if let Some(cpuset) = mounts.get("cpuset") {
        let cpus =
            std::fs::read_to_string(cpuset.join(name.relative()).join("cpuset.cpus")).unwrap();
        assert!(!cpus.trim().is_empty());
    }

    // A process in the pod cgroup is killed when the cgroup is destroyed.
    let mut child = Command::new("sleep").arg("300").spawn().unwrap();
    let pid = child.id();
    for m in ["cpu", "memory", "pids"] {
        std::fs::write(
            mounts[m].join(name.relative()).join("cgroup.procs"),
            pid.to_string(),
        )
        .unwrap();
    }
    assert_eq!(fs.pids(&name).unwrap(), vec![pid as i32]);
    assert_eq!(pods.existing().unwrap().len(), 1);
    pods.destroy("0000-test").unwrap();
    assert!(!fs.exists(&name));
    let status = child.wait().unwrap();
    assert!(!status.success(), "the process was killed");
}

//! Running the real kubelet on a test node without touching the host.
//!
//! kubelet writes a few kernel settings that are not per-namespace
//! (`vm.overcommit_memory`, `vm.panic_on_oom`, `kernel.panic`,
//! `kernel.panic_on_oops`, `kernel.keys.root_max{keys,bytes}`: kubelet's
//! `setupKernelTunables`, pkg/kubelet/cm/container_manager_linux.go), and
//! refuses to start with `protectKernelDefaults` when they differ. So it
//! runs in a mount namespace of its own where those `/proc/sys` files are
//! bind mounts of plain files in its directory: its writes land there.
//! Its volume mounts must still reach containerd (which runs in the host's
//! mount namespace): its root dir is made a shared mount first, so mounts
//! under it propagate back. The network is the node's namespace
//! (`nsenter --net`).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::mount::{MsFlags, mount};

use super::UpstreamError;
use crate::netns::NetNs;

/// The kernel settings kubelet writes, as `/proc/sys` paths.
pub const KERNEL_TUNABLES: [&str; 6] = [
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

/// What the KubeletConfiguration is made of.
#[derive(Debug)]
pub struct ConfigInputs<'a> {
    /// containerd's CRI endpoint.
    pub runtime_endpoint: &'a str,
    /// The containerd instance's cgroup (pods go below it).
    pub cgroup_root: &'a str,
    /// The CA of client certificates (the API server's kubelet client).
    pub client_ca: &'a Path,
    /// The serving certificate (signed by the CA the API server checks).
    pub serving_cert: &'a Path,
    /// Its key.
    pub serving_key: &'a Path,
    /// Where container logs go.
    pub pod_logs_dir: &'a Path,
    /// `clusterDNS`.
    pub cluster_dns: IpAddr,
    /// `clusterDomain`.
    pub cluster_domain: &'a str,
}

/// The KubeletConfiguration of a test node: what this machine needs
/// (`failCgroupV1: false` on its hybrid cgroups, `failSwapOn: false`,
/// cgroupfs), the kubelet API's authentication and authorization as a
/// cluster sets them, and the host's disk kept out of eviction and image
/// GC (a nearly full test machine must not evict the tests' pods).
pub fn config(i: &ConfigInputs<'_>) -> serde_yaml::Mapping {
    let text = format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
failSwapOn: false
cgroupDriver: cgroupfs
cgroupRoot: {cgroup_root}
containerRuntimeEndpoint: {endpoint}
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {ca}
authorization:
  mode: Webhook
tlsCertFile: {crt}
tlsPrivateKeyFile: {key}
healthzBindAddress: 127.0.0.1
healthzPort: 10248
serializeImagePulls: false
podLogsDir: {logs}
clusterDNS:
- {dns}
clusterDomain: {domain}
rotateCertificates: false
evictionHard:
  memory.available: 100Mi
imageGCHighThresholdPercent: 100
",
        cgroup_root = i.cgroup_root,
        endpoint = i.runtime_endpoint,
        ca = i.client_ca.display(),
        crt = i.serving_cert.display(),
        key = i.serving_key.display(),
        logs = i.pod_logs_dir.display(),
        dns = i.cluster_dns,
        domain = i.cluster_domain,
    );
    serde_yaml::from_str(&text).unwrap_or_default()
}

/// Where kubelet's files are.
#[derive(Debug)]
pub struct Layout<'a> {
    /// The node's agents' directory.
    pub dir: &'a Path,
    /// The KubeletConfiguration file.
    pub config: &'a Path,
    /// The node's kubeconfig.
    pub kubeconfig: &'a Path,
    /// `--hostname-override`.
    pub node_name: &'a str,
    /// `--node-ip`.
    pub node_ip: IpAddr,
    /// `--v`.
    pub verbosity: u8,
    /// The node's containerd socket, for kubelet's cAdvisor (its
    /// `--containerd` flag; on a real node containerd listens on the
    /// default `/run/containerd/containerd.sock`): without it cAdvisor
    /// sees containers as bare cgroups, without image, pod or container
    /// labels, in `/metrics/cadvisor`.
    pub containerd_socket: &'a Path,
    /// More flags.
    pub extra: &'a [String],
}

/// Creates `cgroup_root` in every hierarchy under `/sys/fs/cgroup` (kubelet
/// refuses a `cgroupRoot` missing from any), with the cpuset copied from
/// the top so tasks may join. The containerd harness removes them with the
/// instance's cgroups.
pub fn create_cgroup_root(cgroup_root: &str) -> Result<(), UpstreamError> {
    let name = cgroup_root.trim_start_matches('/');
    let hierarchies =
        std::fs::read_dir("/sys/fs/cgroup").map_err(UpstreamError::io("listing /sys/fs/cgroup"))?;
    for h in hierarchies.flatten() {
        let top = h.path();
        if !top.join("cgroup.procs").exists() {
            continue;
        }
        let dir = top.join(name);
        std::fs::create_dir_all(&dir)
            .map_err(UpstreamError::io(format!("creating {}", dir.display())))?;
        for f in ["cpuset.cpus", "cpuset.mems"] {
            if let Ok(v) = std::fs::read_to_string(top.join(f)) {
                std::fs::write(dir.join(f), v.trim())
                    .map_err(UpstreamError::io(format!("writing {}/{f}", dir.display())))?;
            }
        }
    }
    Ok(())
}

/// kubelet's `--root-dir` below the node's agents' directory `dir`.
pub fn root_dir(dir: &Path) -> PathBuf {
    dir.join("kubelet-root")
}

/// The command that starts kubelet in `ns` with its kernel settings
/// redirected to files (see the module doc). Makes `dir/kubelet-root` a
/// shared mount (detached with the containerd instance's directory).
pub fn command(ns: &NetNs, kubelet: &Path, l: &Layout<'_>) -> Result<Command, UpstreamError> {
    let root = root_dir(l.dir);
    std::fs::create_dir_all(&root).map_err(UpstreamError::io("creating kubelet's root dir"))?;
    let none: Option<&str> = None;
    let mounted = crate::containerd::mounts_under(&root).contains(&root);
    if !mounted {
        mount(Some(&root), &root, none, MsFlags::MS_BIND, none).map_err(|e| {
            UpstreamError::Setup {
                context: format!("bind-mounting {}", root.display()),
                message: e.to_string(),
            }
        })?;
    }
    mount(none, &root, none, MsFlags::MS_SHARED, none).map_err(|e| UpstreamError::Setup {
        context: format!("making {} shared", root.display()),
        message: e.to_string(),
    })?;
    let tunables = l.dir.join("kubelet-sysctl");
    std::fs::create_dir_all(&tunables).map_err(UpstreamError::io("creating sysctl dir"))?;
    let mut script = String::from("set -e\n");
    for key in KERNEL_TUNABLES {
        let real = Path::new("/proc/sys").join(key);
        let current = std::fs::read_to_string(&real)
            .map_err(UpstreamError::io(format!("reading {}", real.display())))?;
        let shadow = tunables.join(key.replace('/', "."));
        std::fs::write(&shadow, current).map_err(UpstreamError::io("writing a sysctl shadow"))?;
        script.push_str(&format!(
            "mount --bind '{}' '{}'\n",
            shadow.display(),
            real.display()
        ));
    }
    script.push_str("exec \"$@\"\n");
    let mut cmd = ns.command("unshare");
    cmd.args([
        "--mount",
        "--propagation",
        "unchanged",
        "--",
        "/bin/sh",
        "-c",
    ])
    .arg(script)
    .arg("kubelet")
    .arg(kubelet)
    .arg(format!("--config={}", l.config.display()))
    .arg(format!("--kubeconfig={}", l.kubeconfig.display()))
    .arg(format!("--root-dir={}", root.display()))
    .arg(format!(
        "--cert-dir={}",
        l.dir.join("kubelet-pki").display()
    ))
    .arg(format!("--hostname-override={}", l.node_name))
    .arg(format!("--node-ip={}", l.node_ip))
    .arg("--v=2")
    .arg(format!("--containerd={}", l.containerd_socket.display()))
    .args(l.extra);
    Ok(cmd)
}

//! The private containerd's config file and CNI network, rendered from the
//! instance's paths. Pure functions, so they are unit-tested without root.

use std::path::Path;

/// Everything the rendered files depend on.
#[derive(Debug, Clone)]
pub struct Layout<'a> {
    /// The instance directory (root, state, sockets, CNI conf all live under it).
    pub dir: &'a Path,
    /// The CNI network name (unique per instance, so CNI's result cache
    /// entries under /var/lib/cni can be told apart and removed).
    pub network: &'a str,
    /// The pod subnet (IPv4 CIDR).
    pub pod_cidr: &'a str,
    /// The sandbox image.
    pub sandbox_image: &'a str,
    /// runc's `systemd` cgroup driver (`SystemdCgroup = true`) instead of
    /// cgroupfs.
    pub systemd_cgroup: bool,
    /// The CNI `portmap` plugin after the bridge, so a container's
    /// `hostPort` is forwarded (iptables rules in the node's namespace).
    pub host_ports: bool,
}

impl Layout<'_> {
    /// containerd's gRPC socket.
    pub fn socket(&self) -> std::path::PathBuf {
        self.dir.join("containerd.sock")
    }
}

/// containerd config (version 2) with the CRI plugin on, cgroupfs (or
/// runc's systemd driver when asked), our CNI
/// conf dir, every root/state path private to the instance, and nothing
/// that writes to the host's shared places: no AppArmor profile loading,
/// sandbox netns mounts under the state dir (not /run/netns), runc state
/// under the instance dir.
pub fn containerd_toml(l: &Layout<'_>) -> String {
    let d = l.dir.display();
    format!(
        r#"version = 2
root = "{d}/root"
state = "{d}/state"
oom_score = 0
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "{d}/containerd.sock"

[ttrpc]
  address = "{d}/containerd.sock.ttrpc"

[debug]
  address = ""
  level = "info"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  tolerate_missing_hugetlb_controller = true
  disable_hugetlb_controller = true
  max_container_log_line_size = 16384

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = {systemd}
        Root = "{d}/runc"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{d}/cni"
    max_conf_num = 1
"#,
        sandbox = l.sandbox_image,
        systemd = l.systemd_cgroup,
    )
}

/// A bridge network with host-local IPAM (its allocation store private to
/// the instance), the bridge being the pods' gateway; with
/// [`Layout::host_ports`], `portmap` chained after it (what upstream's
/// conformance clusters run for `hostPort`).
pub fn cni_conflist(l: &Layout<'_>) -> String {
    let mut plugins = vec![serde_json::json!({
            "type": "bridge",
            "bridge": "kbr0",
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "ranges": [[{ "subnet": l.pod_cidr }]],
                "routes": [{ "dst": "0.0.0.0/0" }],
                "dataDir": l.dir.join("ipam").display().to_string(),
            }
    })];
    if l.host_ports {
        plugins.push(serde_json::json!({
            "type": "portmap",
            "capabilities": { "portMappings": true },
        }));
    }
    serde_json::json!({
        "cniVersion": "0.4.0",
        "name": l.network,
        "plugins": plugins,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(dir: &Path) -> Layout<'_> {
        Layout {
            dir,
            network: "keelson-test-1",
            pod_cidr: "10.244.0.0/24",
            sandbox_image: "keelson.local/pause:3.10",
            systemd_cgroup: false,
            host_ports: false,
        }
    }

    #[test]
    fn config_keeps_everything_under_the_instance_dir() {
        let dir = Path::new("/var/tmp/keelson-containerd/x1");
        let toml = containerd_toml(&layout(dir));
        for needle in [
            "root = \"/var/tmp/keelson-containerd/x1/root\"",
            "state = \"/var/tmp/keelson-containerd/x1/state\"",
            "address = \"/var/tmp/keelson-containerd/x1/containerd.sock\"",
            "conf_dir = \"/var/tmp/keelson-containerd/x1/cni\"",
            "Root = \"/var/tmp/keelson-containerd/x1/runc\"",
            "path = \"/var/tmp/keelson-containerd/x1/opt\"",
            "restrict_oom_score_adj = true",
            "SystemdCgroup = false",
            "netns_mounts_under_state_dir = true",
            "sandbox_image = \"keelson.local/pause:3.10\"",
        ] {
            assert!(toml.contains(needle), "missing {needle}");
        }
    }

    #[test]
    fn systemd_cgroup_driver_is_asked_for() {
        let dir = Path::new("/d");
        let l = Layout {
            systemd_cgroup: true,
            ..layout(dir)
        };
        assert!(containerd_toml(&l).contains("SystemdCgroup = true"));
    }

    #[test]
    fn cni_network_is_a_private_bridge() {
        let dir = Path::new("/d");
        let v: serde_json::Value = serde_json::from_str(&cni_conflist(&layout(dir))).expect("json");
        assert_eq!(v["name"], "keelson-test-1");
        assert_eq!(v["plugins"][0]["type"], "bridge");
        assert_eq!(
            v["plugins"][0]["ipam"]["ranges"][0][0]["subnet"],
            "10.244.0.0/24"
        );
        assert_eq!(v["plugins"][0]["ipam"]["dataDir"], "/d/ipam");
        assert_eq!(v["plugins"].as_array().map(Vec::len), Some(1));
    }

    #[test]
    fn host_ports_chain_portmap_after_the_bridge() {
        let dir = Path::new("/d");
        let l = Layout {
            host_ports: true,
            ..layout(dir)
        };
        let v: serde_json::Value = serde_json::from_str(&cni_conflist(&l)).expect("json");
        assert_eq!(v["plugins"][0]["type"], "bridge");
        assert_eq!(v["plugins"][1]["type"], "portmap");
        assert_eq!(v["plugins"][1]["capabilities"]["portMappings"], true);
    }
}

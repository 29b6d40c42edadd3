//! The `/etc/hosts` kubelet writes for each pod (`<podDir>/etc-hosts`,
//! mounted into every container that does not mount `/etc/hosts` itself):
//! a managed file with the pod's IPs and host name, or for host-network
//! pods a copy of the node's file; `hostAliases` appended to both.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{HostAlias, Pod};
use keelson_cri::api;

use crate::pod::podutil;

/// The managed file for a pod network pod.
pub fn managed_content(
    pod_ips: &[String],
    hostname: &str,
    domain: &str,
    aliases: &[HostAlias],
) -> String {
    let mut s = String::from(
        "# Kubernetes-managed hosts file.\n\
         127.0.0.1\tlocalhost\n\
         ::1\tlocalhost ip6-localhost ip6-loopback\n\
         fe00::0\tip6-localnet\n\
         fe00::0\tip6-mcastprefix\n\
         fe00::1\tip6-allnodes\n\
         fe00::2\tip6-allrouters\n",
    );
    for ip in pod_ips {
        if domain.is_empty() {
            s.push_str(&format!("{ip}\t{hostname}\n"));
        } else {
            s.push_str(&format!("{ip}\t{hostname}.{domain}\t{hostname}\n"));
        }
    }
    s.push_str(&aliases_content(aliases));
    s
}

fn aliases_content(aliases: &[HostAlias]) -> String {
    if aliases.is_empty() {
        return String::new();
    }
    let mut s = String::from("\n# Entries added by HostAliases.\n");
    for a in aliases {
        let names = a.hostnames.clone().unwrap_or_default();
        s.push_str(&format!("{}\t{}\n", a.ip, names.join("\t")));
    }
    s
}

/// The file for a host network pod: the node's file plus aliases.
pub fn host_network_content(node_hosts: &str, aliases: &[HostAlias]) -> String {
    let mut s = String::from("# Kubernetes-managed hosts file (host network).\n");
    s.push_str(node_hosts);
    s.push_str(&aliases_content(aliases));
    s
}

/// Why the pod's hosts file could not be written.
#[derive(Debug, thiserror::Error)]
pub enum HostsFileError {
    /// The pod directory could not be created.
    #[error("creating {}: {error}", dir.display())]
    CreateDir {
        /// The pod directory.
        dir: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The file could not be written.
    #[error("writing {}: {error}", path.display())]
    Write {
        /// `<pod_dir>/etc-hosts`.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
}

/// Writes `<pod_dir>/etc-hosts` and returns the mount for it.
pub fn ensure_hosts_file(
    pod_dir: &Path,
    pod: &Pod,
    pod_ips: &[String],
    hostname: &str,
    domain: &str,
) -> Result<api::Mount, HostsFileError> {
    let aliases = podutil::spec(pod).host_aliases.clone().unwrap_or_default();
    let content = if podutil::is_host_network(pod) {
        let node = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
        host_network_content(&node, &aliases)
    } else {
        managed_content(pod_ips, hostname, domain, &aliases)
    };
    std::fs::create_dir_all(pod_dir).map_err(|error| HostsFileError::CreateDir {
        dir: pod_dir.to_path_buf(),
        error,
    })?;
    let path: PathBuf = pod_dir.join("etc-hosts");
    if let Err(error) = std::fs::write(&path, content) {
        return Err(HostsFileError::Write { path, error });
    }
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644));
    Ok(api::Mount {
        container_path: "/etc/hosts".into(),
        host_path: path.display().to_string(),
        readonly: false,
        selinux_relabel: false,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn managed_file() {
        let aliases = vec![HostAlias {
            ip: "10.1.2.3".into(),
            hostnames: Some(vec!["foo".into(), "bar".into()]),
        }];
        let s = managed_content(
            &["10.88.0.4".into()],
            "web-0",
            "web.ns.svc.cluster.local",
            &aliases,
        );
        assert!(s.starts_with("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n"));
        assert!(s.contains("10.88.0.4\tweb-0.web.ns.svc.cluster.local\tweb-0\n"));
        assert!(s.ends_with("# Entries added by HostAliases.\n10.1.2.3\tfoo\tbar\n"));
        let plain = managed_content(&["10.88.0.4".into()], "p", "", &[]);
        assert!(plain.ends_with("10.88.0.4\tp\n"));
    }
}

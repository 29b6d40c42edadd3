//! Where kubeadm leaves kubelet's files on a node, and where the migration
//! puts keelson's. kubeadm's layout: `cmd/kubeadm/app/constants/constants.go`
//! (`KubeletRunDirectory`, `KubeletConfigurationFileName`,
//! `KubeletEnvFileName`, `KubeletKubeConfigFileName`, `KubeProxyConfigMap`,
//! `KubeProxyConfigMapKey`) and `cmd/kubeadm/app/phases/kubelet/flags.go`;
//! the unit's drop-in (`10-kubeadm.conf` of kubeadm's packages) reads
//! `/var/lib/kubelet/kubeadm-flags.env`, then `/etc/default/kubelet`.

/// kubelet's configuration file (`/var/lib/kubelet/config.yaml`).
pub const KUBELET_CONFIG: &str = "/var/lib/kubelet/config.yaml";
/// kubeadm's flags file (`KUBELET_KUBEADM_ARGS`).
pub const KUBEADM_FLAGS: &str = "/var/lib/kubelet/kubeadm-flags.env";
/// The operator's extra flags (`KUBELET_EXTRA_ARGS`; Debian's location).
pub const KUBELET_DEFAULTS: &str = "/etc/default/kubelet";
/// The node's kubeconfig.
pub const KUBELET_KUBECONFIG: &str = "/etc/kubernetes/kubelet.conf";
/// The rotating client certificate `kubelet.conf` names (a link).
pub const KUBELET_CLIENT_CURRENT: &str = "/var/lib/kubelet/pki/kubelet-client-current.pem";
/// kubelet's root dir (`--root-dir`'s default): keelson keeps it, so the
/// running pods' volumes stay where their containers mount them.
pub const KUBELET_ROOT_DIR: &str = "/var/lib/kubelet";
/// kube-proxy's ConfigMap (namespace, name, key).
pub const KUBE_PROXY_CONFIGMAP: (&str, &str, &str) = ("kube-system", "kube-proxy", "config.conf");

/// The units whose work keelson takes over.
pub const KUBELET_UNIT: &str = "kubelet.service";
/// kube-proxy as a unit (rare on kubeadm nodes, where it is a DaemonSet).
pub const KUBE_PROXY_UNIT: &str = "kube-proxy.service";
/// keelson's unit.
pub const KEELSON_UNIT: &str = "keelson.service";

/// Files `packaging/install.sh` writes with its default prefix.
pub const KEELSON_BINARY: &str = "/usr/local/bin/keelson";
/// keelson's unit file.
pub const KEELSON_UNIT_FILE: &str = "/etc/systemd/system/keelson.service";
/// keelson's configuration, written by the migration.
pub const KEELSON_CONFIG: &str = "/etc/keelson/config.yaml";
/// The proxy role's kubeconfig (`--proxy-kubeconfig` is installed there).
pub const KEELSON_PROXY_KUBECONFIG: &str = "/etc/keelson/proxy.kubeconfig";
/// The shipped default configuration beside the binary's prefix.
pub const KEELSON_SHARED_CONFIG: &str = "/usr/local/share/keelson/config.yaml";
/// The installed documentation.
pub const KEELSON_DOC: &str = "/usr/local/share/doc/keelson/install.md";

/// keelson's root dir, where the backup lives.
pub const KEELSON_ROOT_DIR: &str = "/var/lib/keelson";
/// The migration's backup: a manifest and the original files.
pub const BACKUP_DIR: &str = "/var/lib/keelson/migrate/backup";

/// The node label that keeps kube-proxy's DaemonSet off a node whose
/// Services keelson serves (docs/install.md). The value says which keelson:
/// `true` is the keelson-proxy DaemonSet's, `node-agent` is keelson.service.
pub const PROXY_LABEL: &str = "keelson.dev/proxy";
/// The label's value set by the migration.
pub const PROXY_LABEL_VALUE: &str = "node-agent";

/// kubelet's files the migration reads and keeps a copy of.
pub const KUBELET_FILES: &[&str] = &[
    KUBELET_CONFIG,
    KUBEADM_FLAGS,
    KUBELET_DEFAULTS,
    KUBELET_KUBECONFIG,
    KUBELET_CLIENT_CURRENT,
    // Written by keelson too with kubelet's names and formats (its root dir
    // is kubelet's): kept so a rollback gives kubelet its own copies back.
    "/var/lib/kubelet/pki/kubelet.crt",
    "/var/lib/kubelet/pki/kubelet.key",
    "/var/lib/kubelet/allocated_pods_state",
    "/var/lib/kubelet/actuated_pods_state",
];

/// Files `--apply` writes (itself or through install.sh); their previous
/// content (or absence) is in the backup.
pub const KEELSON_FILES: &[&str] = &[
    KEELSON_CONFIG,
    KEELSON_PROXY_KUBECONFIG,
    KEELSON_UNIT_FILE,
    KEELSON_BINARY,
    KEELSON_SHARED_CONFIG,
    KEELSON_DOC,
];

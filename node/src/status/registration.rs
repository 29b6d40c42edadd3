//! The Node keelson registers, and how it adopts one that already exists,
//! as kubelet's `initialNode` and `tryRegisterWithAPIServer` do:
//! - a new Node gets the default labels (`kubernetes.io/hostname`,
//!   `kubernetes.io/os`, `kubernetes.io/arch` and their `beta.` twins), the
//!   configured node labels, `registerWithTaints` (and, with an external
//!   cloud provider, the `node.cloudprovider.kubernetes.io/uninitialized`
//!   taint its cloud controller manager removes), `spec.providerID`, the
//!   controller-managed attach/detach annotation, and a full status;
//! - an existing Node is adopted: only the default labels, that
//!   annotation and the huge page resources are reconciled; everything
//!   else (other labels, taints, spec.podCIDR, conditions of other writers)
//!   stays as it is.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::capacity::is_hugepage_resource;
use super::format::parse;

/// `kubernetes.io/hostname`.
pub const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";
/// `kubernetes.io/os`.
pub const LABEL_OS: &str = "kubernetes.io/os";
/// `kubernetes.io/arch`.
pub const LABEL_ARCH: &str = "kubernetes.io/arch";
/// `beta.kubernetes.io/os` (still set by kubelet).
pub const LABEL_OS_BETA: &str = "beta.kubernetes.io/os";
/// `beta.kubernetes.io/arch` (still set by kubelet).
pub const LABEL_ARCH_BETA: &str = "beta.kubernetes.io/arch";
/// The taint a Node is registered with when an external cloud controller
/// manager has to initialize it (cloud-provider's
/// `TaintExternalCloudProvider`); the manager removes it.
pub const TAINT_EXTERNAL_CLOUD_PROVIDER: &str = "node.cloudprovider.kubernetes.io/uninitialized";
/// Annotation telling the attach/detach controller it manages this node's volumes.
pub const CONTROLLER_MANAGED_ATTACH: &str =
    "volumes.kubernetes.io/controller-managed-attach-detach";

/// The label keys kubelet reconciles on an existing Node.
pub const DEFAULT_LABELS: [&str; 12] = [
    LABEL_HOSTNAME,
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "node.kubernetes.io/instance-type",
    "beta.kubernetes.io/instance-type",
    LABEL_OS,
    LABEL_ARCH,
    "node.kubernetes.io/windows-build",
    LABEL_OS_BETA,
    LABEL_ARCH_BETA,
];

/// What registration needs from the configuration.
#[derive(Debug, Clone, Default)]
pub struct RegistrationConfig {
    /// Node name.
    pub node_name: String,
    /// Host name (the `kubernetes.io/hostname` label).
    pub hostname: String,
    /// `nodeLabels`.
    pub node_labels: BTreeMap<String, String>,
    /// `registerWithTaints`.
    pub register_with_taints: Vec<Taint>,
    /// `providerID`.
    pub provider_id: String,
    /// `cloudProvider: external`.
    pub external_cloud_provider: bool,
}

/// kubelet's `initialNode`, before the status setters run.
pub fn initial_node(cfg: &RegistrationConfig) -> Node {
    let os = std::env::consts::OS.to_string();
    let arch = keelson_common::version::go_arch().to_string();
    let mut labels: BTreeMap<String, String> = [
        (LABEL_HOSTNAME, cfg.hostname.clone()),
        (LABEL_OS, os.clone()),
        (LABEL_ARCH, arch.clone()),
        (LABEL_OS_BETA, os),
        (LABEL_ARCH_BETA, arch),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    for (k, v) in &cfg.node_labels {
        if let Some(old) = labels.get(k) {
            tracing::info!(label = %k, value = %v, default = %old, "the node label will overwrite default setting");
        }
        labels.insert(k.clone(), v.clone());
    }
    let annotations: BTreeMap<String, String> =
        [(CONTROLLER_MANAGED_ATTACH.to_string(), "true".to_string())].into();
    // pkg/kubelet/kubelet_node_status.go (initialNode): registerWithTaints,
    // then the external cloud provider's taint.
    let mut taints = cfg.register_with_taints.clone();
    if cfg.external_cloud_provider {
        taints.push(Taint {
            key: TAINT_EXTERNAL_CLOUD_PROVIDER.to_string(),
            value: Some("true".to_string()),
            effect: "NoSchedule".to_string(),
            time_added: None,
        });
    }
    Node {
        metadata: ObjectMeta {
            name: Some(cfg.node_name.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            taints: if taints.is_empty() {
                None
            } else {
                Some(taints)
            },
            provider_id: if cfg.provider_id.is_empty() {
                None
            } else {
                Some(cfg.provider_id.clone())
            },
            ..NodeSpec::default()
        }),
        status: Some(NodeStatus::default()),
    }
}

/// kubelet's `reconcileCMADAnnotationWithExistingNode`.
fn reconcile_attach_annotation(existing: &mut Node) -> bool {
    let ann = existing
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new);
    if ann.get(CONTROLLER_MANAGED_ATTACH).map(String::as_str) == Some("true") {
        return false;
    }
    ann.insert(CONTROLLER_MANAGED_ATTACH.to_string(), "true".to_string());
    true
}

/// kubelet's `updateDefaultLabels`.
fn reconcile_default_labels(initial: &Node, existing: &mut Node) -> bool {
    let empty = BTreeMap::new();
    let want = initial.metadata.labels.as_ref().unwrap_or(&empty);
    let labels = existing.metadata.labels.get_or_insert_with(BTreeMap::new);
    let mut changed = false;
    for key in DEFAULT_LABELS {
        let Some(value) = want.get(key) else { continue };
        if labels.get(key) != Some(value) {
            labels.insert(key.to_string(), value.clone());
            changed = true;
        }
        if labels.get(key).is_some_and(|v| v.is_empty()) {
            labels.remove(key);
        }
    }
    changed
}

/// kubelet's `updateDefaultResources`: capacity/allocatable maps exist.
fn ensure_resource_maps(initial: &Node, existing: &mut Node) -> bool {
    let mut changed = false;
    let init = initial.status.clone().unwrap_or_default();
    let status = existing.status.get_or_insert_with(NodeStatus::default);
    if status.capacity.is_none() {
        if init.capacity.is_some() {
            changed = true;
        }
        status.capacity = Some(init.capacity.unwrap_or_default());
    }
    if status.allocatable.is_none() {
        if init.allocatable.is_some() {
            changed = true;
        }
        status.allocatable = Some(init.allocatable.unwrap_or_default());
    }
    changed
}

/// kubelet's `reconcileHugePageResource`: huge page sizes of this machine
/// added or updated, sizes it no longer has removed.
fn reconcile_hugepages(initial: &Node, existing: &mut Node) -> bool {
    let mut changed = ensure_resource_maps(initial, existing);
    let init = initial.status.clone().unwrap_or_default();
    let init_cap = init.capacity.unwrap_or_default();
    let init_alloc = init.allocatable.unwrap_or_default();
    let status = existing.status.get_or_insert_with(NodeStatus::default);
    let cap = status.capacity.get_or_insert_with(BTreeMap::new);
    let alloc = status.allocatable.get_or_insert_with(BTreeMap::new);
    let same =
        |a: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
         b: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
            match (a.and_then(parse), b.and_then(parse)) {
                (Some(x), Some(y)) => x == y,
                _ => a == b,
            }
        };
    for (name, value) in init_cap.iter().filter(|(k, _)| is_hugepage_resource(k)) {
        let supported = cap.contains_key(name);
        if !supported || !same(cap.get(name), Some(value)) {
            cap.insert(name.clone(), value.clone());
            changed = true;
        }
        let want_alloc = init_alloc.get(name);
        if !supported || !same(alloc.get(name), want_alloc) {
            if let Some(a) = want_alloc {
                alloc.insert(name.clone(), a.clone());
            }
            changed = true;
        }
    }
    let stale: Vec<String> = cap
        .keys()
        .filter(|k| is_hugepage_resource(k) && !init_cap.contains_key(*k))
        .cloned()
        .collect();
    for name in stale {
        tracing::info!(resource = %name, "removing huge page resource which is no longer supported");
        cap.remove(&name);
        alloc.remove(&name);
        changed = true;
    }
    changed
}

/// Reconciles an existing Node with the one keelson would register; true
/// when `existing` was changed and must be written back.
pub fn reconcile_existing(initial: &Node, existing: &mut Node) -> bool {
    let mut changed = reconcile_attach_annotation(existing);
    changed |= reconcile_default_labels(initial, existing);
    changed |= reconcile_hugepages(initial, existing);
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn cfg() -> RegistrationConfig {
        RegistrationConfig {
            node_name: "n1".into(),
            hostname: "n1".into(),
            node_labels: [
                ("node-role.kubernetes.io/worker".to_string(), String::new()),
                ("kubernetes.io/hostname".to_string(), "custom".to_string()),
            ]
            .into(),
            register_with_taints: vec![Taint {
                key: "dedicated".into(),
                value: Some("gpu".into()),
                effect: "NoSchedule".into(),
                time_added: None,
            }],
            provider_id: "test://n1".into(),
            external_cloud_provider: false,
        }
    }

    #[test]
    fn an_external_cloud_provider_adds_its_taint_after_register_with_taints() {
        let n = initial_node(&RegistrationConfig {
            external_cloud_provider: true,
            ..cfg()
        });
        let taints = n.spec.and_then(|s| s.taints).unwrap_or_default();
        let keys: Vec<_> = taints.iter().map(|t| t.key.as_str()).collect();
        assert_eq!(keys, ["dedicated", TAINT_EXTERNAL_CLOUD_PROVIDER]);
        assert_eq!(taints[1].value.as_deref(), Some("true"));
        assert_eq!(taints[1].effect, "NoSchedule");
        // Alone, too.
        let n = initial_node(&RegistrationConfig {
            external_cloud_provider: true,
            register_with_taints: Vec::new(),
            ..cfg()
        });
        assert_eq!(n.spec.and_then(|s| s.taints).map(|t| t.len()), Some(1));
    }

    #[test]
    fn initial_node_has_defaults_labels_taints() {
        let n = initial_node(&cfg());
        let labels = n.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels[LABEL_HOSTNAME], "custom");
        assert_eq!(labels[LABEL_OS], "linux");
        assert_eq!(labels[LABEL_OS_BETA], "linux");
        assert_eq!(labels[LABEL_ARCH], keelson_common::version::go_arch());
        assert_eq!(labels["node-role.kubernetes.io/worker"], "");
        let spec = n.spec.unwrap_or_default();
        assert_eq!(spec.taints.map(|t| t.len()), Some(1));
        assert_eq!(spec.provider_id.as_deref(), Some("test://n1"));
        assert_eq!(
            n.metadata.annotations.unwrap_or_default()[CONTROLLER_MANAGED_ATTACH],
            "true"
        );
    }

    #[test]
    fn adoption_touches_only_default_labels_and_hugepages() {
        let mut initial = initial_node(&RegistrationConfig {
            node_labels: BTreeMap::new(),
            ..cfg()
        });
        initial.status = Some(NodeStatus {
            capacity: Some([("hugepages-2Mi".to_string(), Quantity("0".into()))].into()),
            allocatable: Some([("hugepages-2Mi".to_string(), Quantity("0".into()))].into()),
            ..Default::default()
        });
        let mut existing = Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                labels: Some(
                    [
                        ("kubernetes.io/hostname".to_string(), "old".to_string()),
                        (
                            "node.kubernetes.io/exclude-from-external-load-balancers".to_string(),
                            "true".to_string(),
                        ),
                    ]
                    .into(),
                ),
                annotations: Some(
                    [(CONTROLLER_MANAGED_ATTACH.to_string(), "true".to_string())].into(),
                ),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                pod_cidr: Some("10.244.1.0/24".into()),
                taints: Some(vec![]),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                capacity: Some(
                    [
                        ("hugepages-1Gi".to_string(), Quantity("0".into())),
                        ("example.com/dongle".to_string(), Quantity("2".into())),
                    ]
                    .into(),
                ),
                allocatable: Some([("hugepages-1Gi".to_string(), Quantity("0".into()))].into()),
                ..Default::default()
            }),
        };
        assert!(reconcile_existing(&initial, &mut existing));
        let labels = existing.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels[LABEL_HOSTNAME], "n1");
        assert_eq!(labels[LABEL_OS], "linux");
        assert_eq!(
            labels["node.kubernetes.io/exclude-from-external-load-balancers"],
            "true"
        );
        let spec = existing.spec.clone().unwrap_or_default();
        assert_eq!(spec.pod_cidr.as_deref(), Some("10.244.1.0/24"));
        assert_eq!(spec.taints, Some(vec![]));
        let cap = existing
            .status
            .clone()
            .and_then(|s| s.capacity)
            .unwrap_or_default();
        assert!(cap.contains_key("hugepages-2Mi"));
        assert!(!cap.contains_key("hugepages-1Gi"));
        assert!(cap.contains_key("example.com/dongle"));
        // A second pass has nothing to do.
        assert!(!reconcile_existing(&initial, &mut existing));
    }
}

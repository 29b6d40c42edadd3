//! The resources this server serves: their group/version, plural, Kind,
//! scope, subresources, short names and which fields can be selected.

/// Verbs of a normal, fully served resource (discovery order as upstream).
pub const ALL_VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// Static description of one served resource.
#[derive(Debug)]
pub struct ResourceInfo {
    /// API group ("" for core).
    pub group: &'static str,
    /// Version.
    pub version: &'static str,
    /// Plural resource name (URL segment).
    pub plural: &'static str,
    /// Singular name.
    pub singular: &'static str,
    /// Kind.
    pub kind: &'static str,
    /// Namespaced or cluster scoped.
    pub namespaced: bool,
    /// kubectl short names.
    pub short_names: &'static [&'static str],
    /// Categories (`all`).
    pub categories: &'static [&'static str],
    /// Subresources served (`status`, `binding`, `eviction`, `token`, `finalize`).
    pub subresources: &'static [&'static str],
    /// Storage key: two resources that are views of one stored object set
    /// (core/v1 events and events.k8s.io/v1 events) share it.
    pub storage: &'static str,
    /// Field selector labels beyond `metadata.name`/`metadata.namespace`.
    pub fields: &'static [&'static str],
    /// Whether `metadata.generation` is maintained (bumped on spec changes).
    pub tracks_generation: bool,
    /// Whether an immediate DELETE answers with the object (as upstream's
    /// `ReturnDeletedObject`) rather than a Success `Status`.
    pub returns_deleted_object: bool,
}

impl ResourceInfo {
    /// `apiVersion` string of objects of this resource.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Whether the resource has a `status` subresource.
    pub fn has_status(&self) -> bool {
        self.subresources.contains(&"status")
    }

    /// Verbs allowed on a subresource, as discovery lists them.
    pub fn subresource_verbs(sub: &str) -> &'static [&'static str] {
        match sub {
            "status" | "resize" | "approval" | "ephemeralcontainers" => &["get", "patch", "update"],
            "finalize" => &["update"],
            _ => &["create"],
        }
    }

    /// Kind served by a subresource.
    pub fn subresource_kind(&self, sub: &str) -> (&'static str, &'static str, &'static str) {
        // (group, version, kind)
        match sub {
            "binding" => ("", "v1", "Binding"),
            "eviction" => ("policy", "v1", "Eviction"),
            "token" => ("authentication.k8s.io", "v1", "TokenRequest"),
            _ => (self.group, self.version, self.kind),
        }
    }

    /// Whether `label` is a field selector this resource supports.
    pub fn supports_field(&self, label: &str) -> bool {
        label == "metadata.name"
            || (self.namespaced && label == "metadata.namespace")
            || self.fields.contains(&label)
    }
}

const POD_FIELDS: &[&str] = &[
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
];

const EVENT_FIELDS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

/// Field labels accepted on events.k8s.io/v1 events, in that group's names;
/// they are translated to the core names by [`events_field_to_core`].
const EVENTS_V1_FIELDS: &[&str] = &[
    "regarding.kind",
    "regarding.namespace",
    "regarding.name",
    "regarding.uid",
    "regarding.apiVersion",
    "regarding.resourceVersion",
    "regarding.fieldPath",
    "reason",
    "reportingController",
    "deprecatedSource",
    "type",
];

/// Translates an events.k8s.io/v1 field label to the stored (core) label.
pub fn events_field_to_core(label: &str) -> String {
    if let Some(rest) = label.strip_prefix("regarding.") {
        return format!("involvedObject.{rest}");
    }
    match label {
        "reportingController" => "reportingComponent".into(),
        "deprecatedSource" => "source".into(),
        other => other.into(),
    }
}

/// Every resource served.
pub static RESOURCES: &[ResourceInfo] = &[
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        namespaced: false,
        short_names: &["ns"],
        categories: &[],
        subresources: &["status", "finalize"],
        storage: "namespaces",
        fields: &["status.phase"],
        tracks_generation: false,
        returns_deleted_object: true,
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "nodes",
        singular: "node",
        kind: "Node",
        namespaced: false,
        short_names: &["no"],
        categories: &[],
        subresources: &["status"],
        storage: "nodes",
        fields: &["spec.unschedulable"],
        tracks_generation: false,
        returns_deleted_object: false,
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "pods",
        singular: "pod",
        kind: "Pod",
        namespaced: true,
        short_names: &["po"],
        categories: &["all"],
        subresources: &[
            "status",
            "binding",
            "eviction",
            "resize",
            "ephemeralcontainers",
        ],
        storage: "pods",
        fields: POD_FIELDS,
        tracks_generation: true,
        returns_deleted_object: true,
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "services",
        singular: "service",
        kind: "Service",
        namespaced: true,
        short_names: &["svc"],
        categories: &["all"],
        subresources: &["status"],
        storage: "services",
        fields: &["spec.clusterIP", "spec.type"],
        tracks_generation: false,
        returns_deleted_object: true,
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "endpoints",
        singular: "endpoints",
        kind: "Endpoints",
        namespaced: true,
        short_names: &["ep"],
        categories: &[],
        subresources: &[],
        storage: "endpoints",
        fields: &[],
        tracks_generation: false,
        returns_deleted_object: false,
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "configmaps",
        singular: "configmap",
        kind: "ConfigMap",
        namespaced: true,
        short_names: &["cm"],
        categories: &[],
        subresources: &[],
        storage: "configmaps",
        fields: &[],
        tracks_generation: false,
        returns_deleted_object: false,
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "secrets",
        singular: "secret",
        kind: "Secret",
        namespaced: true,
        short_names: &[],
        categories: &[],
        subresources: &[],
        storage: "secrets",
        fields: &["type"],
        tracks_generation: false,
        returns_deleted_object: false,
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "serviceaccounts",
        singular: "serviceaccount",
        kind: "ServiceAccount",
        namespaced: true,
        short_names: &["sa"],
        categories: &[],
        subresources: &["token"],
        storage: "serviceaccounts",
        fields: &[],
        tracks_generation: false,
        returns_deleted_object: false,
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        short_names: &["ev"],
        categories: &[],
        subresources: &[],
        storage: "events",
        fields: EVENT_FIELDS,
        tracks_generation: false,
        returns_deleted_object: false,
    },
    ResourceInfo {
        group: "discovery.k8s.io",
        version: "v1",
        plural: "endpointslices",
        singular: "endpointslice",
        kind: "EndpointSlice",
        namespaced: true,
        short_names: &[],
        categories: &[],
        subresources: &[],
        storage: "endpointslices",
        fields: &[],
        tracks_generation: false,
        returns_deleted_object: false,
    },
    ResourceInfo {
        group: "events.k8s.io",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        short_names: &["ev"],
        categories: &[],
        subresources: &[],
        storage: "events",
        fields: EVENTS_V1_FIELDS,
        tracks_generation: false,
        returns_deleted_object: false,
    },
    ResourceInfo {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        singular: "lease",
        kind: "Lease",
        namespaced: true,
        short_names: &[],
        categories: &[],
        subresources: &[],
        storage: "leases",
        fields: &[],
        tracks_generation: false,
        returns_deleted_object: false,
    },
    // kube-proxy v1.36 watches ServiceCIDRs (MultiCIDRServiceAllocator,
    // GA since v1.33); kube-apiserver creates the default one, `kubernetes`.
    ResourceInfo {
        group: "networking.k8s.io",
        version: "v1",
        plural: "servicecidrs",
        singular: "servicecidr",
        kind: "ServiceCIDR",
        namespaced: false,
        short_names: &[],
        categories: &[],
        subresources: &["status"],
        storage: "servicecidrs",
        fields: &[],
        tracks_generation: false,
        returns_deleted_object: false,
    },
    // Read by kubelet's RuntimeClass manager and the RuntimeClass
    // admission plugin (overhead, scheduling, missing class refused).
    ResourceInfo {
        group: "node.k8s.io",
        version: "v1",
        plural: "runtimeclasses",
        singular: "runtimeclass",
        kind: "RuntimeClass",
        namespaced: false,
        short_names: &[],
        categories: &[],
        subresources: &[],
        storage: "runtimeclasses",
        fields: &[],
        tracks_generation: false,
        returns_deleted_object: false,
    },
    // Written by kubelet's CSI node info manager (the CSINode, created at
    // start) and read by its CSI volume plugin (the CSIDriver).
    ResourceInfo {
        group: "storage.k8s.io",
        version: "v1",
        plural: "csinodes",
        singular: "csinode",
        kind: "CSINode",
        namespaced: false,
        short_names: &[],
        categories: &[],
        subresources: &[],
        storage: "csinodes",
        fields: &[],
        tracks_generation: false,
        returns_deleted_object: false,
    },
    ResourceInfo {
        group: "storage.k8s.io",
        version: "v1",
        plural: "csidrivers",
        singular: "csidriver",
        kind: "CSIDriver",
        namespaced: false,
        short_names: &[],
        categories: &[],
        subresources: &[],
        storage: "csidrivers",
        fields: &[],
        tracks_generation: false,
        returns_deleted_object: false,
    },
    ResourceInfo {
        group: "certificates.k8s.io",
        version: "v1",
        plural: "certificatesigningrequests",
        singular: "certificatesigningrequest",
        kind: "CertificateSigningRequest",
        namespaced: false,
        short_names: &["csr"],
        categories: &[],
        subresources: &["status", "approval"],
        storage: "certificatesigningrequests",
        fields: &["spec.signerName"],
        tracks_generation: false,
        returns_deleted_object: false,
    },
    // Stored only (no controller, no authorization): served so that
    // keelson's packaging manifests (DaemonSet, RBAC) can be applied with
    // kubectl and validated against the upstream types.
    ResourceInfo {
        group: "apps",
        version: "v1",
        plural: "daemonsets",
        singular: "daemonset",
        kind: "DaemonSet",
        namespaced: true,
        short_names: &["ds"],
        categories: &["all"],
        subresources: &["status"],
        storage: "daemonsets",
        fields: &[],
        tracks_generation: true,
        returns_deleted_object: false,
    },
    ResourceInfo {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "clusterroles",
        singular: "clusterrole",
        kind: "ClusterRole",
        namespaced: false,
        short_names: &[],
        categories: &[],
        subresources: &[],
        storage: "clusterroles",
        fields: &[],
        tracks_generation: false,
        returns_deleted_object: false,
    },
    ResourceInfo {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "clusterrolebindings",
        singular: "clusterrolebinding",
        kind: "ClusterRoleBinding",
        namespaced: false,
        short_names: &[],
        categories: &[],
        subresources: &[],
        storage: "clusterrolebindings",
        fields: &[],
        tracks_generation: false,
        returns_deleted_object: false,
    },
];

/// Looks up a resource by group, version and plural.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static ResourceInfo> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The resource whose storage and representation is canonical for `storage`.
pub fn canonical(storage: &str) -> Option<&'static ResourceInfo> {
    RESOURCES.iter().find(|r| r.storage == storage)
}

/// The API groups (other than core) with their versions, discovery order.
pub fn groups() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&'static str, &'static str)> = Vec::new();
    for r in RESOURCES {
        if !r.group.is_empty() && !out.iter().any(|(g, _)| *g == r.group) {
            out.push((r.group, r.version));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_and_views() {
        let ev = find("events.k8s.io", "v1", "events").expect("events.k8s.io served");
        assert_eq!(ev.storage, "events");
        assert_eq!(canonical("events").map(|r| r.group), Some(""));
        assert!(find("", "v1", "pods").is_some_and(|p| p.supports_field("spec.nodeName")));
        assert!(!find("", "v1", "nodes").is_some_and(|p| p.supports_field("metadata.namespace")));
        assert_eq!(
            events_field_to_core("regarding.name"),
            "involvedObject.name"
        );
    }
}

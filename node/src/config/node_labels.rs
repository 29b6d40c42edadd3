//! `nodeLabels` (kubelet `--node-labels`) checked as kubelet checks them at
//! start (`cmd/kubelet/app/options/options.go` `ValidateKubeletFlags`):
//! keys are qualified names, values label values, and a key in the
//! `kubernetes.io`/`k8s.io` namespaces must be one the NodeRestriction
//! admission plugin lets a node set on itself
//! (`staging/src/k8s.io/kubelet/pkg/apis/well_known_labels.go`). Refusing at
//! start beats a registration retried forever against a 403.

use std::collections::BTreeMap;

use super::FieldError;

/// Labels a kubelet may set on its own Node.
const KUBELET_LABELS: &[&str] = &[
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/instance-type",
    "beta.kubernetes.io/os",
    "failure-domain.beta.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "kubernetes.io/arch",
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
];

/// Label namespaces (and their subdomains) a kubelet may use.
const KUBELET_LABEL_NAMESPACES: &[&str] = &["kubelet.kubernetes.io", "node.kubernetes.io"];

fn namespace(key: &str) -> &str {
    key.split_once('/').map(|(ns, _)| ns).unwrap_or("")
}

fn is_kubernetes_label(key: &str) -> bool {
    let ns = namespace(key);
    ns == "kubernetes.io"
        || ns.ends_with(".kubernetes.io")
        || ns == "k8s.io"
        || ns.ends_with(".k8s.io")
}

/// True when a node may set this label on itself.
pub fn is_kubelet_label(key: &str) -> bool {
    if KUBELET_LABELS.contains(&key) {
        return true;
    }
    let ns = namespace(key);
    KUBELET_LABEL_NAMESPACES
        .iter()
        .any(|allowed| ns == *allowed || ns.ends_with(&format!(".{allowed}")))
}

fn is_name_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')
}

/// A label value (or the name part of a key): ≤ 63 characters, empty or
/// alphanumeric at both ends with `-_.` inside.
fn check_name(s: &str, allow_empty: bool) -> Option<String> {
    if s.is_empty() {
        return (!allow_empty).then(|| "name part must be non-empty".to_string());
    }
    if s.len() > 63 {
        return Some("must be no more than 63 characters".to_string());
    }
    let b = s.as_bytes();
    let ends_ok = b[0].is_ascii_alphanumeric() && b[b.len() - 1].is_ascii_alphanumeric();
    if !ends_ok || !b.iter().all(|c| is_name_char(*c)) {
        return Some(
            "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character".to_string(),
        );
    }
    None
}

fn check_key(key: &str) -> Option<String> {
    match key.split_once('/') {
        Some((prefix, name)) => {
            if !super::is_dns_subdomain(prefix) {
                return Some(format!(
                    "prefix {prefix:?} must be a lowercase RFC 1123 subdomain"
                ));
            }
            check_name(name, false)
        }
        None => check_name(key, false),
    }
}

/// Checks every label; the errors name `node.nodeLabels[<key>]`.
pub fn validate(labels: &BTreeMap<String, String>, errs: &mut Vec<FieldError>) {
    let mut unknown = Vec::new();
    for (k, v) in labels {
        let path = format!("node.nodeLabels[{k:?}]");
        if let Some(e) = check_key(k) {
            errs.push(FieldError::new(&path, format!("invalid label key: {e}")));
        }
        if let Some(e) = check_name(v, true) {
            errs.push(FieldError::new(
                &path,
                format!("invalid label value {v:?}: {e}"),
            ));
        }
        if is_kubernetes_label(k) && !is_kubelet_label(k) {
            unknown.push(k.clone());
        }
    }
    if !unknown.is_empty() {
        errs.push(FieldError::new(
            "node.nodeLabels",
            format!(
                "unknown 'kubernetes.io' or 'k8s.io' labels specified with --node-labels: {unknown:?}; --node-labels in the 'kubernetes.io' namespace must begin with an allowed prefix ({}) or be in the specifically allowed set ({}); the NodeRestriction admission plugin refuses the others",
                KUBELET_LABEL_NAMESPACES.join(", "),
                KUBELET_LABELS.join(", ")
            ),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(pairs: &[(&str, &str)]) -> Vec<FieldError> {
        let labels = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut errs = Vec::new();
        validate(&labels, &mut errs);
        errs
    }

    #[test]
    fn allowed_labels_pass() {
        assert!(
            check(&[
                ("topology.kubernetes.io/zone", "a"),
                ("node.kubernetes.io/instance-type", "m5"),
                ("x.kubelet.kubernetes.io/role", "edge"),
                ("example.com/team", ""),
                ("plain", "v1.2_3"),
            ])
            .is_empty()
        );
    }

    #[test]
    fn restricted_and_malformed_labels_are_refused() {
        let errs = check(&[
            ("node-role.kubernetes.io/worker", ""),
            ("k8s.io/thing", "x"),
            ("bad key", "x"),
            ("ok", "-bad"),
        ]);
        let paths: Vec<_> = errs.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "node.nodeLabels[\"bad key\"]",
                "node.nodeLabels[\"ok\"]",
                "node.nodeLabels"
            ]
        );
        let last = &errs[2].reason;
        assert!(
            last.contains("[\"k8s.io/thing\", \"node-role.kubernetes.io/worker\"]"),
            "{last}"
        );
    }
}

//! Discovery documents: `/api`, `/apis`, `/api/v1`, `/apis/<g>`,
//! `/apis/<g>/<v>`, `/version`.

use serde_json::{Value, json};

use super::resources::{self, ALL_VERBS, RESOURCES, ResourceInfo};

/// The Kubernetes version this server reports.
pub const SERVER_MINOR: &str = "36";

/// `/version`.
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": SERVER_MINOR,
        "emulationMajor": "1",
        "emulationMinor": SERVER_MINOR,
        "gitVersion": format!("v1.{SERVER_MINOR}.0+keelson-testapi"),
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "none (keelson test API server, Rust)",
        "compiler": "rustc",
        "platform": format!("linux/{}", std::env::consts::ARCH),
    })
}

/// `/api`.
pub fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]
    })
}

fn group_doc(group: &str, version: &str) -> Value {
    let gv = json!({"groupVersion": format!("{group}/{version}"), "version": version});
    json!({"name": group, "versions": [gv.clone()], "preferredVersion": gv})
}

/// `/apis`.
pub fn group_list() -> Value {
    let groups: Vec<Value> = resources::groups()
        .iter()
        .map(|(g, v)| group_doc(g, v))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/<group>`, if served.
pub fn group(name: &str) -> Option<Value> {
    let (g, v) = resources::groups().into_iter().find(|(g, _)| *g == name)?;
    let mut doc = group_doc(g, v);
    doc["kind"] = json!("APIGroup");
    doc["apiVersion"] = json!("v1");
    Some(doc)
}

fn resource_entry(r: &ResourceInfo) -> Value {
    let mut e = json!({
        "name": r.plural,
        "singularName": r.singular,
        "namespaced": r.namespaced,
        "kind": r.kind,
        "verbs": ALL_VERBS,
    });
    if !r.short_names.is_empty() {
        e["shortNames"] = json!(r.short_names);
    }
    if !r.categories.is_empty() {
        e["categories"] = json!(r.categories);
    }
    e
}

/// `/api/v1` or `/apis/<g>/<v>`, if served.
pub fn resource_list(group: &str, version: &str) -> Option<Value> {
    let served: Vec<&ResourceInfo> = RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if served.is_empty() {
        return None;
    }
    let mut list = Vec::new();
    for r in served {
        list.push(resource_entry(r));
        for sub in r.subresources {
            let (g, v, kind) = r.subresource_kind(sub);
            let mut e = json!({
                "name": format!("{}/{sub}", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": kind,
                "verbs": ResourceInfo::subresource_verbs(sub),
            });
            if g != r.group || v != r.version {
                e["group"] = json!(g);
                e["version"] = json!(v);
            }
            list.push(e);
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": list}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents() {
        let core = resource_list("", "v1").expect("core");
        let names: Vec<&str> = core["resources"]
            .as_array()
            .map(|a| a.iter().filter_map(|r| r["name"].as_str()).collect())
            .unwrap_or_default();
        assert!(names.contains(&"pods/eviction"));
        assert!(names.contains(&"serviceaccounts/token"));
        assert!(group("discovery.k8s.io").is_some());
        assert!(group("batch").is_none());
        assert!(names.contains(&"pods/resize"));
        let mut groups: Vec<String> = group_list()["groups"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|g| g["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        groups.sort();
        assert_eq!(
            groups,
            [
                "apps",
                "certificates.k8s.io",
                "coordination.k8s.io",
                "discovery.k8s.io",
                "events.k8s.io",
                "networking.k8s.io",
                "node.k8s.io",
                "rbac.authorization.k8s.io",
                "storage.k8s.io"
            ]
        );
    }
}

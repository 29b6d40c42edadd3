//! A minimal OpenAPI v3 publication: `/openapi/v3` lists the group
//! versions, `/openapi/v3/<api|apis/g>/<v>` describes each resource path's
//! operations with their `x-kubernetes-group-version-kind` and query
//! parameters (notably `fieldValidation`, which tells kubectl to let the
//! server validate). Component schemas are not published (see README).

use serde_json::{Map, Value, json};

use super::resources::{RESOURCES, ResourceInfo};

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `/openapi/v3`: the index of group-version documents.
pub fn root() -> Value {
    let mut paths = Map::new();
    for r in RESOURCES {
        let p = gv_path(r.group, r.version);
        paths
            .entry(p.clone())
            .or_insert_with(|| json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash=0")}));
    }
    json!({"paths": paths})
}

fn query_param(name: &str) -> Value {
    json!({"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": true}})
}

fn operation(r: &ResourceInfo, action: &str, params: &[&str]) -> Value {
    let mut op = json!({
        "operationId": format!("{action}{}", r.kind),
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": {"group": r.group, "version": r.version, "kind": r.kind},
        "parameters": params.iter().map(|p| query_param(p)).collect::<Vec<_>>(),
        "responses": {"200": {"description": "OK"}},
    });
    if action == "patch" {
        op["requestBody"] = json!({"content": {
            "application/json-patch+json": {}, "application/merge-patch+json": {}, "application/apply-patch+yaml": {}
        }});
    }
    op
}

/// `/openapi/v3/<api/v1 | apis/g/v>`, if served.
pub fn group_version(path: &str) -> Option<Value> {
    let mut paths = Map::new();
    for r in RESOURCES
        .iter()
        .filter(|r| gv_path(r.group, r.version) == path)
    {
        let base = if r.namespaced {
            format!("/{path}/namespaces/{{namespace}}/{}", r.plural)
        } else {
            format!("/{path}/{}", r.plural)
        };
        let write = ["dryRun", "fieldManager", "fieldValidation", "pretty"];
        let list = [
            "allowWatchBookmarks",
            "continue",
            "fieldSelector",
            "labelSelector",
            "limit",
            "resourceVersion",
            "resourceVersionMatch",
            "sendInitialEvents",
            "timeoutSeconds",
            "watch",
        ];
        paths.insert(base.clone(), json!({
            "get": operation(r, "list", &list),
            "post": operation(r, "post", &write),
            "delete": operation(r, "deletecollection", &["gracePeriodSeconds", "labelSelector", "fieldSelector", "propagationPolicy", "dryRun"]),
        }));
        paths.insert(format!("{base}/{{name}}"), json!({
            "get": operation(r, "get", &["pretty"]),
            "put": operation(r, "put", &write),
            "patch": operation(r, "patch", &["dryRun", "fieldManager", "fieldValidation", "force", "pretty"]),
            "delete": operation(r, "delete", &["dryRun", "gracePeriodSeconds", "propagationPolicy"]),
        }));
        if r.has_status() {
            paths.insert(format!("{base}/{{name}}/status"), json!({
                "get": operation(r, "get", &["pretty"]),
                "put": operation(r, "put", &write),
                "patch": operation(r, "patch", &["dryRun", "fieldManager", "fieldValidation", "force", "pretty"]),
            }));
        }
    }
    if paths.is_empty() {
        return None;
    }
    let title = format!("Kubernetes keelson-testapi {path}");
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": title, "version": "unversioned"},
        "paths": paths,
        "components": {"schemas": {}}
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_operations_carry_gvk_and_field_validation() {
        assert!(root()["paths"]["apis/discovery.k8s.io/v1"].is_object());
        let core = group_version("api/v1").expect("core");
        let patch = &core["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"]["patch"];
        assert_eq!(patch["x-kubernetes-group-version-kind"]["kind"], "Pod");
        assert!(
            patch["parameters"]
                .as_array()
                .is_some_and(|p| p.iter().any(|p| p["name"] == "fieldValidation"))
        );
        assert!(group_version("apis/batch/v1").is_none());
    }
}

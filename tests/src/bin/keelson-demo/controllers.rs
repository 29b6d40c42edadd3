//! Stand-ins for the two control-plane controllers the demo needs and the
//! test API server does not run: kube-scheduler (binds each pending Pod to
//! the demo's only node) and kube-controller-manager's EndpointSlice
//! controller (one IPv4 EndpointSlice per selector Service, with upstream's
//! labels, owner reference, port resolution and ready/serving/terminating
//! conditions). Level-triggered: every change to a Pod, Service or
//! EndpointSlice reconciles everything again (the demo has a handful).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// `endpointslice.kubernetes.io/managed-by` of the slices upstream's controller writes.
const MANAGED_BY: &str = "endpointslice-controller.k8s.io";
const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Runs both stand-ins until `shutdown`.
pub async fn run(client: kube::Client, node: String, shutdown: CancellationToken) {
    let changed = Arc::new(Notify::new());
    let pods = reflect::<Pod>(client.clone(), changed.clone(), shutdown.clone());
    let services = reflect::<Service>(client.clone(), changed.clone(), shutdown.clone());
    let slices = reflect::<EndpointSlice>(client.clone(), changed.clone(), shutdown.clone());
    let mut created = Created::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = changed.notified() => {}
            // A failed write is retried even when nothing else changes.
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
        if let Err(e) = schedule(&client, &pods, &node).await {
            eprintln!("  [scheduler stand-in] {e}");
        }
        if let Err(e) = reconcile_slices(&client, &pods, &services, &slices, &mut created).await {
            eprintln!("  [endpointslice stand-in] {e}");
        }
    }
}

/// A reflector store of every `K`, kept by a task until `shutdown`.
fn reflect<K>(client: kube::Client, changed: Arc<Notify>, shutdown: CancellationToken) -> Store<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, writer) = reflector::store::<K>();
    let api: Api<K> = Api::all(client);
    tokio::spawn(async move {
        let stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .reflect(writer);
        futures::pin_mut!(stream);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                ev = stream.next() => match ev {
                    Some(Ok(_)) => changed.notify_one(),
                    Some(Err(e)) => eprintln!("  [stand-in controllers] watch: {e}"),
                    None => return,
                }
            }
        }
    });
    reader
}

/// Binds every unscheduled, live Pod to `node` (pods/binding, as kube-scheduler).
async fn schedule(client: &kube::Client, pods: &Store<Pod>, node: &str) -> Result<(), kube::Error> {
    for pod in pods.state() {
        let bound = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| !n.is_empty());
        if bound || pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let ns = pod.namespace().unwrap_or_default();
        let binding = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod.name_any(), "namespace": ns},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        });
        Api::<Pod>::namespaced(client.clone(), &ns)
            .create_subresource::<_, serde_json::Value>(
                "binding",
                &pod.name_any(),
                &PostParams::default(),
                &binding,
            )
            .await?;
        println!(
            "  [scheduler stand-in] bound pod {ns}/{} to node {node}",
            pod.name_any()
        );
    }
    Ok(())
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn selects(svc: &Service, pod: &Pod) -> bool {
    let Some(sel) = svc.spec.as_ref().and_then(|s| s.selector.as_ref()) else {
        return false;
    };
    !sel.is_empty() && sel.iter().all(|(k, v)| pod.labels().get(k) == Some(v))
}

/// The container port a Service port's targetPort names in `pod`.
fn target_port(pod: &Pod, target: Option<&IntOrString>, port: i32) -> Option<i32> {
    match target {
        None => Some(port),
        Some(IntOrString::Int(p)) => Some(*p),
        Some(IntOrString::String(name)) => pod
            .spec
            .as_ref()?
            .containers
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .map(|p| p.container_port),
    }
}

/// What upstream's controller would write for `svc` (name and
/// resourceVersion aside).
fn desired(svc: &Service, pods: &[Arc<Pod>]) -> (Vec<Endpoint>, Vec<EndpointPort>) {
    let spec = svc.spec.clone().unwrap_or_default();
    let publish = spec.publish_not_ready_addresses.unwrap_or(false);
    let mut endpoints = Vec::new();
    let mut ports: Option<Vec<EndpointPort>> = None;
    for pod in pods.iter().filter(|p| selects(svc, p)) {
        let status = pod.status.clone().unwrap_or_default();
        let Some(ip) = status
            .pod_ip
            .filter(|ip| !ip.is_empty() && !ip.contains(':'))
        else {
            continue;
        };
        if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
            continue;
        }
        let serving = pod_ready(pod);
        let terminating = pod.metadata.deletion_timestamp.is_some();
        endpoints.push(Endpoint {
            addresses: vec![ip],
            conditions: Some(EndpointConditions {
                ready: Some(publish || (serving && !terminating)),
                serving: Some(serving),
                terminating: Some(terminating),
            }),
            node_name: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            target_ref: Some(k8s_openapi::api::core::v1::ObjectReference {
                kind: Some("Pod".into()),
                namespace: pod.namespace(),
                name: Some(pod.name_any()),
                uid: pod.uid(),
                ..Default::default()
            }),
            ..Default::default()
        });
        if ports.is_none() {
            ports = Some(
                spec.ports
                    .iter()
                    .flatten()
                    .filter_map(|p| {
                        Some(EndpointPort {
                            name: Some(p.name.clone().unwrap_or_default()),
                            port: Some(target_port(pod, p.target_port.as_ref(), p.port)?),
                            protocol: p.protocol.clone(),
                            app_protocol: p.app_protocol.clone(),
                        })
                    })
                    .collect(),
            );
        }
    }
    endpoints.sort_by(|a, b| a.addresses.cmp(&b.addresses));
    (endpoints, ports.unwrap_or_default())
}

/// Slices created but not seen in the store yet, by (namespace, service):
/// until the watch delivers one, creating another would duplicate it.
type Created = std::collections::HashMap<(String, String), String>;

async fn reconcile_slices(
    client: &kube::Client,
    pods: &Store<Pod>,
    services: &Store<Service>,
    slices: &Store<EndpointSlice>,
    created: &mut Created,
) -> Result<(), kube::Error> {
    let pods = pods.state();
    let services = services.state();
    let ours: Vec<Arc<EndpointSlice>> = slices
        .state()
        .into_iter()
        .filter(|s| s.labels().get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY))
        .collect();
    let mut wanted: BTreeMap<(String, String), &Service> = BTreeMap::new();
    for svc in &services {
        if svc
            .spec
            .as_ref()
            .and_then(|s| s.selector.as_ref())
            .is_some_and(|s| !s.is_empty())
        {
            wanted.insert((svc.namespace().unwrap_or_default(), svc.name_any()), svc);
        }
    }
    // Slices of Services that are gone (the garbage collector's job upstream).
    for slice in &ours {
        let key = (
            slice.namespace().unwrap_or_default(),
            slice
                .labels()
                .get(SERVICE_NAME_LABEL)
                .cloned()
                .unwrap_or_default(),
        );
        if !wanted.contains_key(&key) {
            let deleted = Api::<EndpointSlice>::namespaced(client.clone(), &key.0)
                .delete(&slice.name_any(), &DeleteParams::default())
                .await;
            match deleted {
                // Already gone: the store has not seen the deletion yet.
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                other => {
                    other?;
                }
            }
        }
    }
    created.retain(|_, name| !ours.iter().any(|s| s.name_any() == *name));
    for ((ns, name), svc) in wanted {
        let (endpoints, ports) = desired(svc, &pods);
        let api = Api::<EndpointSlice>::namespaced(client.clone(), &ns);
        let mut mine: Vec<&Arc<EndpointSlice>> = ours
            .iter()
            .filter(|s| {
                s.namespace().as_deref() == Some(ns.as_str())
                    && s.labels().get(SERVICE_NAME_LABEL) == Some(&name)
            })
            .collect();
        mine.sort_by_key(|s| s.name_any());
        // One slice per Service here: extras (from a lost race) go.
        for extra in mine.iter().skip(1) {
            match api
                .delete(&extra.name_any(), &DeleteParams::default())
                .await
            {
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                other => {
                    other?;
                }
            }
        }
        if mine.is_empty() && created.contains_key(&(ns.clone(), name.clone())) {
            continue;
        }
        match mine.first() {
            Some(cur)
                if cur.endpoints.as_ref() == Some(&endpoints)
                    && cur.ports.as_ref() == Some(&ports) => {}
            Some(cur) => {
                let mut next = (***cur).clone();
                next.endpoints = Some(endpoints);
                next.ports = Some(ports);
                api.replace(&cur.name_any(), &PostParams::default(), &next)
                    .await?;
            }
            None => {
                let mut labels = BTreeMap::new();
                labels.insert(SERVICE_NAME_LABEL.to_string(), name.clone());
                labels.insert(MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string());
                let slice = EndpointSlice {
                    metadata: ObjectMeta {
                        generate_name: Some(format!("{name}-")),
                        namespace: Some(ns.clone()),
                        labels: Some(labels),
                        owner_references: Some(vec![OwnerReference {
                            api_version: "v1".into(),
                            kind: "Service".into(),
                            name: name.clone(),
                            uid: svc.uid().unwrap_or_default(),
                            controller: Some(true),
                            block_owner_deletion: Some(true),
                        }]),
                        ..Default::default()
                    },
                    address_type: "IPv4".into(),
                    endpoints: Some(endpoints),
                    ports: Some(ports),
                };
                let made = api.create(&PostParams::default(), &slice).await?;
                created.insert((ns.clone(), name.clone()), made.name_any());
            }
        }
    }
    Ok(())
}

//! Where the proxy role's memory goes, structure by structure, for N
//! Services × M endpoints: the list responses as kube-apiserver sends them
//! (JSON text, then parsed into the API types the watcher hands over), the
//! model (the change tracker's Services and EndpointSlices, then the
//! per-port states), the nftables backend's cold-sync plan, its netlink
//! batch and its record, and the eBPF map syncer's record.
//!
//! Each line is the heap in use after a step (bytes allocated and not
//! freed, counted by a wrapper around the system allocator), its change,
//! and the highest it went during the step:
//! `cargo run --release -p keelson-tests --bin proxy-memory -- 10000 10`
//! (nothing touches the kernel; no root needed). The process's resident
//! memory is this plus code, stacks and the allocator's free lists.

#![allow(unsafe_code)] // the counting allocator below, nothing else

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Instant;

use k8s_openapi::List;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use keelson::proxy::objects::{ProxyEndpointSlice, ProxyService};
use keelson_netplane::ebpf::{FakeMaps, Syncer, desired_of};
use keelson_netplane::model::{ChangeTracker, IpFamily, NodePortAddresses, NodeTopology};
use keelson_netplane::nftables::encode::encode_batch;
use keelson_netplane::nftables::layout::fixed_layout;
use keelson_netplane::nftables::objects::{Op, TableId};
use keelson_netplane::nftables::table::{FamilyTable, FullSyncInput, KernelTable};
use keelson_netplane::nftables::{LocalTraffic, NftablesConfig};
use kube::core::ObjectList;
use serde_json::{Value, json};

/// The system allocator, counting the bytes in use and their peak.
struct Counting;

static IN_USE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded unchanged to `System`, which upholds the
// `GlobalAlloc` contract; the counters are plain atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = IN_USE.fetch_add(layout.size() as isize, Ordering::Relaxed)
                + layout.size() as isize;
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        IN_USE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn in_use() -> i64 {
    IN_USE.load(Ordering::Relaxed) as i64
}

struct Report {
    last: i64,
}

impl Report {
    fn step(&mut self, what: &str) {
        let now = in_use();
        let peak = PEAK.swap(now as isize, Ordering::Relaxed) as i64;
        println!(
            "{:>9.1} MiB {:>+9.1} MiB {:>9.1} MiB  {what}",
            now as f64 / 1048576.0,
            (now - self.last) as f64 / 1048576.0,
            peak as f64 / 1048576.0
        );
        self.last = now;
    }
}

fn managed_fields(fields: Value) -> Value {
    json!([{
        "manager": "keelson-bench",
        "operation": "Update",
        "apiVersion": "v1",
        "time": "2026-12-01T10:00:00Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": fields
    }])
}

/// Service `i` as kube-apiserver returns it (metadata, managedFields,
/// defaulted spec).
fn service_json(i: u32) -> Value {
    let ip = Ipv4Addr::from(0x0a60_0000 + i);
    json!({
        "metadata": {
            "name": format!("svc-{i}"),
            "namespace": "bench",
            "uid": format!("5f0c6b8e-0000-4000-8000-{i:012}"),
            "resourceVersion": format!("{}", 100_000 + i),
            "creationTimestamp": "2026-12-01T10:00:00Z",
            "labels": {"app.kubernetes.io/managed-by": "keelson-bench"},
            "managedFields": managed_fields(json!({
                "f:metadata": {"f:labels": {".": {}, "f:app.kubernetes.io/managed-by": {}}},
                "f:spec": {
                    "f:internalTrafficPolicy": {},
                    "f:ports": {".": {}, "k:{\"port\":80,\"protocol\":\"TCP\"}": {
                        ".": {}, "f:port": {}, "f:protocol": {}, "f:targetPort": {}
                    }},
                    "f:sessionAffinity": {},
                    "f:type": {}
                }
            }))
        },
        "spec": {
            "ports": [{"protocol": "TCP", "port": 80, "targetPort": 8080}],
            "clusterIP": ip.to_string(),
            "clusterIPs": [ip.to_string()],
            "type": "ClusterIP",
            "sessionAffinity": "None",
            "ipFamilies": ["IPv4"],
            "ipFamilyPolicy": "SingleStack",
            "internalTrafficPolicy": "Cluster"
        },
        "status": {"loadBalancer": {}}
    })
}

/// Service `i`'s EndpointSlice with `m` endpoints, as kube-apiserver
/// returns it.
fn slice_json(i: u32, m: u32) -> Value {
    let endpoints: Vec<Value> = (0..m)
        .map(|e| {
            let ip = Ipv4Addr::from(0x0a80_0000 + i * m + e);
            json!({
                "addresses": [ip.to_string()],
                "conditions": {"ready": true, "serving": true, "terminating": false}
            })
        })
        .collect();
    json!({
        "metadata": {
            "name": format!("svc-{i}-x7k2p"),
            "namespace": "bench",
            "uid": format!("7a1d2c3e-0000-4000-8000-{i:012}"),
            "resourceVersion": format!("{}", 200_000 + i),
            "generation": 1,
            "creationTimestamp": "2026-12-01T10:00:00Z",
            "labels": {
                "kubernetes.io/service-name": format!("svc-{i}"),
                "endpointslice.kubernetes.io/managed-by": "keelson-bench.keelson.dev",
                "app.kubernetes.io/managed-by": "keelson-bench"
            },
            "annotations": {
                "endpoints.kubernetes.io/last-change-trigger-time": "2026-12-01T10:00:00.123456Z"
            },
            "managedFields": managed_fields(json!({
                "f:addressType": {},
                "f:endpoints": {},
                "f:metadata": {
                    "f:annotations": {".": {}, "f:endpoints.kubernetes.io/last-change-trigger-time": {}},
                    "f:labels": {".": {}, "f:app.kubernetes.io/managed-by": {},
                        "f:endpointslice.kubernetes.io/managed-by": {}, "f:kubernetes.io/service-name": {}}
                },
                "f:ports": {}
            }))
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "", "protocol": "TCP", "port": 8080}]
    })
}

fn list_json(kind: &str, api_version: &str, items: impl Iterator<Item = Value>) -> String {
    let items: Vec<Value> = items.collect();
    json!({
        "kind": kind,
        "apiVersion": api_version,
        "metadata": {"resourceVersion": "300000"},
        "items": items
    })
    .to_string()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let n: u32 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1000);
    let m: u32 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(10);
    let mut r = Report { last: in_use() };
    PEAK.store(in_use() as isize, Ordering::Relaxed);
    println!(
        "{n} Services x {m} endpoints: heap in use after each step, its change, its peak during the step"
    );

    let services_text = list_json("ServiceList", "v1", (0..n).map(service_json));
    let slices_text = list_json(
        "EndpointSliceList",
        "discovery.k8s.io/v1",
        (0..n).map(|i| slice_json(i, m)),
    );
    PEAK.store(in_use() as isize, Ordering::Relaxed);
    r.step(&format!(
        "API list responses as text ({:.1} + {:.1} MiB of JSON)",
        services_text.len() as f64 / 1048576.0,
        slices_text.len() as f64 / 1048576.0
    ));
    let full_services: List<Service> = serde_json::from_str(&services_text)?;
    let full_slices: List<EndpointSlice> = serde_json::from_str(&slices_text)?;
    r.step("whole API objects parsed (what an informer keeps: kube-proxy)");
    drop(full_services);
    drop(full_slices);
    r.step("whole API objects freed");
    let services: ObjectList<ProxyService> = serde_json::from_str(&services_text)?;
    let slices: ObjectList<ProxyEndpointSlice> = serde_json::from_str(&slices_text)?;
    r.step("trimmed API objects parsed (what keelson's watchers hand over)");
    drop(services_text);
    drop(slices_text);
    r.step("response texts freed");

    let mut tracker = ChangeTracker::new(
        [IpFamily::V4],
        NodeTopology {
            name: "node-a".into(),
            zone: None,
        },
    );
    tracker.replace_services(services.items.iter().map(ProxyService::to_api));
    tracker.replace_endpoint_slices(slices.items.iter().map(ProxyEndpointSlice::to_api));
    r.step("model: change tracker (Services, EndpointSlices)");
    drop(services);
    drop(slices);
    r.step("API objects freed");

    let t = Instant::now();
    let diff = tracker.diff();
    r.step(&format!(
        "model: per-port states of the first diff ({:.0} ms)",
        t.elapsed().as_secs_f64() * 1000.0
    ));
    let snapshot = tracker.snapshot(&diff);
    tracker.commit(&diff);
    drop(diff);
    r.step("model: committed (the tracker keeps the states)");

    let mut config = NftablesConfig::default();
    config
        .local_traffic
        .insert(IpFamily::V4, LocalTraffic::Cidr("10.128.0.0/9".parse()?));
    let fixed = fixed_layout(IpFamily::V4, &config, &NodePortAddresses::AllLocal);
    let id = TableId {
        family: IpFamily::V4,
        index: 0,
    };
    let desired = snapshot
        .services
        .iter()
        .map(|(k, s)| (k.clone(), s.clone()))
        .collect();
    let mut table = FamilyTable::new(id);
    let mut empty = |_: &str, _: Option<&[&[u8]]>| {
        Some(keelson_netplane::nftables::table::KernelElements::default())
    };
    let mut plan = table
        .plan_full(
            FullSyncInput {
                config: &config,
                table_comment: "c",
                fixed: &fixed,
                kernel: &KernelTable::default(),
                reset_base_chains: true,
            },
            desired,
            &mut empty,
        )
        .map_err(|e| e.to_string())?;
    let ops: Vec<Op> = std::mem::take(&mut plan.ops);
    r.step(&format!("nftables: cold-sync plan ({} ops)", ops.len()));
    let batch = encode_batch("keelson", &ops, 1);
    r.step(&format!(
        "nftables: netlink batch ({:.1} MiB, {} messages)",
        batch.bytes.len() as f64 / 1048576.0,
        batch.messages()
    ));
    drop(batch);
    drop(ops);
    table.commit(plan, Instant::now());
    r.step("nftables: plan and batch freed, record kept");

    let (mut syncer, _) = Syncer::adopt(FakeMaps::default()).map_err(|e| e.to_string())?;
    syncer
        .replace_all(desired_of(&snapshot))
        .map_err(|e| e.to_string())?;
    r.step("eBPF: map syncer record + the maps' content (in-memory stand-in)");
    let maps = syncer.maps().clone();
    let before = in_use();
    drop(maps);
    let maps_bytes = before - in_use();
    println!(
        "                         (of which the maps' content, kernel memory in a real run: ~{:.1} MiB)",
        maps_bytes as f64 / 1048576.0
    );
    drop(snapshot);
    r.step("snapshot freed: steady state (model + nftables record + eBPF record and maps)");
    let _keep = (&tracker, &table, &syncer);
    Ok(())
}

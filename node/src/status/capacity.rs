//! Capacity and allocatable, as kubelet's MachineInfo setter and container
//! manager compute them:
//! - capacity: `cpu` (logical CPUs), `memory` (`MemTotal`), `hugepages-<size>`
//!   (pool size × page size), `pods` (`maxPods`), `ephemeral-storage` (size
//!   of the filesystem holding the root dir); resources other writers
//!   advertise (extended resources) are kept;
//! - allocatable = capacity − systemReserved − kubeReserved − the hard
//!   eviction thresholds of `memory.available` and `nodefs.available`,
//!   never negative, and memory further reduced by the huge page pools.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use super::format::{api_quantity, parse};
use super::host::MachineInfo;
use crate::config::eviction::{Signal, Threshold, ThresholdValue};
use keelson_common::quantity::Quantity;

/// A resource list as the API holds it.
pub type ResourceList = BTreeMap<String, ApiQuantity>;

/// Resources set aside, parsed from `kubeReserved`/`systemReserved`.
pub type Reserved = BTreeMap<String, Quantity>;

/// `hugepages-<size>` for a page size in KiB (`hugepages-2Mi`, `hugepages-1Gi`).
pub fn hugepage_resource_name(page_size_kib: u64) -> String {
    let q =
        Quantity::from_units(i64::try_from(page_size_kib.saturating_mul(1024)).unwrap_or(i64::MAX));
    format!(
        "hugepages-{}",
        super::format::canonical(q, super::format::Format::BinarySi)
    )
}

/// True for `hugepages-*`.
pub fn is_hugepage_resource(name: &str) -> bool {
    name.starts_with("hugepages-")
}

pub use crate::pod::resources::is_extended_resource;

fn units(v: u64) -> Quantity {
    Quantity::from_units(i64::try_from(v).unwrap_or(i64::MAX))
}

/// cAdvisor's `CapacityFromMachineInfo`: cpu, memory and the huge page pools.
pub fn capacity_from_machine(info: &MachineInfo) -> BTreeMap<String, Quantity> {
    let mut out = BTreeMap::new();
    out.insert("cpu".to_string(), units(info.num_cores));
    out.insert("memory".to_string(), units(info.memory_capacity));
    for h in &info.hugepages {
        out.insert(
            hugepage_resource_name(h.page_size_kib),
            units(
                h.num_pages
                    .saturating_mul(h.page_size_kib)
                    .saturating_mul(1024),
            ),
        );
    }
    out
}

/// Upstream `GetThresholdQuantity`: an absolute value, or a percentage of
/// `capacity` computed as kubelet does (a float32 fraction, truncated).
pub fn threshold_quantity(value: ThresholdValue, capacity: u64) -> u64 {
    match value {
        ThresholdValue::Quantity(q) => q.value_u64(),
        ThresholdValue::Percentage(p) => {
            // kubelet parses "10%" into float32(10)/100 and multiplies in float64.
            let percent = ((p * 100.0) as f32) / 100.0f32;
            (capacity as f64 * f64::from(percent)) as u64
        }
    }
}

/// Upstream `hardEvictionReservation`: what the hard thresholds of
/// `memory.available` and `nodefs.available` take out of allocatable.
pub fn hard_eviction_reservation(
    thresholds: &[Threshold],
    capacity: &BTreeMap<String, Quantity>,
) -> BTreeMap<String, Quantity> {
    let mut out = BTreeMap::new();
    for t in thresholds.iter().filter(|t| t.hard) {
        let resource = match t.signal {
            Signal::MemoryAvailable => "memory",
            Signal::NodeFsAvailable => "ephemeral-storage",
            _ => continue,
        };
        let cap = capacity.get(resource).copied().unwrap_or(Quantity::ZERO);
        out.insert(
            resource.to_string(),
            units(threshold_quantity(t.value, cap.value_u64())),
        );
    }
    out
}

/// Upstream `GetNodeAllocatableReservation`: system + kube reserved + hard
/// eviction, for each resource of the container manager's capacity, keeping
/// only non-zero amounts.
pub fn allocatable_reservation(
    capacity: &BTreeMap<String, Quantity>,
    system_reserved: &Reserved,
    kube_reserved: &Reserved,
    thresholds: &[Threshold],
) -> BTreeMap<String, Quantity> {
    let eviction = hard_eviction_reservation(thresholds, capacity);
    let mut out = BTreeMap::new();
    for k in capacity.keys() {
        let mut v = Quantity::ZERO;
        for list in [system_reserved, kube_reserved, &eviction] {
            if let Some(q) = list.get(k) {
                v = v.saturating_add(*q);
            }
        }
        if v != Quantity::ZERO {
            out.insert(k.clone(), v);
        }
    }
    out
}

/// Parses a reserved map (already validated at start; bad entries are skipped).
pub fn parse_reserved(map: &BTreeMap<String, String>) -> Reserved {
    map.iter()
        .filter_map(|(k, v)| Quantity::parse(v).ok().map(|q| (k.clone(), q)))
        .collect()
}

/// What the MachineInfo setter needs.
#[derive(Debug, Clone)]
pub struct CapacityInputs<'a> {
    /// Machine facts; `None` when they could not be read.
    pub machine: Option<&'a MachineInfo>,
    /// Bytes of the filesystem holding the root dir, when known.
    pub ephemeral_storage: Option<u64>,
    /// `maxPods`.
    pub max_pods: i32,
    /// Parsed `systemReserved`.
    pub system_reserved: &'a Reserved,
    /// Parsed `kubeReserved`.
    pub kube_reserved: &'a Reserved,
    /// Eviction thresholds (only the hard ones count).
    pub thresholds: &'a [Threshold],
    /// The device plugins' resources (`GetDevicePluginResourceCapacity`).
    pub devices: Option<&'a crate::devices::DeviceCapacity>,
}

/// The container manager's capacity (machine resources plus
/// `ephemeral-storage`), over which reservations are computed.
fn manager_capacity(inputs: &CapacityInputs<'_>) -> BTreeMap<String, Quantity> {
    let mut cap = inputs
        .machine
        .map(capacity_from_machine)
        .unwrap_or_default();
    if let Some(bytes) = inputs.ephemeral_storage {
        cap.insert("ephemeral-storage".to_string(), units(bytes));
    }
    cap
}

/// Applies the MachineInfo setter's resource part to `capacity` and
/// `allocatable` in place (other writers' entries are kept).
pub fn set_capacity(
    capacity: &mut ResourceList,
    allocatable: &mut ResourceList,
    inputs: &CapacityInputs<'_>,
) {
    let pods = Quantity::from_units(i64::from(inputs.max_pods));
    match inputs.machine {
        None => {
            capacity.insert("cpu".into(), api_quantity("cpu", Quantity::ZERO));
            capacity.insert("memory".into(), api_quantity("memory", Quantity::ZERO));
            capacity.insert("pods".into(), api_quantity("pods", pods));
        }
        Some(info) => {
            for (k, v) in capacity_from_machine(info) {
                capacity.insert(k.clone(), api_quantity(&k, v));
            }
            capacity.insert("pods".into(), api_quantity("pods", pods));
            if let Some(bytes) = inputs.ephemeral_storage {
                capacity.insert(
                    "ephemeral-storage".into(),
                    api_quantity("ephemeral-storage", units(bytes)),
                );
            }
            // Device plugin resources: healthy + unhealthy devices; a
            // resource whose plugin is gone is set to 0, not removed, to
            // show it was managed by a device plugin
            // (`pkg/kubelet/nodestatus/setters.go` MachineInfo).
            if let Some(d) = inputs.devices {
                for (k, v) in &d.capacity {
                    capacity.insert(k.clone(), api_quantity(k, Quantity::from_units(*v)));
                }
                for k in &d.removed {
                    capacity.insert(k.clone(), api_quantity(k, Quantity::ZERO));
                }
            }
        }
    }
    // Extended resources no longer in capacity leave allocatable.
    allocatable.retain(|k, _| capacity.contains_key(k) || !is_extended_resource(k));
    let reservation = allocatable_reservation(
        &manager_capacity(inputs),
        inputs.system_reserved,
        inputs.kube_reserved,
        inputs.thresholds,
    );
    for (k, v) in capacity.iter() {
        let Some(mut value) = parse(v) else {
            // Not ours and not a quantity: copy it as written.
            allocatable.insert(k.clone(), v.clone());
            continue;
        };
        if let Some(r) = reservation.get(k) {
            value = value.saturating_sub(*r);
        }
        if value.is_negative() {
            value = Quantity::ZERO;
        }
        allocatable.insert(k.clone(), api_quantity(k, value));
    }
    // Device plugin resources: healthy devices only.
    if let Some(d) = inputs.devices {
        for (k, v) in &d.allocatable {
            allocatable.insert(k.clone(), api_quantity(k, Quantity::from_units(*v)));
        }
    }
    // Huge page pools are not available as ordinary memory.
    let hugepages: Vec<Quantity> = capacity
        .iter()
        .filter(|(k, _)| is_hugepage_resource(k))
        .filter_map(|(_, v)| parse(v))
        .collect();
    if !hugepages.is_empty() {
        let mut mem = allocatable
            .get("memory")
            .and_then(parse)
            .unwrap_or(Quantity::ZERO);
        for h in hugepages {
            mem = mem.saturating_sub(h);
        }
        if mem.is_negative() {
            mem = Quantity::ZERO;
        }
        allocatable.insert("memory".into(), api_quantity("memory", mem));
    }
}

/// Allocatable as quantities (for other parts of the node).
pub fn parse_list(list: &ResourceList) -> BTreeMap<String, Quantity> {
    list.iter()
        .filter_map(|(k, v)| parse(v).map(|q| (k.clone(), q)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::eviction::{default_eviction_hard, parse_thresholds};
    use crate::status::host::HugePages;

    fn machine() -> MachineInfo {
        MachineInfo {
            num_cores: 2,
            memory_capacity: 25_163_956_224,
            hugepages: vec![
                HugePages {
                    page_size_kib: 2048,
                    num_pages: 0,
                },
                HugePages {
                    page_size_kib: 1_048_576,
                    num_pages: 0,
                },
            ],
            machine_id: "m".into(),
            system_uuid: String::new(),
            boot_id: "b".into(),
            swap_capacity: 0,
        }
    }

    fn q(s: &str) -> ApiQuantity {
        ApiQuantity(s.to_string())
    }

    #[test]
    fn hugepage_names() {
        assert_eq!(hugepage_resource_name(2048), "hugepages-2Mi");
        assert_eq!(hugepage_resource_name(1_048_576), "hugepages-1Gi");
        assert_eq!(hugepage_resource_name(64), "hugepages-64Ki");
    }

    #[test]
    fn extended_resources() {
        assert!(is_extended_resource("example.com/dongle"));
        assert!(!is_extended_resource("cpu"));
        assert!(!is_extended_resource("hugepages-2Mi"));
        assert!(!is_extended_resource("kubernetes.io/something"));
        assert!(!is_extended_resource("requests.example.com/x"));
    }

    #[test]
    fn percentages_follow_float32_arithmetic() {
        // 10% of 250 GB is not exactly 25 GB upstream: float32(0.1) is 0.10000000149.
        assert_eq!(
            threshold_quantity(ThresholdValue::Percentage(0.1), 250_000_000_000),
            25_000_000_372
        );
        assert_eq!(threshold_quantity(ThresholdValue::Percentage(0.1), 100), 10);
        assert_eq!(
            threshold_quantity(
                ThresholdValue::Quantity(Quantity::parse("100Mi").expect("q")),
                1
            ),
            100 * 1024 * 1024
        );
    }

    #[test]
    fn default_node_allocatable() {
        let thresholds = parse_thresholds(
            &default_eviction_hard(),
            &BTreeMap::new(),
            &BTreeMap::new(),
            &BTreeMap::new(),
        )
        .expect("defaults");
        let m = machine();
        let none = Reserved::new();
        let inputs = CapacityInputs {
            machine: Some(&m),
            ephemeral_storage: Some(252_000_000_000),
            max_pods: 110,
            system_reserved: &none,
            kube_reserved: &none,
            thresholds: &thresholds,
            devices: None,
        };
        let mut cap = ResourceList::new();
        cap.insert("example.com/dongle".into(), q("4"));
        let mut alloc = ResourceList::new();
        alloc.insert("example.com/gone".into(), q("1"));
        set_capacity(&mut cap, &mut alloc, &inputs);
        let want_cap: ResourceList = [
            ("cpu", "2"),
            ("memory", "24574176Ki"),
            ("pods", "110"),
            ("ephemeral-storage", "246093750Ki"),
            ("hugepages-2Mi", "0"),
            ("hugepages-1Gi", "0"),
            ("example.com/dongle", "4"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), q(v)))
        .collect();
        assert_eq!(cap, want_cap);
        // memory − 100Mi; ephemeral-storage − 10% (float32); extended copied; gone removed.
        let eph = 252_000_000_000u64
            - threshold_quantity(ThresholdValue::Percentage(0.1), 252_000_000_000);
        let want_alloc: ResourceList = [
            ("cpu", "2".to_string()),
            ("memory", "24471776Ki".to_string()),
            ("pods", "110".to_string()),
            ("ephemeral-storage", eph.to_string()),
            ("hugepages-2Mi", "0".to_string()),
            ("hugepages-1Gi", "0".to_string()),
            ("example.com/dongle", "4".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), ApiQuantity(v)))
        .collect();
        assert_eq!(alloc, want_alloc);
    }

    #[test]
    fn reserved_and_hugepages_reduce_allocatable() {
        let mut m = machine();
        m.hugepages[0].num_pages = 512; // 1Gi of 2Mi pages
        let system: Reserved = [("cpu".to_string(), Quantity::from_milli(500))].into();
        let kube: Reserved = [
            ("cpu".to_string(), Quantity::from_milli(100)),
            ("memory".to_string(), Quantity::parse("1Gi").expect("q")),
        ]
        .into();
        let inputs = CapacityInputs {
            machine: Some(&m),
            ephemeral_storage: None,
            max_pods: 1000,
            system_reserved: &system,
            kube_reserved: &kube,
            thresholds: &[],
            devices: None,
        };
        let mut cap = ResourceList::new();
        let mut alloc = ResourceList::new();
        set_capacity(&mut cap, &mut alloc, &inputs);
        assert_eq!(cap["pods"], q("1k"));
        assert_eq!(cap["hugepages-2Mi"], q("1Gi"));
        assert_eq!(alloc["cpu"], q("1400m"));
        // 24574176Ki − 1Gi (kube) − 1Gi (huge pages)
        assert_eq!(alloc["memory"], q("22477024Ki"));
        assert!(!cap.contains_key("ephemeral-storage"));
    }

    #[test]
    fn never_negative_and_machine_failure_reports_zero() {
        let big: Reserved = [("memory".to_string(), Quantity::parse("1Ti").expect("q"))].into();
        let none = Reserved::new();
        let m = machine();
        let inputs = CapacityInputs {
            machine: Some(&m),
            ephemeral_storage: None,
            max_pods: 10,
            system_reserved: &big,
            kube_reserved: &none,
            thresholds: &[],
            devices: None,
        };
        let (mut cap, mut alloc) = (ResourceList::new(), ResourceList::new());
        set_capacity(&mut cap, &mut alloc, &inputs);
        assert_eq!(alloc["memory"], q("0"));

        let inputs = CapacityInputs {
            machine: None,
            ..inputs
        };
        let (mut cap, mut alloc) = (ResourceList::new(), ResourceList::new());
        set_capacity(&mut cap, &mut alloc, &inputs);
        assert_eq!(cap["cpu"], q("0"));
        assert_eq!(cap["memory"], q("0"));
        assert_eq!(cap["pods"], q("10"));
    }
}

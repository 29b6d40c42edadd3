//! The sizes of the socket LB's Service maps, from the cluster.
//!
//! `kl_services`, `kl_backends` and `kl_members` are sized from what the
//! model asks for, with room to grow, instead of fixed maxima: a fixed
//! `kl_backends` of 524,288 entries cannot hold 50,000 Services × 10
//! endpoints in two slot generations, and costs kernel memory for its
//! buckets on a small node. When the cluster outgrows them, the socket LB
//! is rebuilt with larger maps (filled before its programs are attached,
//! so there is no moment without translation). The per-connection maps
//! (`kl_affinity`, `kl_revnat`) are LRU caches of fixed size.

use std::collections::BTreeMap;

use super::layout::{Frontend, LbService};

/// Entries each sized map may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapSizes {
    /// `kl_services`: frontends.
    pub services: u32,
    /// `kl_backends`: slots of both generations.
    pub backends: u32,
    /// `kl_members`: (service, backend) pairs.
    pub members: u32,
}

/// The smallest sizes (a small node needs no more).
pub const MIN_SIZES: MapSizes = MapSizes {
    services: 1024,
    backends: 4096,
    members: 4096,
};

impl Default for MapSizes {
    fn default() -> Self {
        MIN_SIZES
    }
}

impl MapSizes {
    /// What `desired` fills: each frontend's entry, two slot generations of
    /// its backends, and its members (old and new ones, during an update).
    pub fn needed(desired: &BTreeMap<Frontend, LbService>) -> MapSizes {
        let backends = desired.values().map(|s| s.backends.len()).sum();
        MapSizes::for_counts(desired.len(), backends)
    }

    /// What `frontends` frontends with `backends` backends in all fill.
    pub fn for_counts(frontends: usize, backends: usize) -> MapSizes {
        let backends = 2 * backends as u64;
        MapSizes {
            services: clamp(frontends as u64),
            backends: clamp(backends),
            members: clamp(backends),
        }
    }

    /// Sizes for `needed` with half again as much room, in powers of two
    /// (the kernel rounds a hash map's buckets up to one), at least
    /// [`MIN_SIZES`].
    pub fn with_room(needed: MapSizes) -> MapSizes {
        let grow = |n: u32, min: u32| -> u32 {
            let n = u64::from(n) * 3 / 2;
            clamp(n.max(u64::from(min)).next_power_of_two())
        };
        MapSizes {
            services: grow(needed.services, MIN_SIZES.services),
            backends: grow(needed.backends, MIN_SIZES.backends),
            members: grow(needed.members, MIN_SIZES.members),
        }
    }

    /// The larger of each size.
    pub fn max(self, other: MapSizes) -> MapSizes {
        MapSizes {
            services: self.services.max(other.services),
            backends: self.backends.max(other.backends),
            members: self.members.max(other.members),
        }
    }

    /// Twice each size (a map filled up before the estimate said so).
    pub fn doubled(self) -> MapSizes {
        let d = |n: u32| n.saturating_mul(2);
        MapSizes {
            services: d(self.services),
            backends: d(self.backends),
            members: d(self.members),
        }
    }

    /// Whether these sizes are far more than `target` asks for (more than
    /// four times in some map): worth rebuilding smaller at a full sync.
    pub fn oversized_for(&self, target: MapSizes) -> bool {
        let far = |have: u32, want: u32| u64::from(have) > 4 * u64::from(want);
        far(self.services, target.services)
            || far(self.backends, target.backends)
            || far(self.members, target.members)
    }

    /// Whether maps of these sizes hold `needed`.
    pub fn holds(&self, needed: MapSizes) -> bool {
        needed.services <= self.services
            && needed.backends <= self.backends
            && needed.members <= self.members
    }

    /// The size for a map by name (`None`: not a sized map).
    pub fn of(&self, map: &str) -> Option<u32> {
        match map {
            "kl_services" => Some(self.services),
            "kl_backends" => Some(self.backends),
            "kl_members" => Some(self.members),
            _ => None,
        }
    }
}

fn clamp(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};

    use super::super::layout::L4Proto;
    use super::*;

    fn desired(services: u32, endpoints: u16) -> BTreeMap<Frontend, LbService> {
        (0..services)
            .map(|i| {
                (
                    Frontend {
                        vip: IpAddr::V4(Ipv4Addr::from(0x0a60_0000u32 + i)),
                        port: 80,
                        proto: L4Proto::Tcp,
                    },
                    LbService {
                        name: format!("s{i}"),
                        affinity_timeout: None,
                        backends: (0..endpoints)
                            .map(|e| SocketAddr::from(([10, 1, 0, e as u8], 80)))
                            .collect(),
                    },
                )
            })
            .collect()
    }

    #[test]
    fn sized_from_the_cluster_with_room() {
        let small = MapSizes::with_room(MapSizes::needed(&desired(10, 3)));
        assert_eq!(small, MIN_SIZES, "a small node gets the minimum");
        let need = MapSizes::needed(&desired(50_000, 10));
        assert_eq!(need.backends, 1_000_000, "two generations of 500,000");
        let sizes = MapSizes::with_room(need);
        assert!(sizes.holds(need));
        assert_eq!(sizes.services, 131_072);
        assert_eq!(sizes.backends, 2_097_152);
        assert!(!MIN_SIZES.holds(need), "the minimum does not: it grows");
        assert!(sizes.oversized_for(MIN_SIZES));
        assert!(!sizes.oversized_for(MapSizes::with_room(need)));
        assert_eq!(MIN_SIZES.max(sizes), sizes);
    }
}

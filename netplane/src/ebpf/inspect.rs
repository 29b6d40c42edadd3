//! Reads one service port's socket-LB entries back from the maps and
//! compares them with what the model says they must be (for `keelson
//! diagnose service`). Nothing is written.
//!
//! The expected state is computed by the code the syncer is fed with
//! ([`frontend_of`], [`service_of`]); what is compared is what the programs
//! read: the `kl_services` element of the frontend (backend count, affinity
//! flag and timeout), the slots `0..count` of its active generation in
//! `kl_backends` (as a set of backends: which slot holds which backend is
//! the syncer's business) and the `kl_members` elements of its id (exactly
//! the backends: a member left over keeps ClientIP affinity and UDP flows
//! on a backend the model dropped). Service entries of the same VIP that
//! the model does not have are found with [`stale_frontends`].

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

use crate::model::ServicePortState;

use super::layout::{
    self, BackendKey, Frontend, SVC_FLAG_AFFINITY, SvcValue, decode_backend_value,
    decode_member_key, decode_svc_key, decode_svc_value,
};
use super::maps::{LbMap, LbMaps, MapsError};
use super::render::{frontend_of, service_of};

/// What the maps have for one expected (or unexpected) entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryFound {
    /// As the model wants it.
    Present,
    /// Not in the map.
    Missing,
    /// There, but not as the model wants it (what the map holds).
    Different(String),
    /// In the map, but the model has no such entry (left over).
    Unexpected,
}

/// One entry of a socket-LB map and what the kernel holds for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryCheck {
    /// `kl_services`, `kl_backends` or `kl_members`.
    pub map: &'static str,
    /// The entry in words: `10.96.0.10:53/UDP`, `backend 10.244.1.5:53
    /// (service id 7, generation 0)`.
    pub entry: String,
    /// What the model wants (`2 backend(s), no affinity`, `present`); for
    /// an [`EntryFound::Unexpected`] entry, why the model has none.
    pub expected: String,
    /// What the kernel has.
    pub found: EntryFound,
}

/// The checks of one service port.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FrontendInspection {
    /// The frontend socket LB serves for the port; `None` for ports it
    /// does not serve (SCTP: nftables alone serves them).
    pub frontend: Option<Frontend>,
    /// Every entry compared.
    pub checks: Vec<EntryCheck>,
}

impl FrontendInspection {
    /// The entries that are missing, different or left over.
    pub fn problems(&self) -> impl Iterator<Item = &EntryCheck> {
        self.checks
            .iter()
            .filter(|c| c.found != EntryFound::Present)
    }
}

fn affinity_text(flags: u8, timeout: u32) -> String {
    if flags & SVC_FLAG_AFFINITY != 0 {
        format!("ClientIP affinity {timeout}s")
    } else {
        "no affinity".to_string()
    }
}

fn service_text(count: usize, flags: u8, timeout: u32) -> String {
    format!("{count} backend(s), {}", affinity_text(flags, timeout))
}

fn get(maps: &impl LbMaps, map: LbMap, key: &[u8]) -> Result<Option<Vec<u8>>, MapsError> {
    maps.get(map, key)
}

/// Compares the maps' entries of `state`'s frontend with the model.
pub fn inspect_frontend(
    maps: &impl LbMaps,
    state: &ServicePortState,
) -> Result<FrontendInspection, MapsError> {
    let Some(frontend) = frontend_of(state) else {
        return Ok(FrontendInspection::default());
    };
    let mut out = FrontendInspection {
        frontend: Some(frontend),
        checks: Vec::new(),
    };
    let want = service_of(state);
    let mut backends = want.backends.clone();
    backends.sort();
    backends.dedup();
    let (want_flags, want_timeout) = match want.affinity_timeout {
        Some(t) => (SVC_FLAG_AFFINITY, t),
        None => (0, 0),
    };
    let expected = service_text(backends.len(), want_flags, want_timeout);
    let raw = get(maps, LbMap::Services, &layout::svc_key(&frontend))?;
    let value = raw
        .as_deref()
        .and_then(|v| <[u8; 16]>::try_from(v).ok())
        .and_then(|v| decode_svc_value(&v));
    let Some(svc) = value else {
        out.checks.push(EntryCheck {
            map: LbMap::Services.name(),
            entry: frontend.to_string(),
            expected,
            found: match raw {
                None => EntryFound::Missing,
                Some(_) => EntryFound::Different("a value no keelson writes".into()),
            },
        });
        return Ok(out);
    };
    let found_text = service_text(usize::from(svc.count), svc.flags, svc.affinity_timeout);
    let same = usize::from(svc.count) == backends.len()
        && svc.flags & SVC_FLAG_AFFINITY == want_flags
        && (want_flags == 0 || svc.affinity_timeout == want_timeout);
    out.checks.push(EntryCheck {
        map: LbMap::Services.name(),
        entry: format!("{frontend} (service id {})", svc.id),
        expected,
        found: if same {
            EntryFound::Present
        } else {
            EntryFound::Different(found_text)
        },
    });
    check_slots(maps, &svc, &backends, &mut out)?;
    check_members(maps, svc.id, &backends, &mut out)?;
    Ok(out)
}

/// The active generation's slots `0..count` hold exactly `backends`.
fn check_slots(
    maps: &impl LbMaps,
    svc: &SvcValue,
    backends: &[SocketAddr],
    out: &mut FrontendInspection,
) -> Result<(), MapsError> {
    let mut held: BTreeSet<SocketAddr> = BTreeSet::new();
    for slot in 0..svc.count {
        let key = BackendKey {
            svc_id: svc.id,
            generation: svc.generation,
            slot,
        };
        let raw = get(maps, LbMap::Backends, &layout::backend_key(&key))?;
        let addr = raw
            .as_deref()
            .and_then(|v| <[u8; 20]>::try_from(v).ok())
            .and_then(|v| decode_backend_value(&v));
        let entry = format!(
            "slot {slot} of service id {} (generation {})",
            svc.id, svc.generation
        );
        match (raw, addr) {
            (None, _) => out.checks.push(EntryCheck {
                map: LbMap::Backends.name(),
                entry,
                expected: "a backend".into(),
                found: EntryFound::Missing,
            }),
            (Some(_), None) => out.checks.push(EntryCheck {
                map: LbMap::Backends.name(),
                entry,
                expected: "a backend".into(),
                found: EntryFound::Different("a value no keelson writes".into()),
            }),
            (Some(_), Some(a)) if !backends.contains(&a) => out.checks.push(EntryCheck {
                map: LbMap::Backends.name(),
                entry: format!("backend {a} in {entry}"),
                expected: "the model does not pick this backend".into(),
                found: EntryFound::Unexpected,
            }),
            (Some(_), Some(a)) => {
                held.insert(a);
            }
        }
    }
    for b in backends {
        out.checks.push(EntryCheck {
            map: LbMap::Backends.name(),
            entry: format!(
                "backend {b} (service id {}, generation {})",
                svc.id, svc.generation
            ),
            expected: "present".into(),
            found: if held.contains(b) {
                EntryFound::Present
            } else {
                EntryFound::Missing
            },
        });
    }
    Ok(())
}

/// `kl_members` holds (id, backend) for exactly `backends`.
fn check_members(
    maps: &impl LbMaps,
    id: u32,
    backends: &[SocketAddr],
    out: &mut FrontendInspection,
) -> Result<(), MapsError> {
    let mut held: BTreeSet<SocketAddr> = BTreeSet::new();
    for (k, _) in maps.dump(LbMap::Members)? {
        let Some((member_id, addr)) = <[u8; 24]>::try_from(k.as_slice())
            .ok()
            .and_then(|k| decode_member_key(&k))
        else {
            continue;
        };
        if member_id == id {
            held.insert(addr);
        }
    }
    for b in backends {
        out.checks.push(EntryCheck {
            map: LbMap::Members.name(),
            entry: format!("member {b} of service id {id}"),
            expected: "present".into(),
            found: if held.contains(b) {
                EntryFound::Present
            } else {
                EntryFound::Missing
            },
        });
    }
    for a in held.iter().filter(|a| !backends.contains(a)) {
        out.checks.push(EntryCheck {
            map: LbMap::Members.name(),
            entry: format!("member {a} of service id {id}"),
            expected: "the model does not pick this backend".into(),
            found: EntryFound::Unexpected,
        });
    }
    Ok(())
}

/// `kl_services` entries for one of `vips` that are not in `wanted` (a
/// removed Service port the maps still translate).
pub fn stale_frontends(
    maps: &impl LbMaps,
    vips: &[IpAddr],
    wanted: &[Frontend],
) -> Result<Vec<EntryCheck>, MapsError> {
    let mut out = Vec::new();
    for (k, v) in maps.dump(LbMap::Services)? {
        let Some(f) = <[u8; 20]>::try_from(k.as_slice())
            .ok()
            .and_then(|k| decode_svc_key(&k))
        else {
            continue;
        };
        if !vips.contains(&f.vip) || wanted.contains(&f) {
            continue;
        }
        let id = <[u8; 16]>::try_from(v.as_slice())
            .ok()
            .and_then(|v| decode_svc_value(&v))
            .map(|v| format!(" (service id {})", v.id))
            .unwrap_or_default();
        out.push(EntryCheck {
            map: LbMap::Services.name(),
            entry: format!("{f}{id}"),
            expected: "the Service has no such port".into(),
            found: EntryFound::Unexpected,
        });
    }
    out.sort_by(|a, b| a.entry.cmp(&b.entry));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::ebpf::layout::{L4Proto, member_key};
    use crate::ebpf::maps::FakeMaps;
    use crate::ebpf::sync::Syncer;
    use crate::fixtures::{cluster_ip_port, model_endpoint, port_state};
    use crate::model::Protocol;

    fn state(port: u16, protocol: Protocol, eps: &[&str]) -> ServicePortState {
        let info = cluster_ip_port(IpAddr::from([10, 96, 0, 10]), port, protocol);
        let endpoints = eps
            .iter()
            .map(|ip| model_endpoint(ip.parse().expect("ip"), 8080, true, false, "n1"))
            .collect();
        port_state("web", info, endpoints)
    }

    /// The maps as the syncer writes them for `states`.
    fn written(states: &[&ServicePortState]) -> FakeMaps {
        let (mut syncer, _) = Syncer::adopt(FakeMaps::default()).expect("adopt");
        let desired: BTreeMap<_, _> = states
            .iter()
            .filter_map(|s| frontend_of(s).map(|f| (f, service_of(s))))
            .collect();
        syncer.replace_all(desired).expect("sync");
        syncer.maps().clone()
    }

    fn problems(i: &FrontendInspection) -> Vec<String> {
        i.problems()
            .map(|c| format!("{} {} {:?}", c.map, c.entry, c.found))
            .collect()
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("addr")
    }

    #[test]
    fn what_the_syncer_writes_reads_back_clean() {
        let s = state(80, Protocol::Tcp, &["10.1.0.1", "10.1.0.2"]);
        let maps = written(&[&s]);
        let i = inspect_frontend(&maps, &s).expect("inspect");
        assert!(problems(&i).is_empty(), "{:?}", problems(&i));
        // The service entry, two backends, two members.
        assert_eq!(i.checks.len(), 5, "{:?}", i.checks);
        // No endpoint: an entry with no backend (nftables answers).
        let empty = state(81, Protocol::Udp, &[]);
        let maps = written(&[&empty]);
        let i = inspect_frontend(&maps, &empty).expect("inspect");
        assert!(problems(&i).is_empty(), "{:?}", problems(&i));
        assert_eq!(i.checks[0].expected, "0 backend(s), no affinity");
    }

    #[test]
    fn sctp_is_not_served_by_socket_lb() {
        let s = state(9, Protocol::Sctp, &["10.1.0.1"]);
        let i = inspect_frontend(&FakeMaps::default(), &s).expect("inspect");
        assert_eq!(i.frontend, None);
        assert!(i.checks.is_empty());
    }

    #[test]
    fn a_missing_service_entry_is_named() {
        let s = state(53, Protocol::Udp, &["10.1.0.1"]);
        let i = inspect_frontend(&FakeMaps::default(), &s).expect("inspect");
        assert_eq!(
            problems(&i),
            ["kl_services 10.96.0.10:53/UDP Missing"],
            "{:?}",
            i.checks
        );
        assert_eq!(i.checks[0].expected, "1 backend(s), no affinity");
    }

    #[test]
    fn a_deleted_slot_and_member_are_missing() {
        let s = state(80, Protocol::Tcp, &["10.1.0.1", "10.1.0.2"]);
        let mut maps = written(&[&s]);
        let f = frontend_of(&s).expect("frontend");
        let svc = maps
            .map(LbMap::Services)
            .get(layout::svc_key(&f).as_slice())
            .and_then(|v| decode_svc_value(&<[u8; 16]>::try_from(v.as_slice()).ok()?))
            .expect("service entry");
        let slot1 = layout::backend_key(&BackendKey {
            svc_id: svc.id,
            generation: svc.generation,
            slot: 1,
        });
        maps.delete(LbMap::Backends, &slot1).expect("delete");
        maps.delete(LbMap::Members, &member_key(svc.id, addr("10.1.0.2:8080")))
            .expect("delete");
        let i = inspect_frontend(&maps, &s).expect("inspect");
        let id = svc.id;
        let g = svc.generation;
        assert_eq!(
            problems(&i),
            [
                format!("kl_backends slot 1 of service id {id} (generation {g}) Missing"),
                format!(
                    "kl_backends backend 10.1.0.2:8080 (service id {id}, generation {g}) Missing"
                ),
                format!("kl_members member 10.1.0.2:8080 of service id {id} Missing"),
            ]
        );
    }

    #[test]
    fn stale_backends_members_and_counts_are_named() {
        // The maps still hold two backends; the model now picks one.
        let old = state(80, Protocol::Tcp, &["10.1.0.1", "10.1.0.2"]);
        let now = state(80, Protocol::Tcp, &["10.1.0.1"]);
        let maps = written(&[&old]);
        let i = inspect_frontend(&maps, &now).expect("inspect");
        let p = problems(&i);
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(p[0].starts_with("kl_services 10.96.0.10:80/TCP (service id "));
        assert_eq!(
            i.checks[0].found,
            EntryFound::Different("2 backend(s), no affinity".into())
        );
        assert!(p[1].starts_with("kl_backends backend 10.1.0.2:8080 in slot 1"));
        assert!(p[1].ends_with("Unexpected"));
        assert!(p[2].starts_with("kl_members member 10.1.0.2:8080"));
        assert!(p[2].ends_with("Unexpected"));
    }

    #[test]
    fn a_port_the_service_no_longer_has_is_stale() {
        let http = state(80, Protocol::Tcp, &["10.1.0.1"]);
        let dns = state(53, Protocol::Udp, &["10.1.0.1"]);
        let maps = written(&[&http, &dns]);
        let vip = IpAddr::from([10, 96, 0, 10]);
        let wanted = [frontend_of(&http).expect("frontend")];
        let stale = stale_frontends(&maps, &[vip], &wanted).expect("dump");
        assert_eq!(stale.len(), 1, "{stale:?}");
        assert!(stale[0].entry.starts_with("10.96.0.10:53/UDP (service id "));
        assert_eq!(stale[0].found, EntryFound::Unexpected);
        let all = [wanted[0], frontend_of(&dns).expect("frontend")];
        assert!(
            stale_frontends(&maps, &[vip], &all)
                .expect("dump")
                .is_empty()
        );
        assert_eq!(
            frontend_of(&dns).map(|f| f.proto),
            Some(L4Proto::Udp),
            "the UDP port is a socket-LB frontend"
        );
    }
}

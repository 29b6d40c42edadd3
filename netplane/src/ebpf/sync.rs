//! Keeps the socket-LB maps equal to the desired frontends, writing only
//! what changed.
//!
//! The syncer remembers what it wrote (`written`) next to what it was asked
//! for (`desired`); a change to one frontend touches only that frontend's
//! entries. The kernel maps are read in full only at start (adoption of the
//! maps a previous keelson left pinned) and after a failed write.
//!
//! ## Never a half-written service
//!
//! Each service owns two generations of backend slots. An update writes the
//! new backend list into the *inactive* generation (only the slots whose
//! content differs), adds the new members, then replaces the service entry
//! in one map update that flips `gen` and `count` together; only then are
//! removed members deleted. A program that read the old entry keeps reading
//! the old generation, which stays intact until the next update. The
//! service map is created with `BPF_F_NO_PREALLOC`, so a replaced element
//! is freed only after an RCU grace period: readers see the old or the new
//! element, never a mix.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;

use super::layout::{
    self, BackendKey, Frontend, LbService, SVC_FLAG_AFFINITY, SvcValue, decode_backend_key,
    decode_backend_value, decode_member_key, decode_svc_key, decode_svc_value,
};
use super::maps::{LbMap, LbMaps, MapsError};
use super::sizes::MapSizes;

/// Why one frontend could not be written.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// A map operation failed; the syncer re-reads the maps on the next
    /// apply and converges then.
    #[error("service {service} ({frontend}): {source}")]
    Map {
        /// `namespace/name:port`.
        service: String,
        /// The frontend.
        frontend: Frontend,
        /// The failed operation.
        #[source]
        source: MapsError,
    },
    /// Reading the maps back failed.
    #[error("reading the socket-LB maps: {0}")]
    Dump(#[source] MapsError),
    /// The desired service cannot be expressed in the maps; its previous
    /// state (if any) is kept.
    #[error("service {service} ({frontend}): {reason}")]
    Invalid {
        /// `namespace/name:port`.
        service: String,
        /// The frontend.
        frontend: Frontend,
        /// What is wrong.
        reason: String,
    },
    /// Every service-port id is in use.
    #[error("no free service id for {service} ({frontend})")]
    IdsExhausted {
        /// `namespace/name:port`.
        service: String,
        /// The frontend.
        frontend: Frontend,
    },
    /// The maps had to be rebuilt larger (or smaller) and that failed; the
    /// next apply tries again.
    #[error("resizing the socket-LB maps: {0}")]
    Resize(String),
}

impl SyncErrors {
    /// Whether a put failed because a map is full.
    pub fn map_full(&self) -> bool {
        self.0
            .iter()
            .any(|e| matches!(e, SyncError::Map { source, .. } if source.is_full()))
    }
}

/// Several frontends failed in one apply; the others were written.
#[derive(Debug, thiserror::Error)]
#[error("{} socket-LB service(s) failed to sync; first: {}", .0.len(), .0.first().map(|e| e.to_string()).unwrap_or_default())]
pub struct SyncErrors(pub Vec<SyncError>);

/// What one apply wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncStats {
    /// Map entries created or replaced.
    pub puts: usize,
    /// Map entries deleted.
    pub deletes: usize,
    /// Frontends whose kernel state changed.
    pub services_changed: usize,
}

/// What the kernel holds for one frontend, as far as the syncer knows.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Written {
    id: u32,
    /// Active generation (index into `slots`).
    generation: u8,
    /// Backends in the active generation.
    count: u16,
    flags: u8,
    affinity_timeout: u32,
    /// Slot contents of generation 0 and 1.
    slots: [Slots; 2],
}

impl Written {
    /// The active backend list; `None` when a slot is missing (a previous
    /// run died between writes), which forces a rewrite.
    fn active(&self) -> Option<Vec<SocketAddr>> {
        let slots = &self.slots[usize::from(self.generation)];
        (0..self.count).map(|i| slots.get(i).copied()).collect()
    }

    /// The members the kernel holds once an update is complete: the
    /// backends of the active generation (an interrupted update is
    /// cleaned up by reading the maps back).
    fn members(&self) -> BTreeSet<SocketAddr> {
        let slots = &self.slots[usize::from(self.generation)];
        (0..self.count)
            .filter_map(|i| slots.get(i).copied())
            .collect()
    }
}

/// The slots of one generation, by index (`None`: not in the map). A dense
/// vector: a service's slots are 0..n.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Slots(Vec<Option<SocketAddr>>);

impl Slots {
    fn get(&self, slot: u16) -> Option<&SocketAddr> {
        self.0.get(usize::from(slot)).and_then(Option::as_ref)
    }

    fn insert(&mut self, slot: u16, addr: SocketAddr) {
        let i = usize::from(slot);
        if self.0.len() <= i {
            self.0.resize(i + 1, None);
        }
        self.0[i] = Some(addr);
    }

    /// Slots present at or beyond `count`.
    fn beyond(&self, count: u16) -> Vec<u16> {
        self.present().filter(|s| *s >= count).collect()
    }

    /// Indexes of the slots present.
    fn present(&self) -> impl Iterator<Item = u16> + '_ {
        self.0
            .iter()
            .enumerate()
            .filter(|(_, a)| a.is_some())
            .filter_map(|(i, _)| u16::try_from(i).ok())
    }

    /// Exactly `backends` in slots 0..n.
    fn of(backends: &[SocketAddr]) -> Slots {
        Slots(backends.iter().copied().map(Some).collect())
    }
}

/// The map syncer; see the module docs.
#[derive(Debug)]
pub struct Syncer<M> {
    maps: M,
    desired: BTreeMap<Frontend, LbService>,
    /// Backends of every desired frontend, summed (for map sizing).
    desired_backends: usize,
    written: BTreeMap<Frontend, Written>,
    ids: BTreeSet<u32>,
    next_id: u32,
    /// Ids kept for frontends not written yet (see [`Syncer::keep_ids_of`]).
    reserved: BTreeMap<Frontend, u32>,
    /// A write failed: re-read the maps before the next apply.
    resync: bool,
    /// `written` was read from the maps and nothing was written since:
    /// a verification now would read the same (the first full sync right
    /// after [`Syncer::adopt`] skips it).
    just_read: bool,
}

/// The slot array a desired service needs, sorted and without duplicates,
/// so that the same endpoint set always yields the same slots.
fn normalized(s: &LbService) -> Vec<SocketAddr> {
    let mut v = s.backends.clone();
    v.sort();
    v.dedup();
    v
}

fn flags_of(s: &LbService) -> (u8, u32) {
    match s.affinity_timeout {
        Some(t) => (SVC_FLAG_AFFINITY, t),
        None => (0, 0),
    }
}

impl<M: LbMaps> Syncer<M> {
    /// Starts from the maps' current content (a previous keelson's, after a
    /// restart): entries no keelson writes, and slots or members of no
    /// service, are deleted; services are kept as they are, so traffic keeps
    /// flowing until the first [`Syncer::replace_all`] says otherwise.
    pub fn adopt(maps: M) -> Result<(Self, SyncStats), SyncError> {
        let mut s = Syncer {
            maps,
            desired: BTreeMap::new(),
            desired_backends: 0,
            written: BTreeMap::new(),
            ids: BTreeSet::new(),
            next_id: 1,
            reserved: BTreeMap::new(),
            resync: false,
            just_read: false,
        };
        let stats = s.read_back()?;
        Ok((s, stats))
    }

    /// The maps (tests inspect the fake).
    pub fn maps(&self) -> &M {
        &self.maps
    }

    /// Gives the frontends of `from` that are still in `desired` the ids
    /// they have there, and continues `from`'s id sequence (the maps are
    /// rebuilt: a client's affinity entry names its service by id, so a
    /// frontend keeps its id and a new one gets none a removed one had).
    /// Call it on a syncer of empty maps, before the first apply.
    pub fn keep_ids_of<N>(&mut self, from: &Syncer<N>, desired: &BTreeMap<Frontend, LbService>) {
        self.reserved = from
            .written
            .iter()
            .filter(|(f, _)| desired.contains_key(f))
            .map(|(f, w)| (*f, w.id))
            .collect();
        self.ids.extend(self.reserved.values());
        self.next_id = from.next_id;
    }

    /// The desired frontends (what a rebuilt set of maps is filled with).
    pub fn desired(&self) -> &BTreeMap<Frontend, LbService> {
        &self.desired
    }

    /// What the maps must hold once `changes` are applied (see
    /// [`MapSizes::for_counts`]); costs a lookup per change.
    pub fn needed_after(&self, changes: &[(Frontend, Option<LbService>)]) -> MapSizes {
        let mut frontends = self.desired.len();
        let mut backends = self.desired_backends;
        let mut now: BTreeMap<&Frontend, Option<usize>> = BTreeMap::new();
        for (f, s) in changes {
            let before = match now.get(f) {
                Some(n) => *n,
                None => self.desired.get(f).map(|s| s.backends.len()),
            };
            let after = s.as_ref().map(|s| s.backends.len());
            if let Some(n) = before {
                frontends -= 1;
                backends -= n;
            }
            if let Some(n) = after {
                frontends += 1;
                backends += n;
            }
            now.insert(f, after);
        }
        MapSizes::for_counts(frontends, backends)
    }

    /// Number of frontends currently written.
    pub fn written_len(&self) -> usize {
        self.written.len()
    }

    /// The service-port id written for a frontend.
    pub fn service_id(&self, f: &Frontend) -> Option<u32> {
        self.written.get(f).map(|w| w.id)
    }

    /// Rebuilds `written` from the kernel, deleting unreachable entries.
    /// The maps are walked entry by entry (nothing is collected but what
    /// `written` keeps and the keys to delete); members are walked by key
    /// only.
    fn read_back(&mut self) -> Result<SyncStats, SyncError> {
        let mut stats = SyncStats::default();
        let mut junk: Vec<(LbMap, Vec<u8>)> = Vec::new();
        let mut written: BTreeMap<Frontend, Written> = BTreeMap::new();
        let mut by_id: HashMap<u32, Frontend> = HashMap::new();
        self.maps
            .scan(LbMap::Services, &mut |k, v| {
                let key = <[u8; 20]>::try_from(k)
                    .ok()
                    .and_then(|kb| decode_svc_key(&kb));
                let value = <[u8; 16]>::try_from(v)
                    .ok()
                    .and_then(|vb| decode_svc_value(&vb));
                let (Some(f), Some(sv)) = (key, value) else {
                    junk.push((LbMap::Services, k.to_vec()));
                    return;
                };
                if sv.id == 0 || by_id.contains_key(&sv.id) {
                    junk.push((LbMap::Services, k.to_vec()));
                    return;
                }
                by_id.insert(sv.id, f);
                written.insert(
                    f,
                    Written {
                        id: sv.id,
                        generation: sv.generation,
                        count: sv.count,
                        flags: sv.flags,
                        affinity_timeout: sv.affinity_timeout,
                        slots: [Slots::default(), Slots::default()],
                    },
                );
            })
            .map_err(SyncError::Dump)?;
        self.maps
            .scan(LbMap::Backends, &mut |k, v| {
                let key = <[u8; 8]>::try_from(k)
                    .ok()
                    .and_then(|kb| decode_backend_key(&kb));
                let value = <[u8; 20]>::try_from(v)
                    .ok()
                    .and_then(|vb| decode_backend_value(&vb));
                let w = key
                    .and_then(|bk| by_id.get(&bk.svc_id))
                    .and_then(|f| written.get_mut(f));
                match (key, value, w) {
                    (Some(bk), Some(addr), Some(w))
                        if bk.generation != w.generation || bk.slot < w.count =>
                    {
                        w.slots[usize::from(bk.generation)].insert(bk.slot, addr);
                    }
                    // Undecodable, of no service, or beyond the active count.
                    _ => junk.push((LbMap::Backends, k.to_vec())),
                }
            })
            .map_err(SyncError::Dump)?;
        // Members: exactly the active backends of each service; anything
        // else is left from an interrupted update (or not keelson's).
        let mut missing: BTreeMap<u32, BTreeSet<SocketAddr>> =
            written.values().map(|w| (w.id, w.members())).collect();
        self.maps
            .scan_keys(LbMap::Members, &mut |k| {
                let decoded = <[u8; 24]>::try_from(k)
                    .ok()
                    .and_then(|kb| decode_member_key(&kb));
                match decoded.and_then(|(id, addr)| missing.get_mut(&id).map(|m| m.remove(&addr))) {
                    Some(true) => {}
                    _ => junk.push((LbMap::Members, k.to_vec())),
                }
            })
            .map_err(SyncError::Dump)?;
        for (map, key) in junk {
            self.maps.delete(map, &key).map_err(SyncError::Dump)?;
            stats.deletes += 1;
        }
        for (id, addrs) in missing {
            for addr in addrs {
                self.maps
                    .put(LbMap::Members, &layout::member_key(id, addr), &[1])
                    .map_err(SyncError::Dump)?;
                stats.puts += 1;
            }
        }
        self.ids = written.values().map(|w| w.id).collect();
        self.next_id = self.ids.last().map_or(1, |id| id.wrapping_add(1).max(1));
        self.ids.extend(self.reserved.values());
        self.written = written;
        self.resync = false;
        self.just_read = true;
        Ok(stats)
    }

    /// Re-reads the maps, then sets the complete desired state (the
    /// periodic resync). Returns whether the kernel differed from what the
    /// syncer remembered (someone else wrote the maps, or entries went
    /// missing); either way the maps end up equal to `desired`.
    pub fn verify_and_replace_all(
        &mut self,
        desired: BTreeMap<Frontend, LbService>,
    ) -> Result<(SyncStats, bool), SyncErrors> {
        if std::mem::take(&mut self.just_read) {
            // Adopted a moment ago and nothing written since (the first
            // full sync after a restart): reading the maps again would
            // find what `written` holds. Later verifications read them.
            return Ok((self.replace_all(desired)?, false));
        }
        let remembered = self.written.clone();
        let cleaned = self.read_back().map_err(|e| SyncErrors(vec![e]))?;
        let repaired = cleaned.deletes > 0 || cleaned.puts > 0 || remembered != self.written;
        if repaired {
            tracing::warn!("socket-LB maps differed from what keelson wrote; repairing");
        }
        let mut stats = self.replace_all(desired)?;
        stats.deletes += cleaned.deletes;
        stats.puts += cleaned.puts;
        Ok((stats, repaired))
    }

    /// Sets the complete desired state: frontends not in `desired` are
    /// removed. Used at start and on periodic resync.
    pub fn replace_all(
        &mut self,
        desired: BTreeMap<Frontend, LbService>,
    ) -> Result<SyncStats, SyncErrors> {
        let mut changes: Vec<(Frontend, Option<LbService>)> = self
            .desired
            .keys()
            .chain(self.written.keys())
            .filter(|f| !desired.contains_key(f))
            .map(|f| (*f, None))
            .collect();
        changes.extend(desired.into_iter().map(|(f, s)| (f, Some(s))));
        self.apply(changes)
    }

    /// Applies changes: `Some` sets a frontend's desired state, `None`
    /// removes it. Only the named frontends are looked at (all of them after
    /// a previous failure). A frontend that fails is reported and the others
    /// are still written.
    pub fn apply(
        &mut self,
        changes: impl IntoIterator<Item = (Frontend, Option<LbService>)>,
    ) -> Result<SyncStats, SyncErrors> {
        let mut touched = BTreeSet::new();
        for (f, s) in changes {
            if let Some(s) = &s {
                self.desired_backends += s.backends.len();
            }
            let old = match s {
                Some(s) => self.desired.insert(f, s),
                None => self.desired.remove(&f),
            };
            if let Some(old) = old {
                self.desired_backends -= old.backends.len();
            }
            touched.insert(f);
        }
        let mut stats = SyncStats::default();
        let mut errors = Vec::new();
        if self.resync {
            match self.read_back() {
                Ok(s) => {
                    stats.deletes += s.deletes;
                    touched.extend(self.desired.keys().copied());
                    touched.extend(self.written.keys().copied());
                }
                Err(e) => return Err(SyncErrors(vec![e])),
            }
        }
        let writes_before = (stats.puts, stats.deletes);
        for f in touched {
            if let Err(e) = self.reconcile(&f, &mut stats) {
                if matches!(e, SyncError::Map { .. }) {
                    self.resync = true;
                }
                tracing::warn!(frontend = %f, error = %e, "socket-LB sync failed");
                errors.push(e);
            }
        }
        if !errors.is_empty() || (stats.puts, stats.deletes) != writes_before {
            self.just_read = false;
        }
        if errors.is_empty() {
            Ok(stats)
        } else {
            Err(SyncErrors(errors))
        }
    }

    fn alloc_id(&mut self) -> Option<u32> {
        // Ids are handed out in increasing order and reused only after a
        // wrap, so an affinity entry of a removed service is not mistaken
        // for one of a new service.
        let start = self.next_id;
        let mut id = start;
        loop {
            if id != 0 && !self.ids.contains(&id) {
                self.ids.insert(id);
                self.next_id = id.wrapping_add(1);
                return Some(id);
            }
            id = id.wrapping_add(1);
            if id == start {
                return None;
            }
        }
    }

    fn reconcile(&mut self, f: &Frontend, stats: &mut SyncStats) -> Result<(), SyncError> {
        let Some(d) = self.desired.get(f).cloned() else {
            if let Some(id) = self.reserved.remove(f) {
                self.ids.remove(&id);
            }
            return match self.written.get(f).cloned() {
                Some(w) => self.remove(f, &w, stats),
                None => Ok(()),
            };
        };
        let backends = normalized(&d);
        if let Some(bad) = backends.iter().find(|b| b.is_ipv4() != f.vip.is_ipv4()) {
            return Err(SyncError::Invalid {
                service: d.name.clone(),
                frontend: *f,
                reason: format!("endpoint {bad} is not of the Service IP's family"),
            });
        }
        let Ok(count) = u16::try_from(backends.len()) else {
            return Err(SyncError::Invalid {
                service: d.name.clone(),
                frontend: *f,
                reason: format!("{} endpoints, at most {} fit", backends.len(), u16::MAX),
            });
        };
        let w = match self.written.get(f) {
            Some(w) => w.clone(),
            None => {
                let id = match self.reserved.remove(f) {
                    Some(id) => id,
                    None => self.alloc_id().ok_or_else(|| SyncError::IdsExhausted {
                        service: d.name.clone(),
                        frontend: *f,
                    })?,
                };
                // Nothing in the kernel yet: "flip" from an empty
                // generation 1 to generation 0.
                Written {
                    id,
                    generation: 1,
                    count: 0,
                    flags: 0,
                    affinity_timeout: 0,
                    slots: [Slots::default(), Slots::default()],
                }
            }
        };
        let fresh = !self.written.contains_key(f);
        self.update(f, &d, &backends, count, w, fresh, stats)
    }

    fn map_err(name: &str, f: &Frontend) -> impl Fn(MapsError) -> SyncError {
        let service = name.to_string();
        let frontend = *f;
        move |source| SyncError::Map {
            service: service.clone(),
            frontend,
            source,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn update(
        &mut self,
        f: &Frontend,
        d: &LbService,
        backends: &[SocketAddr],
        count: u16,
        mut w: Written,
        fresh: bool,
        stats: &mut SyncStats,
    ) -> Result<(), SyncError> {
        let (flags, timeout) = flags_of(d);
        let e = Self::map_err(&d.name, f);
        let skey = layout::svc_key(f);
        if !fresh && w.active().as_deref() == Some(backends) {
            if (w.flags, w.affinity_timeout) == (flags, timeout) {
                return Ok(());
            }
            let v = SvcValue {
                id: w.id,
                count: w.count,
                generation: w.generation,
                flags,
                affinity_timeout: timeout,
            };
            self.maps
                .put(LbMap::Services, &skey, &layout::svc_value(&v))
                .map_err(&e)?;
            stats.puts += 1;
            stats.services_changed += 1;
            w.flags = flags;
            w.affinity_timeout = timeout;
            self.written.insert(*f, w);
            return Ok(());
        }

        let next = 1 - w.generation;
        let next_slots = usize::from(next);
        // 1. The new slot array, in the generation no program reads.
        for (slot, addr) in (0..count).zip(backends) {
            if w.slots[next_slots].get(slot) == Some(addr) {
                continue;
            }
            let k = layout::backend_key(&BackendKey {
                svc_id: w.id,
                generation: next,
                slot,
            });
            self.maps
                .put(LbMap::Backends, &k, &layout::backend_value(*addr))
                .map_err(&e)?;
            stats.puts += 1;
        }
        let stale: Vec<u16> = w.slots[next_slots].beyond(count);
        for slot in stale {
            let k = layout::backend_key(&BackendKey {
                svc_id: w.id,
                generation: next,
                slot,
            });
            self.maps.delete(LbMap::Backends, &k).map_err(&e)?;
            stats.deletes += 1;
        }
        w.slots[next_slots] = Slots::of(backends);
        // 2. Members of the new set, before any program can pick them.
        let old_members = w.members();
        let new_members: BTreeSet<SocketAddr> = backends.iter().copied().collect();
        for addr in new_members.difference(&old_members) {
            self.maps
                .put(LbMap::Members, &layout::member_key(w.id, *addr), &[1])
                .map_err(&e)?;
            stats.puts += 1;
        }
        // 3. The flip: one element replacement switches count and generation.
        let v = SvcValue {
            id: w.id,
            count,
            generation: next,
            flags,
            affinity_timeout: timeout,
        };
        self.maps
            .put(LbMap::Services, &skey, &layout::svc_value(&v))
            .map_err(&e)?;
        stats.puts += 1;
        stats.services_changed += 1;
        w.generation = next;
        w.count = count;
        w.flags = flags;
        w.affinity_timeout = timeout;
        let id = w.id;
        self.written.insert(*f, w);
        // 4. Members that left: remembered (affinity, UDP flow) choices of
        // them are not reused from now on. (If a deletion fails, the maps
        // are read back before the next apply, which removes the rest.)
        for addr in old_members.difference(&new_members) {
            self.maps
                .delete(LbMap::Members, &layout::member_key(id, *addr))
                .map_err(&e)?;
            stats.deletes += 1;
        }
        Ok(())
    }

    fn remove(
        &mut self,
        f: &Frontend,
        w: &Written,
        stats: &mut SyncStats,
    ) -> Result<(), SyncError> {
        let e = Self::map_err("(removed service)", f);
        // The service entry first: from then on no program reads the slots.
        self.maps
            .delete(LbMap::Services, &layout::svc_key(f))
            .map_err(&e)?;
        stats.deletes += 1;
        stats.services_changed += 1;
        self.written.remove(f);
        for (generation, slots) in [0u8, 1].into_iter().zip(&w.slots) {
            for slot in slots.present() {
                let k = layout::backend_key(&BackendKey {
                    svc_id: w.id,
                    generation,
                    slot,
                });
                self.maps.delete(LbMap::Backends, &k).map_err(&e)?;
                stats.deletes += 1;
            }
        }
        for addr in &w.members() {
            self.maps
                .delete(LbMap::Members, &layout::member_key(w.id, *addr))
                .map_err(&e)?;
            stats.deletes += 1;
        }
        self.ids.remove(&w.id);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::super::layout::{L4Proto, backend_key, decode_svc_key};
    use super::super::maps::FakeMaps;
    use super::*;

    fn fe(i: u32) -> Frontend {
        Frontend {
            vip: IpAddr::from([10, 96, (i >> 8) as u8, i as u8]),
            port: 80,
            proto: L4Proto::Tcp,
        }
    }

    fn be(i: u32, j: u8) -> SocketAddr {
        SocketAddr::from(([10, 1, i as u8, j], 8080))
    }

    fn svc(i: u32, n: u8, affinity: Option<u32>) -> LbService {
        LbService {
            name: format!("ns/s{i}:http"),
            affinity_timeout: affinity,
            backends: (1..=n).map(|j| be(i, j)).collect(),
        }
    }

    /// What a program sees: for every service entry, its flags and the
    /// backends of its active generation; and every member.
    type View = BTreeMap<Frontend, (u8, u32, Vec<SocketAddr>, BTreeSet<SocketAddr>)>;

    fn view(m: &FakeMaps) -> View {
        let backends = m.map(LbMap::Backends);
        let members = m.map(LbMap::Members);
        let mut out = BTreeMap::new();
        for (k, v) in m.map(LbMap::Services) {
            let f = decode_svc_key(&k.as_slice().try_into().expect("20 bytes")).expect("key");
            let sv = decode_svc_value(&v.as_slice().try_into().expect("16 bytes")).expect("value");
            let slots: Vec<SocketAddr> = (0..sv.count)
                .map(|slot| {
                    let k = backend_key(&BackendKey {
                        svc_id: sv.id,
                        generation: sv.generation,
                        slot,
                    });
                    let v = backends.get(k.as_slice()).expect("slot present");
                    decode_backend_value(&v.as_slice().try_into().expect("20")).expect("addr")
                })
                .collect();
            let mem: BTreeSet<SocketAddr> = members
                .keys()
                .filter_map(|k| decode_member_key(&k.as_slice().try_into().ok()?))
                .filter(|(id, _)| *id == sv.id)
                .map(|(_, a)| a)
                .collect();
            out.insert(f, (sv.flags, sv.affinity_timeout, slots, mem));
        }
        out
    }

    fn expect_view(desired: &BTreeMap<Frontend, LbService>) -> View {
        desired
            .iter()
            .map(|(f, s)| {
                let b = normalized(s);
                let (flags, t) = flags_of(s);
                (*f, (flags, t, b.clone(), b.into_iter().collect()))
            })
            .collect()
    }

    fn new_syncer() -> Syncer<FakeMaps> {
        Syncer::adopt(FakeMaps::default()).expect("adopt empty").0
    }

    #[test]
    fn new_service_is_written_and_unchanged_one_is_not() {
        let mut s = new_syncer();
        let desired: BTreeMap<_, _> = [(fe(1), svc(1, 3, None))].into();
        let st = s.replace_all(desired.clone()).expect("apply");
        assert_eq!(st.puts, 3 + 3 + 1, "3 slots, 3 members, 1 service entry");
        assert_eq!(view(s.maps()), expect_view(&desired));
        let st = s.replace_all(desired).expect("apply again");
        assert_eq!(st, SyncStats::default(), "nothing changed, nothing written");
    }

    #[test]
    fn one_endpoint_added_to_one_of_many_services_touches_only_it() {
        let mut s = new_syncer();
        let mut desired: BTreeMap<_, _> = (0..1000).map(|i| (fe(i), svc(i, 3, None))).collect();
        s.replace_all(desired.clone()).expect("initial");
        let id = s.service_id(&fe(500)).expect("id");
        let log_start = s.maps().log.len();
        desired.insert(fe(500), svc(500, 4, None));
        let st = s
            .apply([(fe(500), Some(svc(500, 4, None)))])
            .expect("apply");
        assert_eq!(st.services_changed, 1);
        assert_eq!(
            st.puts,
            4 + 1 + 1,
            "4 slots of the new generation, 1 member, the flip"
        );
        assert_eq!(st.deletes, 0);
        for (map, _, key) in &s.maps().log[log_start..] {
            let touched_id = match map {
                LbMap::Services => s.service_id(
                    &decode_svc_key(&key.as_slice().try_into().expect("20")).expect("key"),
                ),
                LbMap::Backends => {
                    decode_backend_key(&key.as_slice().try_into().expect("8")).map(|k| k.svc_id)
                }
                LbMap::Members => {
                    decode_member_key(&key.as_slice().try_into().expect("24")).map(|k| k.0)
                }
            };
            assert_eq!(touched_id, Some(id), "{map:?} write of another service");
        }
        assert_eq!(view(s.maps()), expect_view(&desired));
    }

    #[test]
    fn slots_and_members_are_written_before_the_flip_and_removals_after() {
        let mut s = new_syncer();
        s.apply([(fe(1), Some(svc(1, 3, None)))]).expect("initial");
        let start = s.maps().log.len();
        // Replace backend 1 by backend 9.
        let mut next = svc(1, 0, None);
        next.backends = vec![be(1, 2), be(1, 3), be(1, 9)];
        s.apply([(fe(1), Some(next.clone()))]).expect("update");
        let log = &s.maps().log[start..];
        let flip = log
            .iter()
            .position(|(m, _, _)| *m == LbMap::Services)
            .expect("service entry written");
        assert!(
            log[..flip]
                .iter()
                .all(|(m, op, _)| *op == "put" && *m != LbMap::Services),
            "only slot and member puts before the flip: {log:?}"
        );
        assert!(
            log[flip + 1..]
                .iter()
                .all(|(m, op, _)| *m == LbMap::Members && *op == "delete"),
            "only member deletions after the flip: {log:?}"
        );
        assert_eq!(view(s.maps()), expect_view(&[(fe(1), next)].into()));
    }

    #[test]
    fn generations_alternate_and_reuse_unchanged_slots() {
        let mut s = new_syncer();
        s.apply([(fe(1), Some(svc(1, 3, None)))]).expect("gen 0");
        s.apply([(fe(1), Some(svc(1, 2, None)))]).expect("gen 1");
        // Back to three: generation 0 still holds slots 0..3 from the
        // first write, so nothing but the member and the flip is written.
        let st = s
            .apply([(fe(1), Some(svc(1, 3, None)))])
            .expect("gen 0 again");
        assert_eq!(st.puts, 1 + 1, "member of backend 3 and the flip");
        // And down to one: generation 1 has slots 0..2, slot 1 goes.
        let st = s
            .apply([(fe(1), Some(svc(1, 1, None)))])
            .expect("gen 1 again");
        assert_eq!(st.deletes, 1 + 2, "stale slot 1 of gen 1, members 2 and 3");
        assert_eq!(
            view(s.maps()),
            expect_view(&[(fe(1), svc(1, 1, None))].into())
        );
    }

    #[test]
    fn affinity_change_alone_rewrites_only_the_service_entry() {
        let mut s = new_syncer();
        s.apply([(fe(1), Some(svc(1, 2, None)))]).expect("initial");
        let st = s
            .apply([(fe(1), Some(svc(1, 2, Some(10800))))])
            .expect("affinity on");
        assert_eq!((st.puts, st.deletes), (1, 0));
        let v = view(s.maps());
        assert_eq!(v[&fe(1)].0, SVC_FLAG_AFFINITY);
        assert_eq!(v[&fe(1)].1, 10800);
    }

    #[test]
    fn removed_service_leaves_nothing_behind() {
        let mut s = new_syncer();
        s.apply([
            (fe(1), Some(svc(1, 3, None))),
            (fe(2), Some(svc(2, 2, None))),
        ])
        .expect("initial");
        s.apply([(fe(1), Some(svc(1, 1, None)))]).expect("shrink");
        s.apply([(fe(1), None)]).expect("remove");
        assert_eq!(
            view(s.maps()),
            expect_view(&[(fe(2), svc(2, 2, None))].into())
        );
        let ids: BTreeSet<u32> = s
            .maps()
            .map(LbMap::Backends)
            .keys()
            .filter_map(|k| decode_backend_key(&k.as_slice().try_into().ok()?))
            .map(|k| k.svc_id)
            .collect();
        assert_eq!(ids.len(), 1, "only service 2's slots remain");
    }

    #[test]
    fn service_without_endpoints_keeps_an_empty_entry() {
        let mut s = new_syncer();
        s.apply([(fe(1), Some(svc(1, 2, None)))]).expect("initial");
        s.apply([(fe(1), Some(svc(1, 0, None)))])
            .expect("no endpoints");
        let v = view(s.maps());
        assert!(
            v[&fe(1)].2.is_empty(),
            "count 0: programs leave it to nftables"
        );
        assert!(v[&fe(1)].3.is_empty());
    }

    #[test]
    fn the_first_full_sync_after_adoption_does_not_read_the_maps_again() {
        let mut a = new_syncer();
        let desired: BTreeMap<_, _> = (0..20).map(|i| (fe(i), svc(i, 3, None))).collect();
        a.replace_all(desired.clone()).expect("initial");
        let (mut b, _) = Syncer::adopt(a.maps().clone()).expect("adopt");
        let reads = b.maps().reads.get();
        let (st, repaired) = b.verify_and_replace_all(desired.clone()).expect("same");
        assert_eq!((st.puts, st.deletes, repaired), (0, 0, false));
        assert_eq!(b.maps().reads.get(), reads, "read back twice");
        // Later verifications read the maps (someone may have written
        // them), also after a sync that wrote nothing.
        b.verify_and_replace_all(desired.clone()).expect("again");
        assert!(b.maps().reads.get() > reads);
        let mut changed = desired;
        changed.insert(fe(1), svc(1, 2, None));
        let (mut c, _) = Syncer::adopt(b.maps().clone()).expect("adopt");
        c.apply([(fe(1), Some(svc(1, 2, None)))]).expect("write");
        let reads = c.maps().reads.get();
        c.verify_and_replace_all(changed.clone()).expect("verify");
        assert!(c.maps().reads.get() > reads, "a write since adoption");
        assert_eq!(view(c.maps()), expect_view(&changed));
    }

    #[test]
    fn restart_adopts_the_maps_and_writes_nothing_for_the_same_state() {
        let mut a = new_syncer();
        let desired: BTreeMap<_, _> = (0..50)
            .map(|i| (fe(i), svc(i, (i % 4) as u8, (i % 2 == 0).then_some(60))))
            .collect();
        a.replace_all(desired.clone()).expect("initial");
        a.apply([(fe(3), Some(svc(3, 1, None)))]).expect("flip one");
        let mut desired = desired;
        desired.insert(fe(3), svc(3, 1, None));
        let (mut b, st) = Syncer::adopt(a.maps().clone()).expect("adopt");
        assert_eq!(st.deletes, 0, "nothing to clean up");
        let st = b.replace_all(desired.clone()).expect("same state");
        assert_eq!((st.puts, st.deletes), (0, 0));
        // A change after adoption goes to the right generation.
        desired.insert(fe(3), svc(3, 3, None));
        b.apply([(fe(3), Some(svc(3, 3, None)))]).expect("change");
        assert_eq!(view(b.maps()), expect_view(&desired));
        // New services get ids that do not collide with adopted ones.
        desired.insert(fe(900), svc(900, 2, None));
        b.apply([(fe(900), Some(svc(900, 2, None)))]).expect("new");
        assert_eq!(view(b.maps()), expect_view(&desired));
    }

    #[test]
    fn adoption_removes_entries_no_service_reaches() {
        let mut a = new_syncer();
        a.apply([(fe(1), Some(svc(1, 2, None)))]).expect("initial");
        let mut maps = a.maps().clone();
        let id = a.service_id(&fe(1)).expect("id");
        // A slot beyond the active count, a slot and a member of an unknown
        // service, and a key of the wrong size.
        let beyond = backend_key(&BackendKey {
            svc_id: id,
            generation: 0,
            slot: 7,
        });
        let orphan = backend_key(&BackendKey {
            svc_id: id + 100,
            generation: 0,
            slot: 0,
        });
        maps.put(LbMap::Backends, &beyond, &layout::backend_value(be(1, 7)))
            .expect("put");
        maps.put(LbMap::Backends, &orphan, &layout::backend_value(be(1, 7)))
            .expect("put");
        maps.put(
            LbMap::Members,
            &layout::member_key(id + 100, be(1, 7)),
            &[1],
        )
        .expect("put");
        maps.put(LbMap::Services, &[1, 2, 3], &[0; 16])
            .expect("put");
        let (b, st) = Syncer::adopt(maps).expect("adopt");
        assert_eq!(st.deletes, 4);
        assert_eq!(
            view(b.maps()),
            expect_view(&[(fe(1), svc(1, 2, None))].into())
        );
        assert_eq!(b.maps().map(LbMap::Backends).len(), 2);
    }

    #[test]
    fn adoption_of_a_half_written_service_rewrites_it() {
        let mut a = new_syncer();
        a.apply([(fe(1), Some(svc(1, 3, None)))]).expect("initial");
        let id = a.service_id(&fe(1)).expect("id");
        let mut maps = a.maps().clone();
        maps.delete(
            LbMap::Backends,
            &backend_key(&BackendKey {
                svc_id: id,
                generation: 0,
                slot: 1,
            }),
        )
        .expect("delete");
        let (mut b, _) = Syncer::adopt(maps).expect("adopt");
        let st = b
            .replace_all([(fe(1), svc(1, 3, None))].into())
            .expect("apply");
        assert!(st.services_changed == 1 && st.puts >= 4);
        assert_eq!(
            view(b.maps()),
            expect_view(&[(fe(1), svc(1, 3, None))].into())
        );
    }

    #[test]
    fn failed_write_is_reported_and_the_next_apply_converges() {
        for fail_at in 0..12 {
            let mut maps = FakeMaps::default();
            maps.fail_at = Some(fail_at);
            let (mut s, _) = Syncer::adopt(maps).expect("adopt");
            let mut desired: BTreeMap<_, _> =
                [(fe(1), svc(1, 3, None)), (fe(2), svc(2, 2, None))].into();
            let first = s.replace_all(desired.clone());
            let failed = first.is_err();
            desired.insert(fe(2), svc(2, 3, Some(5)));
            s.apply([(fe(2), Some(svc(2, 3, Some(5))))])
                .expect("converges after the failure");
            assert_eq!(view(s.maps()), expect_view(&desired), "fail_at {fail_at}");
            // The first sync makes 12 writes, so every injected failure hits it.
            assert!(failed, "the injected failure {fail_at} was reported");
        }
    }

    #[test]
    fn endpoint_of_the_other_family_is_refused_and_others_still_written() {
        let mut s = new_syncer();
        let mut bad = svc(1, 1, None);
        bad.backends.push("[fd00::1]:80".parse().expect("addr"));
        let r = s.apply([(fe(1), Some(bad)), (fe(2), Some(svc(2, 1, None)))]);
        let errs = r.expect_err("family mismatch reported");
        assert_eq!(errs.0.len(), 1);
        assert!(errs.to_string().contains("ns/s1:http"), "{errs}");
        assert_eq!(
            view(s.maps()),
            expect_view(&[(fe(2), svc(2, 1, None))].into())
        );
    }

    #[test]
    fn needed_sizes_follow_the_desired_frontends_and_changes() {
        let mut s = new_syncer();
        s.apply((0..3).map(|i| (fe(i), Some(svc(i, 4, None)))))
            .expect("apply");
        assert_eq!(s.needed_after(&[]), MapSizes::for_counts(3, 12));
        // Grow one, remove one, add one (twice: the last change counts).
        let changes = vec![
            (fe(0), Some(svc(0, 10, None))),
            (fe(1), None),
            (fe(7), Some(svc(7, 2, None))),
            (fe(7), Some(svc(7, 3, None))),
        ];
        let need = s.needed_after(&changes);
        s.apply(changes).expect("apply");
        assert_eq!(need, MapSizes::for_counts(3, 10 + 4 + 3));
        assert_eq!(s.needed_after(&[]), need, "the running sum agrees");
        assert_eq!(need, MapSizes::needed(s.desired()));
    }

    #[test]
    fn rebuilt_maps_keep_each_frontends_id() {
        let mut old = new_syncer();
        old.apply((1..=3).map(|i| (fe(i), Some(svc(i, 2, None)))))
            .expect("apply");
        old.apply([(fe(2), None)]).expect("remove");
        let ids = |s: &Syncer<FakeMaps>| -> BTreeMap<Frontend, u32> {
            s.written.iter().map(|(f, w)| (*f, w.id)).collect()
        };
        let before = ids(&old);
        let mut desired = old.desired().clone();
        desired.insert(fe(9), svc(9, 1, None));
        let mut new = new_syncer();
        new.keep_ids_of(&old, &desired);
        new.replace_all(desired).expect("fill");
        let after = ids(&new);
        assert_eq!(after[&fe(1)], before[&fe(1)]);
        assert_eq!(after[&fe(3)], before[&fe(3)]);
        assert!(
            after[&fe(9)] > before[&fe(3)],
            "a new frontend gets an id after every old one (2's included): {after:?}"
        );
    }

    #[test]
    fn a_full_map_is_reported_as_such() {
        let mut maps = FakeMaps::default();
        maps.capacity.insert(LbMap::Backends, 4);
        let (mut s, _) = Syncer::adopt(maps).expect("adopt");
        s.apply([(fe(1), Some(svc(1, 3, None)))]).expect("fits");
        let e = s
            .apply([(fe(2), Some(svc(2, 3, None)))])
            .expect_err("no room for three more slots");
        assert!(e.map_full(), "{e}");
        assert!(!SyncErrors(vec![SyncError::Resize("x".into())]).map_full());
    }
}

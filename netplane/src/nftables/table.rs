//! What keelson last wrote into one of its tables, and the planning of the
//! operations that turn it into a new desired state. Nothing here talks to
//! the kernel: the backend sends the planned ops as one batch and, only if
//! the kernel accepted them, commits the plan into this record.
//!
//! The record is small: per service port the model state it was rendered
//! from (shared with the change tracker, not copied) and its port id; per
//! element that several ports may claim, the claiming ports. Renderings
//! are recomputed when a port changes (the old one from the recorded
//! state), never stored.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::config::NftablesConfig;
use super::layout::{FixedLayout, NODEPORT_IPS, creation_order};
use super::objects::{ChainDef, Element, Op, SetDef, TableId};
use super::render::{
    ElementSet, KeyedList, ListKind, PortSlots, RenderedPort, list_slot_key,
    parse_shared_chain_name, render_port, shared_chain, slot_needs,
};
use super::slots::{SlotBlock, SlotSpace};
use crate::model::{ServicePortKey, ServicePortState};

/// How long a chain that lost its last reference stays (flushed) before it
/// is deleted: kernels before 6.2 notice a dropped map reference only a
/// moment after the transaction (kube-proxy waits one second too).
pub const STALE_CHAIN_DELAY: Duration = Duration::from_secs(1);

/// Something several service ports may claim: an element (its set and
/// key), or an address / NodePort key served by an endpoint list. The
/// first claimant (in key order) has it in the kernel; the next one takes
/// over when it goes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Claim {
    Element(ElementSet, Box<[u8]>),
    List(ListKind, Box<[u8]>),
}

/// What a claim is when a port has it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Claimed {
    Element(Element),
    List(KeyedList),
}

fn claims(r: &RenderedPort) -> impl Iterator<Item = Claim> + '_ {
    let elements = r
        .elements
        .iter()
        .filter(|(s, _)| s.is_shared())
        .map(|(s, e)| Claim::Element(*s, e.key.clone().into_boxed_slice()));
    let lists = r
        .lists
        .iter()
        .map(|l| Claim::List(l.kind, l.key.clone().into_boxed_slice()));
    elements.chain(lists)
}

fn claimed(r: &RenderedPort, claim: &Claim) -> Option<Claimed> {
    match claim {
        Claim::Element(set, key) => find_element(r, *set, key).cloned().map(Claimed::Element),
        Claim::List(kind, key) => r
            .lists
            .iter()
            .find(|l| l.kind == *kind && *l.key == **key)
            .cloned()
            .map(Claimed::List),
    }
}

/// One programmed service port.
#[derive(Debug, Clone)]
struct PortEntry {
    state: Arc<ServicePortState>,
    slots: PortSlots,
    /// Chains and sets the port has in the table (for verification).
    objects: u32,
}

fn objects_of(r: &RenderedPort) -> u32 {
    (r.chains.len() + r.affinity_sets.len()) as u32
}

/// An element value as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelValue {
    /// A set element.
    None,
    /// A verdict map element: verdict code and chain.
    Verdict(i32, Option<String>),
    /// A data map element.
    Data(Vec<u8>),
}

impl KernelValue {
    /// Whether the kernel's value is `el`'s (without building one: a
    /// full sync compares every element of the table).
    fn is_of(&self, el: &Element) -> bool {
        match (&el.verdict, &el.data, self) {
            (Some(v), _, KernelValue::Verdict(code, chain)) => {
                *code == v.code() && chain.as_deref() == v.chain()
            }
            (None, Some(d), KernelValue::Data(k)) => d == k,
            (None, None, KernelValue::None) => true,
            _ => false,
        }
    }
}

/// What the kernel holds in a table, as far as a full sync compares it:
/// chains with the fingerprints of their rules, set names, and (on request)
/// the elements of a set.
#[derive(Debug, Default)]
pub struct KernelTable {
    /// Chains by name: the fingerprint of each rule (None: not keelson's).
    pub chains: HashMap<String, Vec<Option<u64>>>,
    /// The slot block named by a chain's rules (keelson's userdata).
    pub chain_slots: HashMap<String, SlotBlock>,
    /// Sets and maps.
    pub sets: BTreeSet<String>,
}

/// The hasher of the maps a full sync builds over every element of the
/// table (~120,000 at 10,000 Services × 10 endpoints): std's SipHash was
/// a tenth of a restart's CPU time. Randomly seeded per process.
pub type FastHash = foldhash::fast::RandomState;

/// Elements as read from the kernel: key bytes -> value.
pub type KernelElements = HashMap<Vec<u8>, KernelValue, FastHash>;

/// Desired elements of one set, sorted by key, one per key (of elements
/// given with the same key the last one). A sorted Vec, not a map by
/// key: at a cold start every element of the table is desired, and maps
/// of them (a second copy of each key, spare capacity, the copies made
/// while growing) were most of a full sync's heap peak (issue 20).
#[derive(Debug, Default)]
struct DesiredElements(Vec<Element>);

impl DesiredElements {
    fn new(mut elements: Vec<Element>) -> Self {
        // Reversed, so the stable sort puts the last given of a key first
        // and `dedup_by` keeps it.
        elements.reverse();
        elements.sort_by(|a, b| a.key.cmp(&b.key));
        elements.dedup_by(|later, kept| later.key == kept.key);
        DesiredElements(elements)
    }

    fn get(&self, key: &[u8]) -> Option<&Element> {
        self.0
            .binary_search_by(|e| e.key.as_slice().cmp(key))
            .ok()
            .map(|i| &self.0[i])
    }

    fn contains_key(&self, key: &[u8]) -> bool {
        self.get(key).is_some()
    }

    fn keys(&self) -> impl Iterator<Item = &[u8]> {
        self.0.iter().map(|e| e.key.as_slice())
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Reads the elements of a set from the kernel: all of them, or those of
/// the given keys (absent ones are left out). `None`: cannot tell; the set
/// is then flushed and refilled.
pub type ElementReader<'a> = dyn FnMut(&str, Option<&[&[u8]]>) -> Option<KernelElements> + 'a;

/// What a full sync plans against (see [`FamilyTable::plan_full`]).
#[derive(Debug, Clone, Copy)]
pub struct FullSyncInput<'a> {
    /// The backend's configuration.
    pub config: &'a NftablesConfig,
    /// The table's comment.
    pub table_comment: &'a str,
    /// The fixed layout to have.
    pub fixed: &'a FixedLayout,
    /// What the kernel holds.
    pub kernel: &'a KernelTable,
    /// Re-create the base chains (first sync of a process).
    pub reset_base_chains: bool,
}

/// The record of one family's table.
#[derive(Debug)]
pub struct FamilyTable {
    id: TableId,
    fixed: Option<FixedLayout>,
    ports: HashMap<ServicePortKey, PortEntry>,
    owners: HashMap<Claim, Vec<ServicePortKey>>,
    /// Keys in the kernel per count value (their shared chain exists while
    /// some key has the value).
    shared: HashMap<u32, u32>,
    space: SlotSpace,
    stale_chains: HashMap<String, Instant>,
}

/// Every slot number is taken: the table cannot hold more endpoints.
#[derive(Debug, thiserror::Error)]
#[error("no free endpoint slots for {0} endpoints")]
pub struct SlotsExhausted(pub usize);

/// A planned change: the ops to send and what to record once they applied.
#[derive(Debug, Default)]
pub struct Plan {
    /// Operations, in sending order.
    pub ops: Vec<Op>,
    fixed: Option<FixedLayout>,
    ports: Vec<(ServicePortKey, Option<PortEntry>)>,
    owners: Vec<(Claim, Vec<ServicePortKey>)>,
    shared: Vec<(u32, u32)>,
    space: Option<SlotSpace>,
    freed: Vec<SlotBlock>,
    revived: Vec<String>,
    newly_stale: Vec<String>,
    deleted_stale: Vec<String>,
    full: bool,
}

#[derive(Default)]
struct Groups {
    add_sets: Vec<Op>,
    add_chains: Vec<Op>,
    del_elements: BTreeMap<&'static str, Vec<Vec<u8>>>,
    flush_chains: Vec<Op>,
    /// Affinity sets whose definition changed: deleted once the chains
    /// naming them are flushed, re-created before the rules name them.
    recreate_sets: Vec<Op>,
    rules: Vec<Op>,
    add_elements: BTreeMap<&'static str, Vec<Element>>,
    del_sets: Vec<Op>,
    del_chains: Vec<Op>,
}

impl Groups {
    fn into_ops(self, table: TableId, head: Vec<Op>) -> Vec<Op> {
        let mut ops = head;
        ops.extend(self.add_sets);
        ops.extend(self.add_chains);
        for (set, keys) in self.del_elements {
            ops.push(Op::DelElements {
                table,
                set: set.into(),
                keys,
            });
        }
        ops.extend(self.flush_chains);
        ops.extend(self.recreate_sets);
        ops.extend(self.rules);
        for (set, elements) in self.add_elements {
            ops.push(Op::AddElements {
                table,
                set: set.into(),
                elements,
            });
        }
        ops.extend(self.del_sets);
        ops.extend(self.del_chains);
        ops
    }

    /// Adds `elements` to set `name` (moved, not copied, when the set has
    /// none yet).
    fn add_all(&mut self, name: &'static str, elements: Vec<Element>) {
        if elements.is_empty() {
            return;
        }
        match self.add_elements.entry(name) {
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(elements);
            }
            std::collections::btree_map::Entry::Occupied(mut o) => o.get_mut().extend(elements),
        }
    }

    fn write_rules(&mut self, table: TableId, chain: &ChainDef) {
        for rule in &chain.rules {
            self.rules.push(Op::AddRule {
                table,
                chain: chain.name.clone(),
                rule: rule.clone(),
            });
        }
    }

    fn replace_element(
        &mut self,
        set: ElementSet,
        before: Option<&Element>,
        after: Option<&Element>,
    ) {
        if before == after {
            return;
        }
        if let Some(b) = before {
            self.del_elements
                .entry(set.name())
                .or_default()
                .push(b.key.clone());
        }
        if let Some(a) = after {
            self.add_elements
                .entry(set.name())
                .or_default()
                .push(a.clone());
        }
    }
}

impl Groups {
    /// The elements of an endpoint-list key going from `before` to `after`.
    fn replace_list(&mut self, before: Option<&KeyedList>, after: Option<&KeyedList>) {
        let Some(kind) = before.or(after).map(|l| l.kind) else {
            return;
        };
        let (dispatch, endpoints) = kind.sets();
        let d = |l: Option<&KeyedList>| l.map(KeyedList::dispatch_element);
        self.replace_element(dispatch, d(before).as_ref(), d(after).as_ref());
        let s = |l: Option<&KeyedList>| l.map(KeyedList::digest_element);
        self.replace_element(kind.digests(), s(before).as_ref(), s(after).as_ref());
        let n = before
            .map_or(0, |l| l.endpoints.len())
            .max(after.map_or(0, |l| l.endpoints.len()));
        for i in 0..n {
            let b = before.and_then(|l| l.endpoint_element(i));
            let a = after.and_then(|l| l.endpoint_element(i));
            self.replace_element(endpoints, b.as_ref(), a.as_ref());
        }
    }
}

fn nodeport_set_name(set: &SetDef) -> bool {
    set.name == NODEPORT_IPS
}

fn find_element<'a>(r: &'a RenderedPort, set: ElementSet, key: &[u8]) -> Option<&'a Element> {
    r.elements
        .iter()
        .find(|(s, e)| *s == set && e.key == key)
        .map(|(_, e)| e)
}

/// Endpoint lists whose slots a full sync reads back although their
/// dispatch element and digest match (a sample, from a random start): if
/// one of them differs from its digest, the kernel's lists were changed
/// behind keelson's back and every list is read.
pub const DIGEST_SAMPLE: usize = 128;

/// Whether the kernel's slots of a sample of the `trusted` lists are what
/// their digests say (see [`DIGEST_SAMPLE`]); `false` when unreadable.
fn digests_hold(lists: &[KeyedList], trusted: &[bool], elements: &mut ElementReader<'_>) -> bool {
    use std::hash::{BuildHasher, Hasher};
    let candidates: Vec<&KeyedList> = lists
        .iter()
        .zip(trusted)
        .filter(|(_, t)| **t)
        .map(|(l, _)| l)
        .collect();
    if candidates.is_empty() {
        return true;
    }
    let start = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish() as usize
        % candidates.len();
    let sample: Vec<&KeyedList> = (0..candidates.len().min(DIGEST_SAMPLE))
        .map(|j| candidates[(start + j) % candidates.len()])
        .collect();
    ListKind::ALL.into_iter().all(|kind| {
        let picked: Vec<&KeyedList> = sample.iter().copied().filter(|l| l.kind == kind).collect();
        if picked.is_empty() {
            return true;
        }
        let keys: Vec<Vec<u8>> = picked
            .iter()
            .flat_map(|l| (0..l.endpoints.len()).map(|i| l.slot_key(i)))
            .collect();
        let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        elements(kind.sets().1.name(), Some(&refs)).is_some_and(|have| {
            picked.iter().all(|l| {
                l.endpoints.iter().enumerate().all(|(i, ep)| {
                    matches!(have.get(&l.slot_key(i)), Some(KernelValue::Data(d)) if d == ep)
                })
            })
        })
    })
}

/// Deletes what the kernel's `have` holds beyond `want`, adds what it
/// lacks (an element whose value differs is deleted and added).
fn diff_elements(name: &'static str, want: DesiredElements, have: &KernelElements, g: &mut Groups) {
    for (k, v) in have {
        match want.get(k) {
            Some(el) if v.is_of(el) => {}
            _ => g.del_elements.entry(name).or_default().push(k.clone()),
        }
    }
    let mut add = want.0;
    add.retain(|el| !have.get(&el.key).is_some_and(|v| v.is_of(el)));
    g.add_all(name, add);
}

/// Flushes a set that could not be read and fills it with `want`.
fn rewrite_set(
    table: TableId,
    name: &'static str,
    want: DesiredElements,
    head: &mut Vec<Op>,
    g: &mut Groups,
) {
    head.push(Op::FlushSet {
        table,
        name: name.into(),
    });
    g.add_all(name, want.0);
}

fn unique_elements(r: &RenderedPort) -> HashMap<(ElementSet, &[u8]), &Element> {
    r.elements
        .iter()
        .filter(|(s, _)| !s.is_shared())
        .map(|(s, e)| ((*s, e.key.as_slice()), e))
        .collect()
}

impl FamilyTable {
    /// An empty record (nothing written yet).
    pub fn new(id: TableId) -> Self {
        FamilyTable {
            id,
            fixed: None,
            ports: HashMap::new(),
            owners: HashMap::new(),
            shared: HashMap::new(),
            space: SlotSpace::default(),
            stale_chains: HashMap::new(),
        }
    }

    /// Which table.
    pub fn id(&self) -> TableId {
        self.id
    }

    /// Whether anything was written (a full sync happened).
    pub fn initialized(&self) -> bool {
        self.fixed.is_some()
    }

    /// The state a service port was last programmed from.
    pub fn state(&self, key: &ServicePortKey) -> Option<&Arc<ServicePortState>> {
        self.ports.get(key).map(|p| &p.state)
    }

    /// The slot blocks of a programmed service port.
    pub fn slots(&self, key: &ServicePortKey) -> Option<PortSlots> {
        self.ports.get(key).map(|p| p.slots)
    }

    /// The rendering of a programmed service port, as written.
    pub fn rendered(&self, key: &ServicePortKey, config: &NftablesConfig) -> Option<RenderedPort> {
        self.ports
            .get(key)
            .map(|p| render_port(&p.state, config, &p.slots))
    }

    /// Keys of the service ports written.
    pub fn port_keys(&self) -> impl Iterator<Item = &ServicePortKey> {
        self.ports.keys()
    }

    /// Number of service ports written.
    pub fn port_count(&self) -> usize {
        self.ports.len()
    }

    /// Number of chains and sets keelson has in the table (what the
    /// kernel's table `use` count should be).
    pub fn expected_object_count(&self) -> usize {
        let fixed = self
            .fixed
            .as_ref()
            .map(|f| f.chains.len() + f.sets.len())
            .unwrap_or(0);
        let ports: usize = self.ports.values().map(|p| p.objects as usize).sum();
        fixed + ports + self.shared.len() + self.stale_chains.len()
    }

    /// The shared chains written (count value -> keys using it).
    pub fn shared_chains(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.shared.iter().map(|(v, n)| (*v, *n))
    }

    /// The fixed chains written, with their rule counts (for verification).
    pub fn fixed_rule_counts(&self) -> Vec<(String, usize)> {
        self.fixed
            .iter()
            .flat_map(|f| f.chains.iter())
            .map(|c| (c.name.clone(), c.rules.len()))
            .collect()
    }

    /// Stale chains waiting for deletion.
    pub fn stale_chain_count(&self) -> usize {
        self.stale_chains.len()
    }

    /// What of `claim` is in the kernel: the first claimant's (ports
    /// ordered by key); `renders` caches renderings.
    fn effective(
        &self,
        owners: &[ServicePortKey],
        claim: &Claim,
        renders: &mut HashMap<ServicePortKey, RenderedPort>,
        config: &NftablesConfig,
    ) -> Option<Claimed> {
        let first = owners.first()?;
        if !renders.contains_key(first) {
            let r = self.rendered(first, config)?;
            renders.insert(first.clone(), r);
        }
        renders.get(first).and_then(|r| claimed(r, claim))
    }

    /// Plans an incremental change: `fixed` is the fixed layout to have (it
    /// is compared with what was written), `changes` the service ports to
    /// set (`None`: remove).
    pub fn plan_incremental(
        &self,
        config: &NftablesConfig,
        fixed: &FixedLayout,
        changes: Vec<(ServicePortKey, Option<Arc<ServicePortState>>)>,
    ) -> Result<Plan, SlotsExhausted> {
        let table = self.id;
        let mut g = Groups::default();
        let mut plan = Plan::default();
        let mut space = self.space.clone();

        if self.fixed.as_ref() != Some(fixed) {
            self.plan_fixed_change(fixed, &mut g);
            plan.fixed = Some(fixed.clone());
        }

        let mut old_renders: HashMap<ServicePortKey, RenderedPort> = HashMap::new();
        let mut new_renders: HashMap<ServicePortKey, RenderedPort> = HashMap::new();
        let mut owner_updates: HashMap<Claim, BTreeMap<ServicePortKey, bool>> = HashMap::new();
        let mut revived = BTreeSet::new();
        let mut newly_stale = BTreeSet::new();
        let empty = RenderedPort::default();
        for (key, new_state) in changes {
            let old = self.ports.get(&key);
            let old_slots = old.map(|o| o.slots).unwrap_or_default();
            let needs = new_state.as_deref().map(slot_needs).unwrap_or([None, None]);
            let mut blocks = [None, None];
            for (i, (have, need)) in old_slots.blocks().into_iter().zip(needs).enumerate() {
                blocks[i] = match (have, need) {
                    (Some(b), Some(n)) if b.fits(n) => Some(b),
                    (have, Some(n)) => {
                        plan.freed.extend(have);
                        Some(space.alloc(n).ok_or(SlotsExhausted(n))?)
                    }
                    (have, None) => {
                        plan.freed.extend(have);
                        None
                    }
                };
            }
            let slots = PortSlots {
                cluster: blocks[0],
                local: blocks[1],
            };
            let old_r = old.map(|o| render_port(&o.state, config, &o.slots));
            let new_r = new_state.as_deref().map(|s| render_port(s, config, &slots));
            {
                let old_r = old_r.as_ref().unwrap_or(&empty);
                let new_r = new_r.as_ref().unwrap_or(&empty);
                self.plan_port_objects(old_r, new_r, &mut g, &mut revived, &mut newly_stale);
                // Slot elements are the port's own.
                let old_u = unique_elements(old_r);
                let new_u = unique_elements(new_r);
                for ((set, k), el) in &old_u {
                    match new_u.get(&(*set, *k)) {
                        Some(n) if n == el => {}
                        Some(n) => g.replace_element(*set, Some(el), Some(n)),
                        None => g.replace_element(*set, Some(el), None),
                    }
                }
                for ((set, k), el) in &new_u {
                    if !old_u.contains_key(&(*set, *k)) {
                        g.replace_element(*set, None, Some(el));
                    }
                }
                for claim in claims(old_r) {
                    owner_updates
                        .entry(claim)
                        .or_default()
                        .insert(key.clone(), false);
                }
                for claim in claims(new_r) {
                    owner_updates
                        .entry(claim)
                        .or_default()
                        .insert(key.clone(), true);
                }
            }
            let objects = new_r.as_ref().map_or(0, objects_of);
            if let Some(r) = old_r {
                old_renders.insert(key.clone(), r);
            }
            if let Some(r) = new_r {
                new_renders.insert(key.clone(), r);
            }
            plan.ports.push((
                key,
                new_state.map(|state| PortEntry {
                    state,
                    slots,
                    objects,
                }),
            ));
        }

        // Claims: the first claiming port's element or list is in the kernel.
        let mut renders_before = old_renders;
        let mut renders_after = new_renders;
        let removed: BTreeSet<&ServicePortKey> = plan
            .ports
            .iter()
            .filter(|(_, e)| e.is_none())
            .map(|(k, _)| k)
            .collect();
        let mut shared_delta: BTreeMap<u32, i64> = BTreeMap::new();
        let mut owner_changes = Vec::new();
        for (claim, updates) in owner_updates {
            let owners_before: Vec<ServicePortKey> =
                self.owners.get(&claim).cloned().unwrap_or_default();
            let mut after: BTreeSet<ServicePortKey> = owners_before.iter().cloned().collect();
            for (owner, claims) in updates {
                if claims {
                    after.insert(owner);
                } else {
                    after.remove(&owner);
                }
            }
            let owners_after: Vec<ServicePortKey> = after.into_iter().collect();
            let before = self.effective(&owners_before, &claim, &mut renders_before, config);
            // After the change, ports not in this plan render as before.
            let after_value = match owners_after.first() {
                Some(first) if renders_after.contains_key(first) => {
                    renders_after.get(first).and_then(|r| claimed(r, &claim))
                }
                Some(first) if removed.contains(first) => None,
                Some(_) => self.effective(&owners_after, &claim, &mut renders_after, config),
                None => None,
            };
            match (&claim, &before, &after_value) {
                (Claim::Element(set, _), b, a) => {
                    let el = |c: &Option<Claimed>| match c {
                        Some(Claimed::Element(e)) => Some(e.clone()),
                        _ => None,
                    };
                    g.replace_element(*set, el(b).as_ref(), el(a).as_ref());
                }
                (Claim::List(..), b, a) => {
                    let list = |c: &Option<Claimed>| match c {
                        Some(Claimed::List(l)) => Some(l.clone()),
                        _ => None,
                    };
                    let (b, a) = (list(b), list(a));
                    if let Some(l) = &b {
                        *shared_delta.entry(l.value).or_default() -= 1;
                    }
                    if let Some(l) = &a {
                        *shared_delta.entry(l.value).or_default() += 1;
                    }
                    g.replace_list(b.as_ref(), a.as_ref());
                }
            }
            owner_changes.push((claim, owners_after));
        }
        plan.owners = owner_changes;

        // Shared chains: created with the first key of their count,
        // removed (flushed, deleted later) with the last.
        for (value, delta) in shared_delta {
            if delta == 0 {
                continue;
            }
            let had = i64::from(self.shared.get(&value).copied().unwrap_or(0));
            let has = (had + delta).max(0);
            if had == 0 && has > 0 {
                let chain = shared_chain(value, table.family, config);
                if self.stale_chains.contains_key(&chain.name) {
                    revived.insert(chain.name.clone());
                } else {
                    g.add_chains.push(Op::AddChain {
                        table,
                        name: chain.name.clone(),
                        base: None,
                        comment: None,
                    });
                }
                g.write_rules(table, &chain);
            } else if had > 0 && has == 0 {
                let name = super::render::shared_chain_name(value);
                g.flush_chains.push(Op::FlushChain {
                    table,
                    name: name.clone(),
                });
                newly_stale.insert(name);
            }
            plan.shared
                .push((value, u32::try_from(has).unwrap_or(u32::MAX)));
        }

        plan.ops = g.into_ops(table, Vec::new());
        plan.revived = revived.into_iter().collect();
        plan.newly_stale = newly_stale.into_iter().collect();
        plan.space = Some(space);
        Ok(plan)
    }

    fn plan_fixed_change(&self, fixed: &FixedLayout, g: &mut Groups) {
        let table = self.id;
        let old = self.fixed.as_ref();
        let old_sets: BTreeMap<&str, &SetDef> = old
            .iter()
            .flat_map(|f| f.sets.iter())
            .map(|s| (s.name.as_str(), s))
            .collect();
        for set in &fixed.sets {
            if !old_sets.contains_key(set.name.as_str()) {
                g.add_sets.push(Op::AddSet {
                    table,
                    set: set.clone(),
                });
            }
        }
        for set in old.iter().flat_map(|f| f.sets.iter()) {
            if !fixed.sets.iter().any(|s| s.name == set.name) {
                g.del_sets.push(Op::DelSet {
                    table,
                    name: set.name.clone(),
                });
            }
        }
        let old_chains: BTreeMap<&str, &ChainDef> = old
            .iter()
            .flat_map(|f| f.chains.iter())
            .map(|c| (c.name.as_str(), c))
            .collect();
        for chain in creation_order(&fixed.chains) {
            match old_chains.get(chain.name.as_str()) {
                Some(o) if *o == chain => {}
                Some(_) => {
                    g.flush_chains.push(Op::FlushChain {
                        table,
                        name: chain.name.clone(),
                    });
                    g.write_rules(table, chain);
                }
                None => {
                    g.add_chains.push(Op::AddChain {
                        table,
                        name: chain.name.clone(),
                        base: chain.base,
                        comment: chain.comment.clone(),
                    });
                    g.write_rules(table, chain);
                }
            }
        }
        let old_np: BTreeSet<&Vec<u8>> = old
            .iter()
            .flat_map(|f| f.nodeport_ips.iter())
            .map(|e| &e.key)
            .collect();
        let new_np: BTreeSet<&Vec<u8>> = fixed.nodeport_ips.iter().map(|e| &e.key).collect();
        let exists_after = fixed.sets.iter().any(nodeport_set_name);
        let existed = old.is_some_and(|f| f.sets.iter().any(nodeport_set_name));
        if existed && exists_after {
            let gone: Vec<Vec<u8>> = old_np.difference(&new_np).map(|k| (*k).clone()).collect();
            if !gone.is_empty() {
                g.del_elements.entry(NODEPORT_IPS).or_default().extend(gone);
            }
        }
        if exists_after {
            let added: Vec<Element> = fixed
                .nodeport_ips
                .iter()
                .filter(|e| !existed || !old_np.contains(&e.key))
                .cloned()
                .collect();
            if !added.is_empty() {
                g.add_elements
                    .entry(NODEPORT_IPS)
                    .or_default()
                    .extend(added);
            }
        }
    }

    /// Chains and affinity sets of one port: old rendering -> new one.
    fn plan_port_objects(
        &self,
        old_r: &RenderedPort,
        new_r: &RenderedPort,
        g: &mut Groups,
        revived: &mut BTreeSet<String>,
        newly_stale: &mut BTreeSet<String>,
    ) {
        let table = self.id;
        let old_sets: BTreeMap<&str, &SetDef> = old_r
            .affinity_sets
            .iter()
            .map(|s| (s.name.as_str(), s))
            .collect();
        let new_sets: BTreeMap<&str, &SetDef> = new_r
            .affinity_sets
            .iter()
            .map(|s| (s.name.as_str(), s))
            .collect();
        // A changed affinity timeout means the set is recreated; every
        // chain of the port is rewritten so no rule keeps it busy.
        let set_redefined = new_sets
            .iter()
            .any(|(n, s)| old_sets.get(n).is_some_and(|o| o != s));
        for (name, set) in &new_sets {
            match old_sets.get(name) {
                None => g.add_sets.push(Op::AddSet {
                    table,
                    set: (*set).clone(),
                }),
                Some(o) if o != set => {
                    g.recreate_sets.push(Op::DelSet {
                        table,
                        name: (*name).to_string(),
                    });
                    g.recreate_sets.push(Op::AddSet {
                        table,
                        set: (*set).clone(),
                    });
                }
                Some(_) => {}
            }
        }
        for name in old_sets.keys() {
            if !new_sets.contains_key(name) {
                g.del_sets.push(Op::DelSet {
                    table,
                    name: (*name).to_string(),
                });
            }
        }
        let old_chains: BTreeMap<&str, &ChainDef> =
            old_r.chains.iter().map(|c| (c.name.as_str(), c)).collect();
        for chain in &new_r.chains {
            match old_chains.get(chain.name.as_str()) {
                Some(o) if *o == chain && !set_redefined => {}
                Some(_) => {
                    g.flush_chains.push(Op::FlushChain {
                        table,
                        name: chain.name.clone(),
                    });
                    g.write_rules(table, chain);
                }
                None => {
                    if self.stale_chains.contains_key(&chain.name)
                        || newly_stale.remove(&chain.name)
                    {
                        // Still in the kernel (flushed): reuse it.
                        revived.insert(chain.name.clone());
                    } else {
                        g.add_chains.push(Op::AddChain {
                            table,
                            name: chain.name.clone(),
                            base: None,
                            comment: chain.comment.clone(),
                        });
                    }
                    g.write_rules(table, chain);
                }
            }
        }
        for chain in &old_r.chains {
            if !new_r.chains.iter().any(|c| c.name == chain.name) {
                g.flush_chains.push(Op::FlushChain {
                    table,
                    name: chain.name.clone(),
                });
                if !revived.contains(&chain.name) {
                    newly_stale.insert(chain.name.clone());
                }
            }
        }
    }

    /// Plans the deletion of chains flushed at least [`STALE_CHAIN_DELAY`]
    /// ago (sent as a transaction of its own, like kube-proxy: a chain that
    /// cannot be deleted, e.g. because someone else jumps to it, must not
    /// block Service updates).
    pub fn plan_stale_deletion(&self, now: Instant) -> Option<Plan> {
        let table = self.id;
        let mut plan = Plan::default();
        for (name, since) in &self.stale_chains {
            if now.duration_since(*since) >= STALE_CHAIN_DELAY {
                plan.ops.push(Op::DelChain {
                    table,
                    name: name.clone(),
                });
                plan.deleted_stale.push(name.clone());
            }
        }
        (!plan.ops.is_empty()).then_some(plan)
    }

    /// Plans a full sync to `desired` (start, repair), against what the
    /// kernel holds (`kernel`; empty when the table was just deleted):
    /// chains whose rules carry the fingerprints of the desired ones are
    /// left alone, others created or flushed and refilled; elements are
    /// compared with the kernel's (`elements` reads a set) and only the
    /// differences written; affinity sets are kept (their entries are live
    /// client state); chains not desired are flushed and marked stale, sets
    /// not desired deleted. Port ids found in the kernel are kept, so an
    /// unchanged table needs no write at all. `reset_base_chains`
    /// re-creates the base chains (first sync of a process, like
    /// kube-proxy). One atomic batch: traffic sees the old or the new
    /// table, never a mix or a gap.
    pub fn plan_full(
        &self,
        input: FullSyncInput<'_>,
        desired: Vec<(ServicePortKey, Arc<ServicePortState>)>,
        elements: &mut ElementReader<'_>,
    ) -> Result<Plan, SlotsExhausted> {
        let FullSyncInput {
            config,
            table_comment,
            fixed,
            kernel,
            reset_base_chains,
        } = input;
        let table = self.id;
        let mut head = vec![Op::AddTable {
            table,
            comment: table_comment.into(),
        }];
        let mut g = Groups::default();
        if reset_base_chains {
            for chain in fixed.chains.iter().filter(|c| c.base.is_some()) {
                head.push(Op::AddChain {
                    table,
                    name: chain.name.clone(),
                    base: None,
                    comment: None,
                });
                head.push(Op::DelChain {
                    table,
                    name: chain.name.clone(),
                });
            }
        }
        for set in &fixed.sets {
            head.push(Op::AddSet {
                table,
                set: set.clone(),
            });
        }

        // Slot blocks: the kernel's where its chains name one that still
        // fits and overlaps no other, else new ones.
        let mut taken: BTreeMap<u32, SlotBlock> = BTreeMap::new();
        let overlaps = |taken: &BTreeMap<u32, SlotBlock>, b: SlotBlock| {
            taken
                .range(..=b.base)
                .next_back()
                .is_some_and(|(_, t)| t.overlaps(b))
                || taken
                    .range(b.base..)
                    .next()
                    .is_some_and(|(_, t)| t.overlaps(b))
        };
        let mut chosen: Vec<[Option<SlotBlock>; 2]> = Vec::with_capacity(desired.len());
        for (key, state) in &desired {
            let names = super::names::PortChains::new(&key.name);
            let needs = slot_needs(state);
            let mut blocks = [None, None];
            for (i, chain) in [&names.service, &names.local].into_iter().enumerate() {
                let (Some(n), Some(b)) = (needs[i], kernel.chain_slots.get(chain.as_str())) else {
                    continue;
                };
                if b.fits(n) && !overlaps(&taken, *b) {
                    taken.insert(b.base, *b);
                    blocks[i] = Some(*b);
                }
            }
            chosen.push(blocks);
        }
        let mut space = SlotSpace::with_used(taken.values().copied());
        let mut entries: Vec<(ServicePortKey, PortEntry)> = Vec::with_capacity(desired.len());
        for ((key, state), mut blocks) in desired.into_iter().zip(chosen) {
            let needs = slot_needs(&state);
            for (i, need) in needs.into_iter().enumerate() {
                if let (None, Some(n)) = (blocks[i], need) {
                    blocks[i] = Some(space.alloc(n).ok_or(SlotsExhausted(n))?);
                }
            }
            entries.push((
                key,
                PortEntry {
                    state,
                    slots: PortSlots {
                        cluster: blocks[0],
                        local: blocks[1],
                    },
                    objects: 0,
                },
            ));
        }

        // Chains.
        let mut desired_chains: BTreeSet<String> = BTreeSet::new();
        let mut desired_sets: BTreeSet<String> =
            fixed.sets.iter().map(|s| s.name.clone()).collect();
        let mut by_set: BTreeMap<ElementSet, Vec<Element>> = BTreeMap::new();
        let mut owners: HashMap<Claim, Vec<ServicePortKey>, FastHash> = HashMap::default();
        let mut shared: HashMap<u32, u32> = HashMap::new();
        // The endpoint lists in the kernel (first claimants): their slots
        // are compared only when the kernel's dispatch element or digest
        // says they may differ.
        let mut lists: Vec<KeyedList> = Vec::new();
        let mut write_chain = |chain: &ChainDef, g: &mut Groups| {
            desired_chains.insert(chain.name.clone());
            let in_kernel = kernel.chains.get(&chain.name);
            let base_reset = reset_base_chains && chain.base.is_some();
            let same = !base_reset
                && in_kernel.is_some_and(|fps| {
                    fps.len() == chain.rules.len()
                        && fps
                            .iter()
                            .zip(&chain.rules)
                            .all(|(fp, r)| *fp == Some(r.fingerprint()))
                });
            if same {
                return;
            }
            g.add_chains.push(Op::AddChain {
                table,
                name: chain.name.clone(),
                base: chain.base,
                comment: chain.comment.clone(),
            });
            if in_kernel.is_some() && !base_reset {
                g.add_chains.push(Op::FlushChain {
                    table,
                    name: chain.name.clone(),
                });
            }
            g.write_rules(table, chain);
        };
        for chain in creation_order(&fixed.chains) {
            write_chain(chain, &mut g);
        }
        // Ports in key order, so the first claimant of a shared element is
        // the same as in incremental syncs.
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        for (key, entry) in &mut entries {
            let r = render_port(&entry.state, config, &entry.slots);
            entry.objects = objects_of(&r);
            for chain in &r.chains {
                write_chain(chain, &mut g);
            }
            for set in &r.affinity_sets {
                desired_sets.insert(set.name.clone());
                if !kernel.sets.contains(&set.name) {
                    g.add_sets.push(Op::AddSet {
                        table,
                        set: set.clone(),
                    });
                }
            }
            for (set, el) in r.elements {
                if set.is_shared() {
                    let o = owners
                        .entry(Claim::Element(set, el.key.clone().into_boxed_slice()))
                        .or_default();
                    o.push(key.clone());
                    if o.len() > 1 {
                        continue;
                    }
                }
                by_set.entry(set).or_default().push(el);
            }
            for list in r.lists {
                let o = owners
                    .entry(Claim::List(list.kind, list.key.clone().into_boxed_slice()))
                    .or_default();
                o.push(key.clone());
                if o.len() > 1 {
                    continue;
                }
                *shared.entry(list.value).or_default() += 1;
                let d = list.dispatch_element();
                by_set.entry(list.kind.sets().0).or_default().push(d);
                let s = list.digest_element();
                by_set.entry(list.kind.digests()).or_default().push(s);
                lists.push(list);
            }
        }
        let mut values: Vec<u32> = shared.keys().copied().collect();
        values.sort_unstable();
        for value in values {
            write_chain(&shared_chain(value, table.family, config), &mut g);
        }

        // Elements: only the difference from what the kernel has. Every set
        // but the two endpoint maps is read whole; the dispatch maps and
        // the digests say which endpoint lists the kernel holds and which
        // of them are as desired.
        let mut small_sets: Vec<(&'static str, DesiredElements, Option<KernelElements>)> =
            Vec::new();
        let mut np_want = None;
        if fixed.sets.iter().any(nodeport_set_name) {
            np_want = Some(DesiredElements::new(fixed.nodeport_ips.clone()));
        }
        let named = ElementSet::ALL
            .into_iter()
            .filter(|s| !ListKind::ALL.iter().any(|k| k.sets().1 == *s))
            .map(|s| {
                let want = DesiredElements::new(by_set.remove(&s).unwrap_or_default());
                (s.name(), want)
            })
            .chain(np_want.map(|w| (NODEPORT_IPS, w)));
        for (name, want) in named {
            let have = if kernel.sets.contains(name) {
                elements(name, None)
            } else {
                Some(KernelElements::default())
            };
            small_sets.push((name, want, have));
        }
        let kernel_set = |set: ElementSet| {
            small_sets
                .iter()
                .find(|(n, ..)| *n == set.name())
                .and_then(|(.., have)| have.as_ref())
        };
        let mut trusted: Vec<bool> = lists
            .iter()
            .map(|l| {
                let (dispatch, endpoints) = l.kind.sets();
                kernel.sets.contains(endpoints.name())
                    && kernel_set(dispatch)
                        .and_then(|m| m.get(&l.key))
                        .is_some_and(|v| v.is_of(&l.dispatch_element()))
                    && kernel_set(l.kind.digests())
                        .and_then(|m| m.get(&l.key))
                        .is_some_and(|v| matches!(v, KernelValue::Data(d) if *d == l.digest()))
            })
            .collect();
        if !digests_hold(&lists, &trusted, &mut *elements) {
            tracing::warn!(
                "endpoint lists in the kernel differ from their digests; reading every list back"
            );
            trusted.iter_mut().for_each(|t| *t = false);
        }
        for kind in ListKind::ALL {
            let (dispatch, endpoints) = kind.sets();
            let name = endpoints.name();
            let ours = || {
                lists
                    .iter()
                    .zip(&trusted)
                    .filter(move |(l, _)| l.kind == kind)
            };
            let trusted_keys: HashSet<&[u8], FastHash> = ours()
                .filter(|(_, t)| **t)
                .map(|(l, _)| l.key.as_slice())
                .collect();
            let want = DesiredElements::new(
                ours()
                    .filter(|(_, t)| !**t)
                    .flat_map(|(l, _)| (0..l.endpoints.len()).filter_map(|i| l.endpoint_element(i)))
                    .collect(),
            );
            // The slots the kernel's dispatch elements imply (`goto
            // endpoints-N` of key K: slots K.0 .. K.N-1), but for lists
            // whose digest holds: read by key, not dumped.
            let mut held: Vec<Vec<u8>> = Vec::new();
            for (key, value) in kernel_set(dispatch).into_iter().flatten() {
                let KernelValue::Verdict(_, Some(chain)) = value else {
                    continue;
                };
                if trusted_keys.contains(key.as_slice()) {
                    continue;
                }
                if let Some((k, n)) = parse_shared_chain_name(chain)
                    && k == kind
                {
                    held.extend(
                        (0..n)
                            .map(|i| list_slot_key(key, i))
                            .filter(|k| !want.contains_key(k)),
                    );
                }
            }
            let have = if !kernel.sets.contains(name) || (want.is_empty() && held.is_empty()) {
                Some(KernelElements::default())
            } else {
                let mut keys: Vec<&[u8]> = want.keys().collect();
                keys.extend(held.iter().map(Vec::as_slice));
                elements(name, Some(&keys))
            };
            match have {
                Some(have) => diff_elements(name, want, &have, &mut g),
                None => {
                    // Unreadable: rewritten whole, trusted lists too.
                    let all = DesiredElements::new(
                        ours()
                            .flat_map(|(l, _)| {
                                (0..l.endpoints.len()).filter_map(|i| l.endpoint_element(i))
                            })
                            .collect(),
                    );
                    rewrite_set(table, name, all, &mut head, &mut g);
                }
            }
        }
        for (name, want, have) in small_sets {
            match have {
                Some(have) => diff_elements(name, want, &have, &mut g),
                None => rewrite_set(table, name, want, &mut head, &mut g),
            }
        }
        let mut newly_stale = Vec::new();
        for (chain, rules) in &kernel.chains {
            if !desired_chains.contains(chain) {
                if !rules.is_empty() {
                    g.flush_chains.push(Op::FlushChain {
                        table,
                        name: chain.clone(),
                    });
                }
                newly_stale.push(chain.clone());
            }
        }
        for set in &kernel.sets {
            if !desired_sets.contains(set) {
                g.del_sets.push(Op::DelSet {
                    table,
                    name: set.clone(),
                });
            }
        }
        let ops = g.into_ops(table, head);
        Ok(Plan {
            ops,
            fixed: Some(fixed.clone()),
            ports: entries.into_iter().map(|(k, e)| (k, Some(e))).collect(),
            owners: owners.into_iter().collect(),
            shared: shared.into_iter().collect(),
            space: Some(space),
            freed: Vec::new(),
            revived: Vec::new(),
            newly_stale,
            deleted_stale: Vec::new(),
            full: true,
        })
    }

    /// Records an applied plan.
    pub fn commit(&mut self, plan: Plan, now: Instant) {
        if plan.full {
            self.ports.clear();
            self.owners.clear();
            self.shared.clear();
            self.stale_chains.clear();
        }
        for (value, keys) in plan.shared {
            if keys == 0 {
                self.shared.remove(&value);
            } else {
                self.shared.insert(value, keys);
            }
        }
        if let Some(fixed) = plan.fixed {
            self.fixed = Some(fixed);
        }
        if let Some(space) = plan.space {
            self.space = space;
        }
        for block in plan.freed {
            self.space.free(block);
        }
        for (key, entry) in plan.ports {
            match entry {
                Some(e) => {
                    self.ports.insert(key, e);
                }
                None => {
                    self.ports.remove(&key);
                }
            }
        }
        for (skey, owners) in plan.owners {
            if owners.is_empty() {
                self.owners.remove(&skey);
            } else {
                self.owners.insert(skey, owners);
            }
        }
        for name in plan.revived {
            self.stale_chains.remove(&name);
        }
        for name in plan.deleted_stale {
            self.stale_chains.remove(&name);
        }
        for name in plan.newly_stale {
            self.stale_chains.insert(name, now);
        }
    }

    /// Forgets everything (after the table was deleted).
    pub fn reset(&mut self) {
        self.fixed = None;
        self.ports.clear();
        self.owners.clear();
        self.shared.clear();
        self.space = SlotSpace::default();
        self.stale_chains.clear();
    }
}

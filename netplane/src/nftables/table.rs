//! What keelson last wrote into one of its tables, and the planning of the
//! operations that turn it into a new desired state. Nothing here talks to
//! the kernel: the backend sends the planned ops as one batch and, only if
//! the kernel accepted them, commits the plan into this record.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use super::layout::{FixedLayout, NODEPORT_IPS, creation_order};
use super::objects::{ChainDef, Element, Op, SetDef, TableId};
use super::render::{ElementSet, RenderedPort};
use crate::model::ServicePortKey;

/// How long a chain that lost its last reference stays (flushed) before it
/// is deleted: kernels before 6.2 notice a dropped map reference only a
/// moment after the transaction (kube-proxy waits one second too).
pub const STALE_CHAIN_DELAY: Duration = Duration::from_secs(1);

type ElementKey = (ElementSet, Vec<u8>);

/// The record of one table (a family's main table or one of its service tables).
#[derive(Debug)]
pub struct FamilyTable {
    id: TableId,
    fixed: Option<FixedLayout>,
    ports: HashMap<ServicePortKey, RenderedPort>,
    owners: HashMap<ElementKey, BTreeMap<ServicePortKey, Element>>,
    stale_chains: HashMap<String, Instant>,
}

/// A planned change: the ops to send and what to record once they applied.
#[derive(Debug, Default)]
pub struct Plan {
    /// Operations, in sending order.
    pub ops: Vec<Op>,
    fixed: Option<FixedLayout>,
    ports: Vec<(ServicePortKey, Option<RenderedPort>)>,
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

    fn write_rules(&mut self, table: TableId, chain: &ChainDef) {
        for rule in &chain.rules {
            self.rules.push(Op::AddRule {
                table,
                chain: chain.name.clone(),
                rule: rule.clone(),
            });
        }
    }
}

fn nodeport_set_name(set: &SetDef) -> bool {
    set.name == NODEPORT_IPS
}

impl FamilyTable {
    /// An empty record (nothing written yet).
    pub fn new(id: TableId) -> Self {
        FamilyTable {
            id,
            fixed: None,
            ports: HashMap::new(),
            owners: HashMap::new(),
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

    /// Rendered state of a service port, as written.
    pub fn port(&self, key: &ServicePortKey) -> Option<&RenderedPort> {
        self.ports.get(key)
    }

    /// Keys of the service ports written.
    pub fn port_keys(&self) -> impl Iterator<Item = &ServicePortKey> {
        self.ports.keys()
    }

    /// Number of chains and sets keelson has in the table (what the
    /// kernel's table `use` count should be).
    pub fn expected_object_count(&self) -> usize {
        let fixed = self
            .fixed
            .as_ref()
            .map(|f| f.chains.len() + f.sets.len())
            .unwrap_or(0);
        let ports: usize = self
            .ports
            .values()
            .map(|p| p.chains.len() + p.affinity_sets.len())
            .sum();
        fixed + ports + self.stale_chains.len()
    }

    /// Chains written, by name, with their rule count (for verification).
    pub fn chain_rule_counts(&self) -> Vec<(String, usize)> {
        let mut out: Vec<(String, usize)> = self
            .fixed
            .iter()
            .flat_map(|f| f.chains.iter())
            .chain(self.ports.values().flat_map(|p| p.chains.iter()))
            .map(|c| (c.name.clone(), c.rules.len()))
            .collect();
        out.extend(self.stale_chains.keys().map(|c| (c.clone(), 0)));
        out
    }

    /// Keys of `set` as written (for verification samples).
    pub fn effective_elements(
        &self,
        set: ElementSet,
    ) -> impl Iterator<Item = (&Vec<u8>, &Element)> {
        self.owners
            .iter()
            .filter(move |((s, _), _)| *s == set)
            .filter_map(|((_, key), owners)| owners.values().next().map(|e| (key, e)))
    }

    /// Stale chains waiting for deletion.
    pub fn stale_chain_count(&self) -> usize {
        self.stale_chains.len()
    }

    fn effective(&self, key: &ElementKey) -> Option<&Element> {
        self.owners.get(key).and_then(|o| o.values().next())
    }

    /// Plans an incremental change: `fixed` is the fixed layout to have (it
    /// is compared with what was written), `changes` the service ports to
    /// replace (`None`: remove).
    pub fn plan_incremental(
        &self,
        fixed: &FixedLayout,
        changes: Vec<(ServicePortKey, Option<RenderedPort>)>,
    ) -> Plan {
        let table = self.id;
        let mut g = Groups::default();
        let mut plan = Plan::default();

        // Fixed layout.
        if self.fixed.as_ref() != Some(fixed) {
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
            let nodeport_set_exists_after = fixed.sets.iter().any(nodeport_set_name);
            let nodeport_set_existed = old.is_some_and(|f| f.sets.iter().any(nodeport_set_name));
            if nodeport_set_existed && nodeport_set_exists_after {
                let gone: Vec<Vec<u8>> = old_np.difference(&new_np).map(|k| (*k).clone()).collect();
                if !gone.is_empty() {
                    g.del_elements.entry(NODEPORT_IPS).or_default().extend(gone);
                }
            }
            if nodeport_set_exists_after {
                let added: Vec<Element> = fixed
                    .nodeport_ips
                    .iter()
                    .filter(|e| !nodeport_set_existed || !old_np.contains(&e.key))
                    .cloned()
                    .collect();
                if !added.is_empty() {
                    g.add_elements
                        .entry(NODEPORT_IPS)
                        .or_default()
                        .extend(added);
                }
            }
            plan.fixed = Some(fixed.clone());
        }

        // Service ports.
        let mut owner_updates: HashMap<ElementKey, BTreeMap<ServicePortKey, Option<Element>>> =
            HashMap::new();
        let mut revived = BTreeSet::new();
        let mut newly_stale = BTreeSet::new();
        for (key, new) in &changes {
            let old = self.ports.get(key);
            let empty = RenderedPort::default();
            let old_r = old.unwrap_or(&empty);
            let new_r = new.as_ref().unwrap_or(&empty);
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
                        g.del_sets.push(Op::DelSet {
                            table,
                            name: (*name).to_string(),
                        });
                        // Re-created after the deletion, in the same batch.
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
            for (set, el) in &old_r.elements {
                owner_updates
                    .entry((*set, el.key.clone()))
                    .or_default()
                    .insert(key.clone(), None);
            }
            for (set, el) in &new_r.elements {
                owner_updates
                    .entry((*set, el.key.clone()))
                    .or_default()
                    .insert(key.clone(), Some(el.clone()));
            }
            plan.ports.push((key.clone(), new.clone()));
        }
        // Affinity sets that were redefined: add back after deletion.
        let mut readd = Vec::new();
        for op in &g.del_sets {
            if let Op::DelSet { name, .. } = op {
                for (_, new) in &changes {
                    if let Some(set) = new
                        .as_ref()
                        .and_then(|n| n.affinity_sets.iter().find(|s| &s.name == name))
                    {
                        readd.push(Op::AddSet {
                            table,
                            set: set.clone(),
                        });
                    }
                }
            }
        }

        for (ekey, updates) in owner_updates {
            let before = self.effective(&ekey).cloned();
            let mut owners = self.owners.get(&ekey).cloned().unwrap_or_default();
            for (owner, el) in updates {
                match el {
                    Some(el) => {
                        owners.insert(owner, el);
                    }
                    None => {
                        owners.remove(&owner);
                    }
                }
            }
            let after = owners.values().next().cloned();
            if before == after {
                continue;
            }
            let set_name = ekey.0.name();
            if before.is_some() {
                g.del_elements
                    .entry(set_name)
                    .or_default()
                    .push(ekey.1.clone());
            }
            if let Some(el) = after {
                g.add_elements.entry(set_name).or_default().push(el);
            }
        }

        let mut ops = g.into_ops(table, Vec::new());
        // Re-created affinity sets go right after their deletion.
        if !readd.is_empty() {
            let pos = ops
                .iter()
                .rposition(|o| matches!(o, Op::DelSet { .. }))
                .map(|p| p + 1)
                .unwrap_or(ops.len());
            let tail = ops.split_off(pos);
            ops.extend(readd);
            // Rules referencing re-created sets must come after them.
            let (rules, rest): (Vec<Op>, Vec<Op>) = tail
                .into_iter()
                .partition(|o| matches!(o, Op::AddRule { .. }));
            ops.extend(rest);
            ops.extend(rules);
        }
        plan.ops = ops;
        plan.revived = revived.into_iter().collect();
        plan.newly_stale = newly_stale.into_iter().collect();
        plan
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

    /// Plans a full rewrite to `desired` (start, repair): every fixed and
    /// per-port chain is created if missing, flushed and refilled, every
    /// fixed set flushed and refilled, affinity sets kept (their entries are
    /// live client state); kernel objects not desired (`existing_chains`,
    /// `existing_sets`, as listed from the kernel) are flushed and marked
    /// stale, or deleted (sets). `reset_base_chains` re-creates the base
    /// chains (first sync of a process, like kube-proxy). One atomic batch:
    /// traffic sees the old or the new table, never a mix or a gap.
    pub fn plan_full(
        &self,
        table_comment: &str,
        fixed: &FixedLayout,
        desired: Vec<(ServicePortKey, RenderedPort)>,
        existing_chains: &BTreeSet<String>,
        existing_sets: &BTreeSet<String>,
        reset_base_chains: bool,
    ) -> Plan {
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
            head.push(Op::FlushSet {
                table,
                name: set.name.clone(),
            });
        }
        let mut desired_chains: BTreeSet<&str> = BTreeSet::new();
        let mut desired_sets: BTreeSet<&str> = fixed.sets.iter().map(|s| s.name.as_str()).collect();
        let all_chains = creation_order(&fixed.chains)
            .into_iter()
            .chain(desired.iter().flat_map(|(_, p)| p.chains.iter()));
        for chain in all_chains {
            desired_chains.insert(&chain.name);
            g.add_chains.push(Op::AddChain {
                table,
                name: chain.name.clone(),
                base: chain.base,
                comment: chain.comment.clone(),
            });
            if !(reset_base_chains && chain.base.is_some()) {
                g.add_chains.push(Op::FlushChain {
                    table,
                    name: chain.name.clone(),
                });
            }
            g.write_rules(table, chain);
        }
        for (_, port) in &desired {
            for set in &port.affinity_sets {
                desired_sets.insert(&set.name);
                g.add_sets.push(Op::AddSet {
                    table,
                    set: set.clone(),
                });
            }
        }
        // Element owners of the desired state.
        let mut owners: HashMap<ElementKey, BTreeMap<ServicePortKey, Element>> = HashMap::new();
        for (key, port) in &desired {
            for (set, el) in &port.elements {
                owners
                    .entry((*set, el.key.clone()))
                    .or_default()
                    .insert(key.clone(), el.clone());
            }
        }
        let mut by_set: BTreeMap<&'static str, Vec<Element>> = BTreeMap::new();
        for ((set, _), o) in &owners {
            if let Some(el) = o.values().next() {
                by_set.entry(set.name()).or_default().push(el.clone());
            }
        }
        if !fixed.nodeport_ips.is_empty() {
            by_set
                .entry(NODEPORT_IPS)
                .or_default()
                .extend(fixed.nodeport_ips.iter().cloned());
        }
        for elements in by_set.values_mut() {
            elements.sort_by(|a, b| a.key.cmp(&b.key));
        }
        g.add_elements = by_set;

        let mut newly_stale = Vec::new();
        for chain in existing_chains {
            if !desired_chains.contains(chain.as_str()) {
                g.flush_chains.push(Op::FlushChain {
                    table,
                    name: chain.clone(),
                });
                newly_stale.push(chain.clone());
            }
        }
        for set in existing_sets {
            if !desired_sets.contains(set.as_str()) {
                g.del_sets.push(Op::DelSet {
                    table,
                    name: set.clone(),
                });
            }
        }
        // Add/flush of chains must precede the flush of stale chains only
        // by convention; order inside the groups keeps creation before use.
        let ops = g.into_ops(table, head);
        Plan {
            ops,
            fixed: Some(fixed.clone()),
            ports: desired.into_iter().map(|(k, p)| (k, Some(p))).collect(),
            revived: Vec::new(),
            newly_stale,
            deleted_stale: Vec::new(),
            full: true,
        }
    }

    /// Records an applied plan.
    pub fn commit(&mut self, plan: Plan, now: Instant) {
        if plan.full {
            self.ports.clear();
            self.owners.clear();
            self.stale_chains.clear();
        }
        if let Some(fixed) = plan.fixed {
            self.fixed = Some(fixed);
        }
        for (key, port) in plan.ports {
            if let Some(old) = self.ports.remove(&key) {
                for (set, el) in old.elements {
                    let ekey = (set, el.key);
                    if let Some(o) = self.owners.get_mut(&ekey) {
                        o.remove(&key);
                        if o.is_empty() {
                            self.owners.remove(&ekey);
                        }
                    }
                }
            }
            if let Some(port) = port {
                for (set, el) in &port.elements {
                    self.owners
                        .entry((*set, el.key.clone()))
                        .or_default()
                        .insert(key.clone(), el.clone());
                }
                self.ports.insert(key, port);
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
        self.stale_chains.clear();
    }
}

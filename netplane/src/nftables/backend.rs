//! The nftables data plane: keeps a record of what it wrote per family,
//! renders each changed service port, plans only the difference and sends
//! it as ONE atomic nf_tables batch over netlink. The kernel table is read
//! only at start (to adopt what a previous instance left) and, cheaply, on
//! the periodic full sync (table object count, rule counts of the fixed
//! chains and of a rotating sample of service chains).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

use netlink_bindings::nftables::{
    ChainAttrs, PushChainAttrs, PushRuleAttrs, PushSetAttrs, PushTableAttrs, SetAttrs, TableAttrs,
};

use super::config::NftablesConfig;
use super::layout::{FixedLayout, TableRole, fixed_layout};
use super::names::shard_of;
use super::netlink::{BatchError, NfSocket};
use super::objects::{Op, TableId, table_name};
use super::render::{RenderedPort, render_port};
use super::table::{FamilyTable, Plan};
use super::wire::MsgKind;
use crate::backend::{Backend, BackendError, SyncOutcome};
use crate::model::{
    IpFamily, NodePortAddresses, ProxyDiff, ProxySnapshot, ServicePortKey, ServicePortState,
};

/// Comment of keelson's tables.
pub const TABLE_COMMENT: &str = "rules for keelson (kube-proxy compatible Service routing)";
/// Service chains checked per periodic verification. Each per-chain rule
/// dump walks the table's rule lists in the kernel, so the sample is small.
const VERIFY_SAMPLE: usize = 4;
/// Fixed chains whose rules every verification checks (the hooks and the
/// dispatch: if someone flushed the table, these are empty).
const VERIFY_FIXED: &[&str] = &["nat-prerouting", "nat-output", "filter-forward", "services"];

/// The nftables backend.
#[derive(Debug)]
pub struct NftablesBackend {
    config: NftablesConfig,
    socket: NfSocket,
    tables: BTreeMap<TableId, FamilyTable>,
    node_ports: BTreeMap<IpFamily, NodePortAddresses>,
    base_chains_reset: bool,
    verify_cursor: usize,
    /// The model states last programmed (to skip re-rendering unchanged
    /// ports on the periodic full sync).
    programmed: HashMap<ServicePortKey, Arc<ServicePortState>>,
}

fn refused(e: BatchError) -> BackendError {
    match e {
        BatchError::Refused(r) => BackendError::Refused {
            errno: r.source.raw_os_error(),
            message: format!("{} ({} failing message(s))", r.source, r.failures),
            what: r.op,
        },
        BatchError::Io(source) => BackendError::Io {
            context: "sending the nftables transaction".into(),
            source,
        },
    }
}

fn io_err(context: &str) -> impl FnOnce(std::io::Error) -> BackendError + '_ {
    move |source| BackendError::Io {
        context: context.into(),
        source,
    }
}

type PortChanges = Vec<(ServicePortKey, Option<RenderedPort>)>;

fn role(config: &NftablesConfig, id: TableId) -> TableRole {
    if config.shards() == 1 {
        TableRole::Combined
    } else if id.index == 0 {
        TableRole::Main
    } else {
        TableRole::Services
    }
}

fn fixed_for(
    config: &NftablesConfig,
    id: TableId,
    node_ports: &BTreeMap<IpFamily, NodePortAddresses>,
) -> FixedLayout {
    let np = node_ports.get(&id.family).cloned().unwrap_or_default();
    fixed_layout(id.family, role(config, id), config, &np)
}

/// The tables a service port's objects go to, with its rendering split
/// accordingly (one table when Services are not sharded).
pub(crate) fn render_parts(
    config: &NftablesConfig,
    key: &ServicePortKey,
    state: Option<&ServicePortState>,
) -> Vec<(TableId, Option<RenderedPort>)> {
    let main = TableId {
        family: key.family,
        index: 0,
    };
    let rendered = state.map(|s| render_port(s, config));
    if config.shards() == 1 {
        return vec![(main, rendered)];
    }
    let svc = TableId {
        family: key.family,
        index: 1 + shard_of(&key.name, config.shards()),
    };
    match rendered {
        None => vec![(main, None), (svc, None)],
        Some(r) => {
            let (m, s) = r.split();
            vec![(main, Some(m)), (svc, Some(s))]
        }
    }
}

fn group_changes<'a>(
    config: &NftablesConfig,
    items: impl Iterator<Item = (&'a ServicePortKey, Option<&'a ServicePortState>)>,
) -> BTreeMap<TableId, PortChanges> {
    let mut by_table: BTreeMap<TableId, PortChanges> = BTreeMap::new();
    for (key, state) in items {
        for (id, part) in render_parts(config, key, state) {
            by_table.entry(id).or_default().push((key.clone(), part));
        }
    }
    by_table
}

/// Deletes service tables an earlier run with more `service_shards` left
/// (`<table>-services-NN` beyond this configuration's): they would keep
/// translating Services this run programs elsewhere. Services they held are
/// programmed again by the first sync. A failure is logged, not fatal.
fn remove_stale_service_tables(socket: &mut NfSocket, config: &NftablesConfig) {
    let first_stale = if config.shards() == 1 {
        1
    } else {
        config.shards() + 1
    };
    let ops: Vec<Op> = config
        .families
        .iter()
        .flat_map(|family| {
            (first_stale..=super::config::MAX_SERVICE_SHARDS).flat_map(move |index| {
                let table = TableId {
                    family: *family,
                    index,
                };
                [
                    Op::AddTable {
                        table,
                        comment: TABLE_COMMENT.into(),
                    },
                    Op::DelTable { table },
                ]
            })
        })
        .collect();
    if ops.is_empty() {
        return;
    }
    if let Err(e) = socket.run_batch(&config.table, &ops) {
        tracing::warn!(error = %e, "could not remove stale service tables of an earlier configuration");
    }
}

impl NftablesBackend {
    /// Opens a netfilter netlink socket in the calling thread's network
    /// namespace (create the backend inside the namespace it must program).
    pub fn new(config: NftablesConfig) -> Result<NftablesBackend, BackendError> {
        let mut socket =
            NfSocket::open().map_err(io_err("opening the NETLINK_NETFILTER socket"))?;
        remove_stale_service_tables(&mut socket, &config);
        let mut tables = BTreeMap::new();
        for family in &config.families {
            let indexes: Vec<u16> = if config.shards() == 1 {
                vec![0]
            } else {
                (0..=config.shards()).collect()
            };
            for index in indexes {
                let id = TableId {
                    family: *family,
                    index,
                };
                tables.insert(id, FamilyTable::new(id));
            }
        }
        let node_ports = config
            .families
            .iter()
            .map(|f| (*f, NodePortAddresses::AllLocal))
            .collect();
        Ok(NftablesBackend {
            config,
            socket,
            tables,
            node_ports,
            base_chains_reset: false,
            verify_cursor: 0,
            programmed: HashMap::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &NftablesConfig {
        &self.config
    }

    /// The tables this backend writes.
    pub fn table_ids(&self) -> impl Iterator<Item = TableId> + '_ {
        self.tables.keys().copied()
    }

    /// The record of what was written in a table.
    pub fn table(&self, id: TableId) -> Option<&FamilyTable> {
        self.tables.get(&id)
    }

    /// Plans the ops for a diff without sending them (what [`Backend::sync`]
    /// would send). Useful to inspect the cost of a change.
    pub fn plan_diff(&self, diff: &ProxyDiff) -> Vec<Op> {
        self.plans_for_diff(diff)
            .into_iter()
            .flat_map(|(_, p)| p.ops)
            .collect()
    }

    fn plans_for_diff(&self, diff: &ProxyDiff) -> Vec<(TableId, Plan)> {
        let mut config = self.config.clone();
        if let Some(cidrs) = &diff.service_cidrs {
            config.service_cidrs = cidrs.clone();
        }
        let mut node_ports = self.node_ports.clone();
        if let Some(np) = &diff.node_port_addresses {
            for (f, a) in np {
                node_ports.insert(*f, a.clone());
            }
        }
        let mut by_table = group_changes(
            &config,
            diff.changes.iter().map(|c| (&c.key, c.current.as_deref())),
        );
        let mut out = Vec::new();
        for (id, table) in &self.tables {
            let fixed = fixed_for(&config, *id, &node_ports);
            let changes = by_table.remove(id).unwrap_or_default();
            out.push((*id, table.plan_incremental(&fixed, changes)));
        }
        out
    }

    fn run(
        &mut self,
        plans: Vec<(TableId, Plan)>,
        now: Instant,
    ) -> Result<SyncOutcome, BackendError> {
        let ops: Vec<Op> = plans
            .iter()
            .flat_map(|(_, p)| p.ops.iter().cloned())
            .collect();
        let objects_changed = ops.iter().map(Op::object_count).sum();
        let stats = self
            .socket
            .run_batch(&self.config.table, &ops)
            .map_err(refused)?;
        for (id, plan) in plans {
            if let Some(t) = self.tables.get_mut(&id) {
                t.commit(plan, now);
            }
        }
        Ok(SyncOutcome {
            objects_changed,
            messages: stats.messages,
            repaired: false,
        })
    }

    fn list_names(
        &mut self,
        id: TableId,
    ) -> Result<(BTreeSet<String>, BTreeSet<String>), BackendError> {
        let table = table_name(&self.config.table, id.index);
        let family = id.family;
        let chains = match self.socket.request(MsgKind::GetChain, family, true, |b| {
            PushChainAttrs::new(b).push_table_bytes(table.as_bytes());
        }) {
            Ok(c) => c,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Vec::new(),
            Err(e) => return Err(io_err("listing chains")(e)),
        };
        let sets = match self.socket.request(MsgKind::GetSet, family, true, |b| {
            PushSetAttrs::new(b).push_table_bytes(table.as_bytes());
        }) {
            Ok(s) => s,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Vec::new(),
            Err(e) => return Err(io_err("listing sets")(e)),
        };
        let mut chain_names = BTreeSet::new();
        for c in &chains {
            let attrs = ChainAttrs::new(c);
            if attrs.get_table().ok().map(|t| t.to_bytes()) != Some(table.as_bytes()) {
                continue;
            }
            if let Ok(name) = attrs.get_name() {
                chain_names.insert(name.to_string_lossy().into_owned());
            }
        }
        let mut set_names = BTreeSet::new();
        for s in &sets {
            let attrs = SetAttrs::new(s);
            if attrs.get_table().ok().map(|t| t.to_bytes()) != Some(table.as_bytes()) {
                continue;
            }
            if let Ok(name) = attrs.get_name() {
                set_names.insert(name.to_string_lossy().into_owned());
            }
        }
        Ok((chain_names, set_names))
    }

    /// Rewrites everything from `snapshot`, adopting whatever the kernel has.
    fn full_rewrite(
        &mut self,
        snapshot: &ProxySnapshot,
        delete_first: bool,
    ) -> Result<SyncOutcome, BackendError> {
        let now = Instant::now();
        let mut by_table = group_changes(
            &self.config,
            snapshot.services.iter().map(|(k, s)| (k, Some(&**s))),
        );
        let ids: Vec<TableId> = self.tables.keys().copied().collect();
        let mut plans = Vec::new();
        for id in ids {
            let (chains, sets) = if delete_first {
                (BTreeSet::new(), BTreeSet::new())
            } else {
                self.list_names(id)?
            };
            let fixed = fixed_for(&self.config, id, &self.node_ports);
            let desired: Vec<(ServicePortKey, RenderedPort)> = by_table
                .remove(&id)
                .unwrap_or_default()
                .into_iter()
                .filter_map(|(k, p)| p.map(|p| (k, p)))
                .collect();
            let Some(table) = self.tables.get(&id) else {
                continue;
            };
            let mut plan = table.plan_full(
                TABLE_COMMENT,
                &fixed,
                desired,
                &chains,
                &sets,
                !self.base_chains_reset && !delete_first,
            );
            if delete_first {
                let mut ops = vec![
                    Op::AddTable {
                        table: id,
                        comment: TABLE_COMMENT.into(),
                    },
                    Op::DelTable { table: id },
                ];
                ops.append(&mut plan.ops);
                plan.ops = ops;
            }
            plans.push((id, plan));
        }
        let outcome = self.run(plans, now)?;
        self.programmed = snapshot
            .services
            .iter()
            .map(|(k, s)| (k.clone(), s.clone()))
            .collect();
        self.base_chains_reset = true;
        Ok(SyncOutcome {
            repaired: true,
            ..outcome
        })
    }

    /// Deletes chains that went stale at least a second ago, in a
    /// transaction of their own; failures are logged and retried later.
    fn delete_stale_chains(&mut self, now: Instant) {
        let plans: Vec<(TableId, Plan)> = self
            .tables
            .iter()
            .filter_map(|(id, t)| t.plan_stale_deletion(now).map(|p| (*id, p)))
            .collect();
        if plans.is_empty() {
            return;
        }
        if let Err(e) = self.run(plans, now) {
            tracing::warn!(error = %e, "could not delete stale chains; will retry");
        }
    }

    /// Cheap consistency check of the kernel table against the record.
    /// Returns a description of the first difference found.
    pub fn verify(&mut self) -> Result<Option<String>, BackendError> {
        let ids: Vec<TableId> = self.tables.keys().copied().collect();
        for id in ids {
            let table = table_name(&self.config.table, id.index);
            let family = id.family;
            let Some(rec) = self.tables.get(&id) else {
                continue;
            };
            if !rec.initialized() {
                return Ok(Some(format!("{id} never written")));
            }
            let expected = rec.expected_object_count();
            let mut counts = rec.chain_rule_counts();
            let reply = match self.socket.request(MsgKind::GetTable, family, false, |b| {
                PushTableAttrs::new(b).push_name_bytes(table.as_bytes());
            }) {
                Ok(r) => r,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    return Ok(Some(format!("{id} ({table}) is gone")));
                }
                Err(e) => return Err(io_err("reading the table")(e)),
            };
            let used = reply
                .first()
                .and_then(|p| TableAttrs::new(p).get_use().ok())
                .unwrap_or(0) as usize;
            if used != expected {
                return Ok(Some(format!(
                    "{id} ({table}) holds {used} chains/sets, keelson wrote {expected}"
                )));
            }
            // Fixed chains (no '/') always; a rotating sample of the others.
            counts.sort();
            let (fixed, per_port): (Vec<_>, Vec<_>) =
                counts.into_iter().partition(|(n, _)| !n.contains('/'));
            let mut sample: Vec<(String, usize)> = fixed
                .into_iter()
                .filter(|(n, _)| VERIFY_FIXED.contains(&n.as_str()))
                .collect();
            if !per_port.is_empty() {
                for i in 0..VERIFY_SAMPLE.min(per_port.len()) {
                    let idx = (self.verify_cursor + i) % per_port.len();
                    sample.push(per_port[idx].clone());
                }
                self.verify_cursor = (self.verify_cursor + VERIFY_SAMPLE) % per_port.len();
            }
            for (chain, want) in sample {
                let rules = match self.socket.request(MsgKind::GetRule, family, true, |b| {
                    PushRuleAttrs::new(b)
                        .push_table_bytes(table.as_bytes())
                        .push_chain_bytes(chain.as_bytes());
                }) {
                    Ok(r) => r.len(),
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                        return Ok(Some(format!("{id}: chain {chain} is gone")));
                    }
                    Err(e) => return Err(io_err("listing rules")(e)),
                };
                if rules != want {
                    return Ok(Some(format!(
                        "{id}: chain {chain} has {rules} rules, keelson wrote {want}"
                    )));
                }
            }
        }
        Ok(None)
    }
}

impl Backend for NftablesBackend {
    fn name(&self) -> &'static str {
        "nftables"
    }

    fn sync(&mut self, diff: &ProxyDiff) -> Result<SyncOutcome, BackendError> {
        if self.tables.values().any(|t| !t.initialized()) {
            return Err(BackendError::Invalid(
                "nftables backend: a full sync must run before incremental syncs".into(),
            ));
        }
        let now = Instant::now();
        let plans = self.plans_for_diff(diff);
        let outcome = self.run(plans, now)?;
        for c in &diff.changes {
            match &c.current {
                Some(s) => {
                    self.programmed.insert(c.key.clone(), s.clone());
                }
                None => {
                    self.programmed.remove(&c.key);
                }
            }
        }
        self.delete_stale_chains(now);
        if let Some(np) = &diff.node_port_addresses {
            for (f, a) in np {
                self.node_ports.insert(*f, a.clone());
            }
        }
        if let Some(cidrs) = &diff.service_cidrs {
            self.config.service_cidrs = cidrs.clone();
        }
        Ok(outcome)
    }

    fn full_sync(&mut self, snapshot: &ProxySnapshot) -> Result<SyncOutcome, BackendError> {
        if let Some(cidrs) = &snapshot.service_cidrs {
            self.config.service_cidrs = cidrs.clone();
        }
        for (f, a) in &snapshot.node_port_addresses {
            if self.config.families.contains(f) {
                self.node_ports.insert(*f, a.clone());
            }
        }
        let initialized = self.tables.values().all(FamilyTable::initialized);
        if initialized {
            match self.verify()? {
                None => {
                    // Kernel matches the record: bring the record to the
                    // snapshot incrementally (usually nothing to do).
                    let now = Instant::now();
                    let programmed = &self.programmed;
                    let mut keys: BTreeSet<&ServicePortKey> = snapshot
                        .services
                        .iter()
                        .filter(|(k, s)| {
                            programmed
                                .get(*k)
                                .is_none_or(|p| !Arc::ptr_eq(p, s) && **p != ***s)
                        })
                        .map(|(k, _)| k)
                        .collect();
                    keys.extend(
                        programmed
                            .keys()
                            .filter(|k| !snapshot.services.contains_key(*k)),
                    );
                    let mut by_table = group_changes(
                        &self.config,
                        keys.into_iter()
                            .map(|k| (k, snapshot.services.get(k).map(|s| &**s))),
                    );
                    let node_ports = self.node_ports.clone();
                    let mut plans = Vec::new();
                    for (id, table) in &self.tables {
                        let fixed = fixed_for(&self.config, *id, &node_ports);
                        let changes: PortChanges = by_table
                            .remove(id)
                            .unwrap_or_default()
                            .into_iter()
                            .filter(|(k, p)| table.port(k) != p.as_ref())
                            .collect();
                        plans.push((*id, table.plan_incremental(&fixed, changes)));
                    }
                    let outcome = self.run(plans, now)?;
                    self.programmed = snapshot
                        .services
                        .iter()
                        .map(|(k, s)| (k.clone(), s.clone()))
                        .collect();
                    self.delete_stale_chains(now);
                    return Ok(outcome);
                }
                Some(reason) => {
                    tracing::warn!(%reason, "nftables table differs from what keelson wrote; rewriting it");
                }
            }
        }
        match self.full_rewrite(snapshot, false) {
            Ok(o) => Ok(o),
            Err(BackendError::Refused { what, message, .. }) => {
                tracing::warn!(%what, %message, "adopting the existing table failed; replacing it atomically");
                for t in self.tables.values_mut() {
                    t.reset();
                }
                self.full_rewrite(snapshot, true)
            }
            Err(e) => Err(e),
        }
    }

    fn cleanup(&mut self) -> Result<(), BackendError> {
        let ops: Vec<Op> = self
            .tables
            .keys()
            .flat_map(|id| {
                [
                    Op::AddTable {
                        table: *id,
                        comment: TABLE_COMMENT.into(),
                    },
                    Op::DelTable { table: *id },
                ]
            })
            .collect();
        self.socket
            .run_batch(&self.config.table, &ops)
            .map_err(refused)?;
        for t in self.tables.values_mut() {
            t.reset();
        }
        self.programmed.clear();
        Ok(())
    }
}

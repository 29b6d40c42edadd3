//! The nftables data plane: keeps a record of what it wrote per family,
//! renders each changed service port, plans only the difference and sends
//! it as ONE atomic nf_tables batch over netlink. The kernel table is read
//! only by full syncs: at start (to adopt what a previous instance left,
//! writing only what differs) and, cheaply, on the periodic verification
//! (table object count, rule counts of the fixed chains and of a rotating
//! sample of service chains).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use netlink_bindings::nftables::{PushRuleAttrs, PushTableAttrs, TableAttrs};

use super::config::{LEGACY_SERVICE_TABLES, NftablesConfig};
use super::layout::{FixedLayout, fixed_layout};
use super::netlink::{BatchError, NfSocket};
use super::objects::{Op, TableId, table_name};
use super::readback::{read_elements, read_elements_by_key, read_table};
use super::table::{FamilyTable, FullSyncInput, KernelTable, Plan};
use super::wire::MsgKind;
use crate::backend::{Backend, BackendError, SyncOutcome};
use crate::model::{
    IpFamily, NodePortAddresses, ProxyDiff, ProxySnapshot, ServicePortKey, ServicePortState,
};

/// Comment of keelson's tables.
pub const TABLE_COMMENT: &str = "rules for keelson (kube-proxy compatible Service routing)";
/// Service ports whose chains each periodic verification checks. Each
/// per-chain rule dump walks the table's rule lists in the kernel, so the
/// sample is small.
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

/// Where a full rewrite's time went (logged).
#[derive(Debug, Default)]
struct FullSyncTiming {
    read_table: Duration,
    read_elements: Duration,
    plan: Duration,
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e4).round() / 10.0
}

type PortChanges = Vec<(ServicePortKey, Option<Arc<ServicePortState>>)>;

fn table_of(family: IpFamily) -> TableId {
    TableId { family, index: 0 }
}

fn fixed_for(
    config: &NftablesConfig,
    family: IpFamily,
    node_ports: &BTreeMap<IpFamily, NodePortAddresses>,
) -> FixedLayout {
    let np = node_ports.get(&family).cloned().unwrap_or_default();
    fixed_layout(family, config, &np)
}

/// Deletes the service tables (`<table>-services-NN`) of earlier keelson
/// versions, which could spread Services over several tables: they would
/// keep translating Services this version programs in one table. A
/// failure is logged, not fatal.
fn remove_legacy_service_tables(socket: &mut NfSocket, config: &NftablesConfig) {
    let ops = legacy_table_deletions(config);
    if let Err(e) = socket.run_batch(&config.table, &ops) {
        tracing::warn!(error = %e, "could not remove the service tables of an earlier keelson");
    }
}

fn legacy_table_deletions(config: &NftablesConfig) -> Vec<Op> {
    config
        .families
        .iter()
        .flat_map(|family| {
            (1..=LEGACY_SERVICE_TABLES).flat_map(move |index| {
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
        .collect()
}

impl NftablesBackend {
    /// Opens a netfilter netlink socket in the calling thread's network
    /// namespace (create the backend inside the namespace it must program).
    pub fn new(config: NftablesConfig) -> Result<NftablesBackend, BackendError> {
        let mut socket =
            NfSocket::open().map_err(io_err("opening the NETLINK_NETFILTER socket"))?;
        remove_legacy_service_tables(&mut socket, &config);
        let tables = config
            .families
            .iter()
            .map(|f| (table_of(*f), FamilyTable::new(table_of(*f))))
            .collect();
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
    pub fn plan_diff(&self, diff: &ProxyDiff) -> Result<Vec<Op>, BackendError> {
        Ok(self
            .plans_for_diff(diff)?
            .into_iter()
            .flat_map(|(_, p)| p.ops)
            .collect())
    }

    fn plans_for_diff(&self, diff: &ProxyDiff) -> Result<Vec<(TableId, Plan)>, BackendError> {
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
        let mut by_table: BTreeMap<TableId, PortChanges> = BTreeMap::new();
        for c in &diff.changes {
            by_table
                .entry(table_of(c.key.family))
                .or_default()
                .push((c.key.clone(), c.current.clone()));
        }
        self.tables
            .iter()
            .map(|(id, table)| {
                let fixed = fixed_for(&config, id.family, &node_ports);
                let changes = by_table.remove(id).unwrap_or_default();
                table
                    .plan_incremental(&config, &fixed, changes)
                    .map(|p| (*id, p))
                    .map_err(|e| BackendError::Invalid(e.to_string()))
            })
            .collect()
    }

    fn run(
        &mut self,
        plans: Vec<(TableId, Plan)>,
        now: Instant,
    ) -> Result<SyncOutcome, BackendError> {
        let mut ops: Vec<Op> = Vec::new();
        let mut plans = plans;
        for (_, p) in &mut plans {
            ops.append(&mut p.ops);
        }
        let objects_changed = ops.iter().map(Op::object_count).sum();
        let stats = self
            .socket
            .run_batch(&self.config.table, &ops)
            .map_err(refused)?;
        drop(ops);
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

    /// Makes the kernel equal to `snapshot`, adopting what it holds:
    /// only what differs is written (everything when `delete_first`, which
    /// replaces the table in the same transaction).
    fn full_rewrite(
        &mut self,
        snapshot: &ProxySnapshot,
        delete_first: bool,
    ) -> Result<SyncOutcome, BackendError> {
        let now = Instant::now();
        let ids: Vec<TableId> = self.tables.keys().copied().collect();
        let mut plans = Vec::new();
        let mut timing = FullSyncTiming::default();
        for id in ids {
            let name = table_name(&self.config.table, id.index);
            let t = Instant::now();
            let kernel = if delete_first {
                KernelTable::default()
            } else {
                read_table(&mut self.socket, id.family, &name)
                    .map_err(io_err("reading the nftables table"))?
            };
            timing.read_table += t.elapsed();
            let fixed = fixed_for(&self.config, id.family, &self.node_ports);
            let desired: Vec<(ServicePortKey, Arc<ServicePortState>)> = snapshot
                .services
                .iter()
                .filter(|(k, _)| k.family == id.family)
                .map(|(k, s)| (k.clone(), s.clone()))
                .collect();
            let Self {
                socket,
                tables,
                config,
                base_chains_reset,
                ..
            } = self;
            let Some(table) = tables.get(&id) else {
                continue;
            };
            let mut read_elements_time = Duration::ZERO;
            let mut reader = |set: &str, keys: Option<&[&[u8]]>| {
                let t = Instant::now();
                let read = match keys {
                    None => read_elements(socket, id.family, &name, set),
                    Some(keys) => read_elements_by_key(socket, id.family, &name, set, keys),
                };
                read_elements_time += t.elapsed();
                match read {
                    Ok(e) => Some(e),
                    Err(e) => {
                        tracing::warn!(set, error = %e, "could not read the set's elements; rewriting it");
                        None
                    }
                }
            };
            let input = FullSyncInput {
                config,
                table_comment: TABLE_COMMENT,
                fixed: &fixed,
                kernel: &kernel,
                reset_base_chains: !*base_chains_reset && !delete_first,
            };
            let t = Instant::now();
            let mut plan = table
                .plan_full(input, desired, &mut reader)
                .map_err(|e| BackendError::Invalid(e.to_string()))?;
            timing.plan += t.elapsed();
            timing.read_elements += read_elements_time;
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
        let t = Instant::now();
        let outcome = self.run(plans, now)?;
        tracing::info!(
            read_table_ms = ms(timing.read_table),
            read_elements_ms = ms(timing.read_elements),
            plan_ms = ms(timing.plan.saturating_sub(timing.read_elements)),
            write_ms = ms(t.elapsed()),
            objects = outcome.objects_changed,
            messages = outcome.messages,
            "nftables table adopted"
        );
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

    fn rule_count(&mut self, id: TableId, chain: &str) -> Result<Option<usize>, BackendError> {
        let table = table_name(&self.config.table, id.index);
        match self.socket.request(MsgKind::GetRule, id.family, true, |b| {
            PushRuleAttrs::new(b)
                .push_table_bytes(table.as_bytes())
                .push_chain_bytes(chain.as_bytes());
        }) {
            Ok(r) => Ok(Some(r.len())),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(io_err("listing rules")(e)),
        }
    }

    /// Cheap consistency check of the kernel table against the record.
    /// Returns a description of the first difference found.
    pub fn verify(&mut self) -> Result<Option<String>, BackendError> {
        let ids: Vec<TableId> = self.tables.keys().copied().collect();
        for id in ids {
            let table = table_name(&self.config.table, id.index);
            let Some(rec) = self.tables.get(&id) else {
                continue;
            };
            if !rec.initialized() {
                return Ok(Some(format!("{id} never written")));
            }
            let expected = rec.expected_object_count();
            let mut sample: Vec<(String, usize)> = rec
                .fixed_rule_counts()
                .into_iter()
                .filter(|(n, _)| VERIFY_FIXED.contains(&n.as_str()))
                .collect();
            let mut keys: Vec<&ServicePortKey> = rec.port_keys().collect();
            if !keys.is_empty() {
                keys.sort();
                for i in 0..VERIFY_SAMPLE.min(keys.len()) {
                    let key = keys[(self.verify_cursor + i) % keys.len()];
                    if let Some(r) = rec.rendered(key, &self.config) {
                        sample.extend(r.chains.iter().map(|c| (c.name.clone(), c.rules.len())));
                    }
                }
                self.verify_cursor = (self.verify_cursor + VERIFY_SAMPLE) % keys.len();
            }
            let reply = match self
                .socket
                .request(MsgKind::GetTable, id.family, false, |b| {
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
            for (chain, want) in sample {
                match self.rule_count(id, &chain)? {
                    None => return Ok(Some(format!("{id}: chain {chain} is gone"))),
                    Some(n) if n != want => {
                        return Ok(Some(format!(
                            "{id}: chain {chain} has {n} rules, keelson wrote {want}"
                        )));
                    }
                    Some(_) => {}
                }
            }
        }
        Ok(None)
    }

    /// Brings the record to `snapshot` incrementally (the periodic full
    /// sync once verification found the kernel as written).
    fn converge(&mut self, snapshot: &ProxySnapshot) -> Result<SyncOutcome, BackendError> {
        let now = Instant::now();
        let node_ports = self.node_ports.clone();
        let mut plans = Vec::new();
        for (id, table) in &self.tables {
            let mut changes: PortChanges = snapshot
                .services
                .iter()
                .filter(|(k, _)| k.family == id.family)
                .filter(|(k, s)| {
                    table
                        .state(k)
                        .is_none_or(|p| !Arc::ptr_eq(p, s) && **p != ***s)
                })
                .map(|(k, s)| (k.clone(), Some(s.clone())))
                .collect();
            let gone: BTreeSet<&ServicePortKey> = table
                .port_keys()
                .filter(|k| !snapshot.services.contains_key(*k))
                .collect();
            changes.extend(gone.into_iter().map(|k| (k.clone(), None)));
            let fixed = fixed_for(&self.config, id.family, &node_ports);
            let plan = table
                .plan_incremental(&self.config, &fixed, changes)
                .map_err(|e| BackendError::Invalid(e.to_string()))?;
            plans.push((*id, plan));
        }
        let outcome = self.run(plans, now)?;
        self.delete_stale_chains(now);
        Ok(outcome)
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
        let plans = self.plans_for_diff(diff)?;
        let outcome = self.run(plans, now)?;
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
                None => return self.converge(snapshot),
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
        let mut ops: Vec<Op> = self
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
        ops.extend(legacy_table_deletions(&self.config));
        self.socket
            .run_batch(&self.config.table, &ops)
            .map_err(refused)?;
        for t in self.tables.values_mut() {
            t.reset();
        }
        Ok(())
    }
}

//! The kernel objects keelson writes (chains with their rules, sets, maps
//! and their elements) and the operations of a transaction on them. Both are
//! plain data: the backend compares what it wrote with what it should write
//! and emits only the operations for the difference.

use std::fmt;

use super::expr::Verdict;
use super::rule::Rule;
use crate::model::IpFamily;

/// One of keelson's tables: the main table of a family (index 0) or one of
/// its service tables (index 1..=N when Services are sharded).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TableId {
    /// Family (`ip` / `ip6`).
    pub family: IpFamily,
    /// 0: the main table; i > 0: service table i-1.
    pub index: u16,
}

impl fmt::Display for TableId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fam = match self.family {
            IpFamily::V4 => "ip",
            IpFamily::V6 => "ip6",
        };
        if self.index == 0 {
            write!(f, "{fam} main table")
        } else {
            write!(f, "{fam} service table {}", self.index - 1)
        }
    }
}

/// The name of table `index` for base name `base` (`keelson`,
/// `keelson-services-00`, ...).
pub fn table_name(base: &str, index: u16) -> String {
    if index == 0 {
        base.to_string()
    } else {
        format!("{base}-services-{:02}", index - 1)
    }
}

/// A base chain's hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BaseHook {
    /// `filter` or `nat`.
    pub chain_type: &'static str,
    /// `NF_INET_*` hook number.
    pub hook: u32,
    /// Priority.
    pub priority: i32,
}

/// `NF_INET_PRE_ROUTING`.
pub const HOOK_PREROUTING: u32 = 0;
/// `NF_INET_LOCAL_IN`.
pub const HOOK_INPUT: u32 = 1;
/// `NF_INET_FORWARD`.
pub const HOOK_FORWARD: u32 = 2;
/// `NF_INET_LOCAL_OUT`.
pub const HOOK_OUTPUT: u32 = 3;
/// `NF_INET_POST_ROUTING`.
pub const HOOK_POSTROUTING: u32 = 4;

/// A chain and its rules.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ChainDef {
    /// Name.
    pub name: String,
    /// Hook, for base chains.
    pub base: Option<BaseHook>,
    /// Comment.
    pub comment: Option<String>,
    /// Rules in order.
    pub rules: Vec<Rule>,
}

/// What kind of set or map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SetKind {
    /// `type ipv4_addr` / `ipv6_addr`.
    Addr,
    /// `type ipvX_addr . inet_proto . inet_service : verdict`.
    AddrProtoPortVmap,
    /// `type inet_proto . inet_service : verdict`.
    ProtoPortVmap,
    /// `type ipvX_addr; flags dynamic,timeout; timeout <n>s` (ClientIP affinity).
    Affinity {
        /// Timeout in seconds.
        timeout_seconds: u32,
    },
    /// `type ipvX_addr . ipvX_addr . inet_proto . inet_service`
    /// (`hairpin-connections`).
    AddrAddrProtoPort,
    /// `type mark : ipvX_addr . inet_service` (`endpoint-slots`: slot ->
    /// endpoint address and port).
    MarkToEndpoint,
    /// `type mark : verdict` (`endpoint-chains`).
    MarkVmap,
    /// `type ipvX_addr . inet_proto . inet_service . mark : ipvX_addr .
    /// inet_service` (`service-endpoints`).
    AddrProtoPortMarkToEndpoint,
    /// `type inet_proto . inet_service . mark : ipvX_addr . inet_service`
    /// (`nodeport-endpoints`).
    ProtoPortMarkToEndpoint,
    /// `type ipvX_addr . inet_proto . inet_service : mark . mark`
    /// (`service-endpoints-digest`: a 64-bit digest of an endpoint list).
    AddrProtoPortDigest,
    /// `type inet_proto . inet_service : mark . mark`
    /// (`nodeport-endpoints-digest`).
    ProtoPortDigest,
}

/// A named set or map.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SetDef {
    /// Name.
    pub name: String,
    /// Kind (key/data types, flags).
    pub kind: SetKind,
    /// Comment.
    pub comment: Option<String>,
}

/// An element of a set or map (key bytes exactly as the kernel stores them:
/// concatenated fields each padded to 4 bytes).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Element {
    /// Key.
    pub key: Vec<u8>,
    /// Verdict (verdict maps only).
    pub verdict: Option<Verdict>,
    /// Data (data maps only), as the kernel stores it.
    pub data: Option<Vec<u8>>,
    /// Comment.
    pub comment: Option<String>,
}

impl Element {
    /// An element of a set (no value, no comment).
    pub fn key(key: Vec<u8>) -> Element {
        Element {
            key,
            verdict: None,
            data: None,
            comment: None,
        }
    }

    /// An element of a verdict map.
    pub fn verdict(key: Vec<u8>, verdict: Verdict, comment: Option<String>) -> Element {
        Element {
            key,
            verdict: Some(verdict),
            data: None,
            comment,
        }
    }

    /// An element of a data map.
    pub fn data(key: Vec<u8>, data: Vec<u8>) -> Element {
        Element {
            key,
            verdict: None,
            data: Some(data),
            comment: None,
        }
    }
}

/// One operation of a transaction, in the order they are sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Create the table if missing (with its comment).
    AddTable {
        /// Table.
        table: TableId,
        /// Comment.
        comment: String,
    },
    /// Delete the table and everything in it.
    DelTable {
        /// Table.
        table: TableId,
    },
    /// Create a chain if missing.
    AddChain {
        /// Table.
        table: TableId,
        /// Name.
        name: String,
        /// Hook, for base chains.
        base: Option<BaseHook>,
        /// Comment.
        comment: Option<String>,
    },
    /// Remove every rule of a chain.
    FlushChain {
        /// Table.
        table: TableId,
        /// Name.
        name: String,
    },
    /// Delete a (flushed, unreferenced) chain.
    DelChain {
        /// Table.
        table: TableId,
        /// Name.
        name: String,
    },
    /// Append a rule.
    AddRule {
        /// Table.
        table: TableId,
        /// Chain.
        chain: String,
        /// The rule.
        rule: Rule,
    },
    /// Create a set or map if missing.
    AddSet {
        /// Table.
        table: TableId,
        /// Definition.
        set: SetDef,
    },
    /// Delete a set or map.
    DelSet {
        /// Table.
        table: TableId,
        /// Name.
        name: String,
    },
    /// Remove every element of a set or map.
    FlushSet {
        /// Table.
        table: TableId,
        /// Name.
        name: String,
    },
    /// Add elements.
    AddElements {
        /// Table.
        table: TableId,
        /// Set or map.
        set: String,
        /// Elements.
        elements: Vec<Element>,
    },
    /// Delete elements (by key).
    DelElements {
        /// Table.
        table: TableId,
        /// Set or map.
        set: String,
        /// Keys.
        keys: Vec<Vec<u8>>,
    },
}

impl Op {
    /// The table the operation applies to.
    pub fn table(&self) -> TableId {
        match self {
            Op::AddTable { table, .. }
            | Op::DelTable { table }
            | Op::AddChain { table, .. }
            | Op::FlushChain { table, .. }
            | Op::DelChain { table, .. }
            | Op::AddRule { table, .. }
            | Op::AddSet { table, .. }
            | Op::DelSet { table, .. }
            | Op::FlushSet { table, .. }
            | Op::AddElements { table, .. }
            | Op::DelElements { table, .. } => *table,
        }
    }

    /// Short description for error messages ("add rule to chain X").
    pub fn describe(&self) -> String {
        match self {
            Op::AddTable { table, .. } => format!("add table ({table})"),
            Op::DelTable { table } => format!("delete table ({table})"),
            Op::AddChain { table, name, .. } => format!("add chain {name} ({table})"),
            Op::FlushChain { table, name } => format!("flush chain {name} ({table})"),
            Op::DelChain { table, name } => format!("delete chain {name} ({table})"),
            Op::AddRule { table, chain, .. } => format!("add rule to chain {chain} ({table})"),
            Op::AddSet { table, set } => format!("add set {} ({table})", set.name),
            Op::DelSet { table, name } => format!("delete set {name} ({table})"),
            Op::FlushSet { table, name } => format!("flush set {name} ({table})"),
            Op::AddElements {
                table,
                set,
                elements,
            } => {
                format!("add {} element(s) to {set} ({table})", elements.len())
            }
            Op::DelElements { table, set, keys } => {
                format!("delete {} element(s) from {set} ({table})", keys.len())
            }
        }
    }

    /// How many kernel objects the operation touches (for metrics).
    pub fn object_count(&self) -> usize {
        match self {
            Op::AddElements { elements, .. } => elements.len(),
            Op::DelElements { keys, .. } => keys.len(),
            _ => 1,
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

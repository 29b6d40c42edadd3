//! Reading keelson's table back for tests and diagnosis, through the `nft`
//! binary's JSON output (the `nftables` crate). Never used on the sync path:
//! `nft` reads the whole table from the kernel on every call.

use std::collections::BTreeMap;

use nftables::schema::{NfListObject, NfObject};

use crate::model::IpFamily;

/// A summary of a table: its chains (comment and rule count) and sets/maps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableListing {
    /// Chains by name: comment and number of rules.
    pub chains: BTreeMap<String, (Option<String>, usize)>,
    /// Set and map names.
    pub sets: Vec<String>,
}

/// Why a table could not be read back.
#[derive(Debug, thiserror::Error)]
#[error("listing table {family} {table}: {message}")]
pub struct ListingError {
    /// `ip` / `ip6`.
    pub family: &'static str,
    /// Table name.
    pub table: String,
    /// What failed.
    pub message: String,
}

/// Lists `table` of `family` with `nft -j` (in the caller's network
/// namespace: the child process inherits the calling thread's).
pub fn list_table(family: IpFamily, table: &str) -> Result<TableListing, ListingError> {
    let fam = match family {
        IpFamily::V4 => "ip",
        IpFamily::V6 => "ip6",
    };
    let err = |message: String| ListingError {
        family: fam,
        table: table.to_string(),
        message,
    };
    let raw =
        nftables::helper::get_current_ruleset_raw(None::<&str>, ["list", "table", fam, table])
            .map_err(|e| err(e.to_string()))?;
    // Decode generically: the crate's typed schema has no verdict maps.
    let value: serde_json::Value = serde_json::from_str(&raw).map_err(|e| err(e.to_string()))?;
    let mut out = TableListing::default();
    for obj in value
        .get("nftables")
        .and_then(|v| v.as_array())
        .into_iter()
        .flatten()
    {
        if let Some(chain) = obj.get("chain") {
            let name = chain
                .get("name")
                .and_then(|n| n.as_str())
                .unwrap_or_default()
                .to_string();
            let comment = chain
                .get("comment")
                .and_then(|c| c.as_str())
                .map(String::from);
            out.chains.entry(name).or_insert((comment, 0));
        } else if let Some(rule) = obj.get("rule") {
            let chain = rule
                .get("chain")
                .and_then(|n| n.as_str())
                .unwrap_or_default()
                .to_string();
            out.chains.entry(chain).or_insert((None, 0)).1 += 1;
        } else if let Some(set) = obj.get("set").or_else(|| obj.get("map")) {
            out.sets.push(
                set.get("name")
                    .and_then(|n| n.as_str())
                    .unwrap_or_default()
                    .to_string(),
            );
        } else if let Ok(NfObject::ListObject(NfListObject::Table(_))) =
            serde_json::from_value::<NfObject<'_>>(obj.clone())
        {
            // The table itself.
        }
    }
    Ok(out)
}

//! Reading keelson's table back from the kernel over netlink, for a full
//! sync that adopts what is there (start, repair): chain names, set names,
//! the fingerprint and slots id keelson wrote into each rule's userdata,
//! and the elements of a set. Rule expressions are not decoded: a rule
//! keelson wrote says what it is in its userdata, and anything else does
//! not match and is rewritten.

use std::io;

use netlink_bindings::nftables::{
    ChainAttrs, PushChainAttrs, PushRuleAttrs, PushSetAttrs, PushSetelemListAttrs, RuleAttrs,
    SetAttrs, SetelemListAttrs,
};

use super::encode::{parse_rule_userdata, push_element_keys};
use super::netlink::NfSocket;
use super::table::{KernelElements, KernelTable, KernelValue};
use super::wire::MsgKind;
use crate::model::IpFamily;

fn empty_if_missing(r: io::Result<Vec<Vec<u8>>>) -> io::Result<Vec<Vec<u8>>> {
    match r {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(Vec::new()),
        other => other,
    }
}

/// Chains (with keelson's rule fingerprints) and sets of `table`; an
/// absent table reads as empty.
pub fn read_table(socket: &mut NfSocket, family: IpFamily, table: &str) -> io::Result<KernelTable> {
    let t = table.as_bytes();
    let chains = empty_if_missing(socket.request(MsgKind::GetChain, family, true, |b| {
        PushChainAttrs::new(b).push_table_bytes(t);
    }))?;
    let sets = empty_if_missing(socket.request(MsgKind::GetSet, family, true, |b| {
        PushSetAttrs::new(b).push_table_bytes(t);
    }))?;
    let rules = empty_if_missing(socket.request(MsgKind::GetRule, family, true, |b| {
        PushRuleAttrs::new(b).push_table_bytes(t);
    }))?;
    Ok(parse_table(table, &chains, &sets, &rules))
}

/// The table `table` as the kernel's replies to the chain, set and rule
/// dumps describe it (each reply one message's attributes); entries of
/// other tables and attributes that do not parse are left out.
pub fn parse_table(
    table: &str,
    chains: &[Vec<u8>],
    sets: &[Vec<u8>],
    rules: &[Vec<u8>],
) -> KernelTable {
    let t = table.as_bytes();
    let mut out = KernelTable::default();
    for c in chains {
        let attrs = ChainAttrs::new(c);
        if attrs.get_table().ok().map(|n| n.to_bytes()) != Some(t) {
            continue;
        }
        if let Ok(name) = attrs.get_name() {
            out.chains
                .entry(name.to_string_lossy().into_owned())
                .or_default();
        }
    }
    for s in sets {
        let attrs = SetAttrs::new(s);
        if attrs.get_table().ok().map(|n| n.to_bytes()) != Some(t) {
            continue;
        }
        if let Ok(name) = attrs.get_name() {
            out.sets.insert(name.to_string_lossy().into_owned());
        }
    }
    for r in rules {
        let attrs = RuleAttrs::new(r);
        if attrs.get_table().ok().map(|n| n.to_bytes()) != Some(t) {
            continue;
        }
        let Ok(chain) = attrs.get_chain() else {
            continue;
        };
        let chain = chain.to_string_lossy().into_owned();
        let (fingerprint, slots) = attrs
            .get_userdata()
            .map(parse_rule_userdata)
            .unwrap_or((None, None));
        if let Some(id) = slots {
            out.chain_slots.insert(chain.clone(), id);
        }
        out.chains.entry(chain).or_default().push(fingerprint);
    }
    out
}

/// Every element of `set` in `table`: key bytes -> value. (The kernel
/// dumps a set in pieces and walks it from the start for each piece, so
/// this costs the square of the set's size: for large sets, read the keys
/// wanted with [`read_elements_by_key`].)
pub fn read_elements(
    socket: &mut NfSocket,
    family: IpFamily,
    table: &str,
    set: &str,
) -> io::Result<KernelElements> {
    let replies = socket.request(MsgKind::GetSetElem, family, true, |b| {
        PushSetelemListAttrs::new(b)
            .push_table_bytes(table.as_bytes())
            .push_set_bytes(set.as_bytes());
    })?;
    let mut out = KernelElements::default();
    parse_elements(&replies, &mut out);
    Ok(out)
}

/// Keys asked per request: the kernel answers each with a message of its
/// own, which must fit the socket's receive buffer.
const KEYS_PER_REQUEST: usize = 1000;

/// The elements of `set` among `keys` (absent keys are not in the result),
/// one lookup per key: linear in the keys asked, whatever the set's size.
pub fn read_elements_by_key(
    socket: &mut NfSocket,
    family: IpFamily,
    table: &str,
    set: &str,
    keys: &[&[u8]],
) -> io::Result<KernelElements> {
    let mut out = KernelElements::with_capacity_and_hasher(keys.len(), Default::default());
    let mut rest = keys;
    while !rest.is_empty() {
        let batch = &rest[..rest.len().min(KEYS_PER_REQUEST)];
        let (answered, errno) = socket.request_items_with(
            MsgKind::GetSetElem,
            family,
            |b| push_element_keys(b, table.as_bytes(), set, batch),
            |reply| parse_element_reply(reply, &mut out),
        )?;
        match errno {
            0 => rest = &rest[batch.len()..],
            // The kernel stops at the first absent key: skip it.
            libc::ENOENT => rest = &rest[(answered + 1).min(rest.len())..],
            e => return Err(io::Error::from_raw_os_error(e)),
        }
    }
    Ok(out)
}

fn parse_elements(replies: &[Vec<u8>], out: &mut KernelElements) {
    for reply in replies {
        parse_element_reply(reply, out);
    }
}

/// Adds the elements one reply to a set element dump carries to `out`
/// (elements without a key are skipped).
pub fn parse_element_reply(reply: &[u8], out: &mut KernelElements) {
    let list = SetelemListAttrs::new(reply);
    let Ok(elements) = list.get_elements() else {
        return;
    };
    for elem in elements.get_elem() {
        let Some(key) = elem
            .get_key()
            .ok()
            .and_then(|k| k.get_value().ok())
            .map(<[u8]>::to_vec)
        else {
            continue;
        };
        let value = match elem.get_data() {
            Err(_) => KernelValue::None,
            Ok(data) => match (data.get_value(), data.get_verdict()) {
                (Ok(v), _) => KernelValue::Data(v.to_vec()),
                (_, Ok(verdict)) => KernelValue::Verdict(
                    verdict.get_code().map(|c| c as i32).unwrap_or(i32::MIN),
                    verdict
                        .get_chain()
                        .ok()
                        .map(|c| c.to_string_lossy().into_owned()),
                ),
                _ => KernelValue::None,
            },
        };
        out.insert(key, value);
    }
}

//! The kernel's nftables replies as keelson reads its table back
//! (netplane/src/nftables/readback.rs `parse_table`, `parse_element_reply`;
//! encode.rs `parse_rule_userdata`; inspect.rs `key_text`): netlink
//! attributes of chain, set, rule and set-element dump replies. The input is
//! a sequence of `[kind][u16 length][attributes]` records.
//! Holds: no panic; every chain a rule's slots name is a chain of the table;
//! a key prints as nft prints it or as hex.
#![no_main]

use keelson_netplane::model::IpFamily;
use keelson_netplane::nftables::encode::parse_rule_userdata;
use keelson_netplane::nftables::inspect::key_text;
use keelson_netplane::nftables::readback::{parse_element_reply, parse_table};
use keelson_netplane::nftables::table::KernelElements;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut replies: [Vec<Vec<u8>>; 4] = Default::default();
    let mut rest = data;
    while let [kind, hi, lo, tail @ ..] = rest {
        let n = usize::from(u16::from_be_bytes([*hi, *lo])).min(tail.len());
        replies[usize::from(*kind) % 4].push(tail[..n].to_vec());
        rest = &tail[n..];
    }
    let [chains, sets, rules, elements] = &replies;
    let table = parse_table("keelson", chains, sets, rules);
    for chain in table.chain_slots.keys() {
        assert!(
            table.chains.contains_key(chain),
            "slots of unknown chain {chain:?}"
        );
    }
    for r in rules {
        let _ = parse_rule_userdata(r);
    }
    let mut out = KernelElements::default();
    for e in elements {
        parse_element_reply(e, &mut out);
    }
    for key in out.keys() {
        for family in [IpFamily::V4, IpFamily::V6] {
            let text = key_text(family, key);
            assert!(!text.is_empty());
        }
    }
});

//! Reads a service port's objects back from the kernel and compares them
//! with what the model says they must be (for `keelson diagnose service`):
//! the port is rendered as the backend renders it, then each chain (with
//! its rule count), affinity set and map element (key and verdict or data)
//! is looked up over netlink. Nothing is written. The elements of the
//! per-Service slot maps (`endpoint-slots`, `endpoint-chains`) are keyed
//! by the slot block the running syncer allocated, which only it knows:
//! they are not compared; the chains that use them are.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_bindings::nftables::{
    DataAttrs, PushChainAttrs, PushRuleAttrs, PushSetAttrs, PushSetelemListAttrs, SetelemListAttrs,
};

use super::config::NftablesConfig;
use super::expr::Verdict;
use super::netlink::NfSocket;
use super::objects::Element;
use super::render::{ElementSet, PortSlots, render_port};
use super::wire::MsgKind;
use crate::model::{IpFamily, Protocol, ServicePortState};

/// What the kernel has for one expected object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// As expected.
    Present,
    /// Not in the kernel.
    Missing,
    /// There, but not as expected (what differs).
    Different(String),
}

/// One expected object and what the kernel has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectCheck {
    /// `ip keelson` / `ip6 keelson-services-03`.
    pub table: String,
    /// `chain service-...`, `set affinity-...`, `element 10.96.0.1 . tcp . 80 in service-ips`.
    pub object: String,
    /// What the model wants (`3 rules`, `goto service-...`).
    pub expected: String,
    /// What the kernel has.
    pub found: Found,
}

/// The checks of one service port.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortInspection {
    /// Every expected object.
    pub checks: Vec<ObjectCheck>,
}

impl PortInspection {
    /// The objects that are missing or differ.
    pub fn problems(&self) -> impl Iterator<Item = &ObjectCheck> {
        self.checks.iter().filter(|c| c.found != Found::Present)
    }
}

fn family_word(f: IpFamily) -> &'static str {
    match f {
        IpFamily::V4 => "ip",
        IpFamily::V6 => "ip6",
    }
}

fn addr_of(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => Some(IpAddr::V4(Ipv4Addr::new(
            bytes[0], bytes[1], bytes[2], bytes[3],
        ))),
        16 => {
            let mut b = [0u8; 16];
            b.copy_from_slice(bytes);
            Some(IpAddr::V6(Ipv6Addr::from(b)))
        }
        _ => None,
    }
}

fn proto_name(n: u8) -> String {
    [Protocol::Tcp, Protocol::Udp, Protocol::Sctp]
        .into_iter()
        .find(|p| p.number() == n)
        .map(|p| p.as_nft().to_string())
        .unwrap_or_else(|| n.to_string())
}

/// A key as `nft` prints it: `10.96.0.1 . tcp . 80`, `tcp . 30080`, `10.96.0.1`.
pub fn key_text(family: IpFamily, key: &[u8]) -> String {
    let alen = match family {
        IpFamily::V4 => 4,
        IpFamily::V6 => 16,
    };
    let proto_port = |b: &[u8]| -> Option<String> {
        let proto = *b.first()?;
        let port = u16::from_be_bytes([*b.get(4)?, *b.get(5)?]);
        Some(format!("{} . {port}", proto_name(proto)))
    };
    let text = if key.len() == alen {
        addr_of(key).map(|a| a.to_string())
    } else if key.len() == alen + 8 {
        addr_of(&key[..alen]).and_then(|a| Some(format!("{a} . {}", proto_port(&key[alen..])?)))
    } else if key.len() == 8 {
        proto_port(key)
    } else {
        None
    };
    text.unwrap_or_else(|| {
        format!(
            "0x{}",
            key.iter().map(|b| format!("{b:02x}")).collect::<String>()
        )
    })
}

fn verdict_text(v: &Verdict) -> String {
    match v {
        Verdict::Accept => "accept".into(),
        Verdict::Drop => "drop".into(),
        Verdict::Return => "return".into(),
        Verdict::Jump(c) => format!("jump {c}"),
        Verdict::Goto(c) => format!("goto {c}"),
    }
}

/// A data map element's value, as text (hex bytes).
fn data_text(data: &[u8]) -> String {
    let hex: String = data.iter().map(|b| format!("{b:02x}")).collect();
    format!("data {hex}")
}

/// What an element maps to, as text (`None` for plain set elements).
fn element_value(el: &Element) -> Option<String> {
    el.verdict
        .as_ref()
        .map(verdict_text)
        .or_else(|| el.data.as_deref().map(data_text))
}

/// The verdict of a map element as the kernel returned it.
fn parse_verdict(data: &[u8]) -> Option<String> {
    let v = DataAttrs::new(data).get_verdict().ok()?;
    let raw = v.get_code().ok()?;
    // The code travels big-endian; accept either reading of it.
    let code = [raw as i32, i32::from_be_bytes(raw.to_ne_bytes())]
        .into_iter()
        .find(|c| matches!(c, 0 | 1 | -3 | -4 | -5))?;
    let chain = v.get_chain().ok().map(|c| c.to_string_lossy().into_owned());
    Some(match (code, chain) {
        (0, _) => "drop".into(),
        (1, _) => "accept".into(),
        (-5, _) => "return".into(),
        (-3, Some(c)) => format!("jump {c}"),
        (-4, Some(c)) => format!("goto {c}"),
        (c, _) => format!("verdict {c}"),
    })
}

/// Elements of `set` in `table`: key bytes → verdict text (`None` for plain sets).
fn elements(
    sock: &mut NfSocket,
    family: IpFamily,
    table: &str,
    set: &str,
) -> io::Result<Option<HashMap<Vec<u8>, Option<String>>>> {
    let replies = match sock.request(MsgKind::GetSetElem, family, true, |b| {
        PushSetelemListAttrs::new(b)
            .push_table_bytes(table.as_bytes())
            .push_set_bytes(set.as_bytes());
    }) {
        Ok(r) => r,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut out = HashMap::new();
    for r in &replies {
        let list = SetelemListAttrs::new(r);
        let Ok(elems) = list.get_elements() else {
            continue;
        };
        for e in elems.get_elem() {
            let Some(key) = e
                .get_key()
                .ok()
                .and_then(|k| k.get_value().ok())
                .map(<[u8]>::to_vec)
            else {
                continue;
            };
            let value = e.get_data().ok().and_then(|d| {
                parse_verdict(d.get_buf())
                    .or_else(|| DataAttrs::new(d.get_buf()).get_value().ok().map(data_text))
            });
            out.insert(key, value);
        }
    }
    Ok(Some(out))
}

/// Compares the kernel's objects of one service port with the model.
pub fn inspect_port(
    sock: &mut NfSocket,
    config: &NftablesConfig,
    state: &ServicePortState,
) -> io::Result<PortInspection> {
    let family = state.key.family;
    let mut out = PortInspection::default();
    let part = render_port(state, config, &PortSlots::default());
    let table = config.table.clone();
    let table_label = format!("{} {table}", family_word(family));
    for chain in &part.chains {
        // A rule dump filtered on a chain that is gone is just empty:
        // ask for the chain itself first.
        let exists = match sock.request(MsgKind::GetChain, family, false, |b| {
            PushChainAttrs::new(b)
                .push_table_bytes(table.as_bytes())
                .push_name_bytes(chain.name.as_bytes());
        }) {
            Ok(_) => true,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => false,
            Err(e) => return Err(e),
        };
        let found = match sock.request(MsgKind::GetRule, family, true, |b| {
            PushRuleAttrs::new(b)
                .push_table_bytes(table.as_bytes())
                .push_chain_bytes(chain.name.as_bytes());
        }) {
            _ if !exists => Found::Missing,
            Ok(rules) if rules.len() == chain.rules.len() => Found::Present,
            Ok(rules) => Found::Different(format!("{} rules", rules.len())),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Found::Missing,
            Err(e) => return Err(e),
        };
        out.checks.push(ObjectCheck {
            table: table_label.clone(),
            object: format!("chain {}", chain.name),
            expected: format!("{} rules", chain.rules.len()),
            found,
        });
    }
    for set in &part.affinity_sets {
        let found = match sock.request(MsgKind::GetSet, family, false, |b| {
            PushSetAttrs::new(b)
                .push_table_bytes(table.as_bytes())
                .push_name_bytes(set.name.as_bytes());
        }) {
            Ok(_) => Found::Present,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Found::Missing,
            Err(e) => return Err(e),
        };
        out.checks.push(ObjectCheck {
            table: table_label.clone(),
            object: format!("set {}", set.name),
            expected: "present".into(),
            found,
        });
    }
    // The shared sets' and maps' elements, and each endpoint list's
    // dispatch element and endpoints.
    let mut wanted: Vec<(ElementSet, Element)> = part
        .elements
        .iter()
        .filter(|(set, _)| set.is_shared())
        .cloned()
        .collect();
    for list in &part.lists {
        let (dispatch, endpoints) = list.kind.sets();
        wanted.push((dispatch, list.dispatch_element()));
        wanted.extend(
            (0..list.endpoints.len())
                .filter_map(|i| list.endpoint_element(i).map(|e| (endpoints, e))),
        );
    }
    let mut by_set: Vec<(ElementSet, Vec<&Element>)> = Vec::new();
    for (set, el) in &wanted {
        match by_set.iter_mut().find(|(s, _)| s == set) {
            Some((_, v)) => v.push(el),
            None => by_set.push((*set, vec![el])),
        }
    }
    for (set, els) in by_set {
        let have = elements(sock, family, &table, set.name())?;
        for el in els {
            let expected = element_value(el);
            let found = match &have {
                None => Found::Missing,
                Some(h) => match h.get(&el.key) {
                    None => Found::Missing,
                    Some(v) if *v == expected => Found::Present,
                    Some(v) => Found::Different(v.clone().unwrap_or_else(|| "no value".into())),
                },
            };
            out.checks.push(ObjectCheck {
                table: table_label.clone(),
                object: format!("element {} in {}", key_text(family, &el.key), set.name()),
                expected: expected.unwrap_or_else(|| "present".into()),
                found,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nftables::render::{addr_proto_port_key, proto_port_key};

    #[test]
    fn keys_read_as_nft_prints_them() {
        let ip: IpAddr = "10.96.0.10".parse().expect("ip");
        assert_eq!(
            key_text(IpFamily::V4, &addr_proto_port_key(&ip, Protocol::Tcp, 80)),
            "10.96.0.10 . tcp . 80"
        );
        assert_eq!(
            key_text(IpFamily::V4, &proto_port_key(Protocol::Udp, 30053)),
            "udp . 30053"
        );
        assert_eq!(key_text(IpFamily::V4, &[10, 96, 0, 10]), "10.96.0.10");
        let v6: IpAddr = "fd00::a".parse().expect("ip");
        assert_eq!(
            key_text(IpFamily::V6, &addr_proto_port_key(&v6, Protocol::Tcp, 443)),
            "fd00::a . tcp . 443"
        );
        assert_eq!(key_text(IpFamily::V4, &[1, 2]), "0x0102");
    }
}

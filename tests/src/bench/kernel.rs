//! What a contestant left in the kernel: nftables objects in its node
//! namespace (`nft -j list ruleset`, i.e. netlink, run in that namespace —
//! iptables-nft rules included), entries of keelson's pinned eBPF maps,
//! and conntrack entries (to see which path translated the probes).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::{BenchError, Result};
use crate::netns::{NetNs, run_cmd};

/// Object counts of a namespace's nftables ruleset (and eBPF maps).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelCounts {
    /// Tables, as `family name`.
    pub tables: Vec<String>,
    /// Chains.
    pub chains: usize,
    /// Rules.
    pub rules: usize,
    /// Sets and maps.
    pub sets: usize,
    /// Elements of all sets and maps.
    pub elements: usize,
    /// Entries per pinned eBPF map (eBPF mode).
    pub bpf_map_entries: BTreeMap<String, usize>,
}

/// eBPF maps holding per-connection state (not Service state): left out
/// of [`KernelCounts::bpf_service_entries`].
pub const PER_CONNECTION_MAPS: [&str; 2] = ["kl_revnat", "kl_affinity"];

impl KernelCounts {
    /// Entries of the eBPF maps that describe Services and endpoints.
    pub fn bpf_service_entries(&self) -> usize {
        self.bpf_map_entries
            .iter()
            .filter(|(name, _)| !PER_CONNECTION_MAPS.contains(&name.as_str()))
            .map(|(_, n)| n)
            .sum()
    }

    /// Rules + set/map elements + Service eBPF map entries: the kernel
    /// objects a contestant keeps for its Services.
    pub fn objects(&self) -> usize {
        self.rules + self.elements + self.bpf_service_entries()
    }

    /// Chains + rules: what the kernel walks when it validates a table.
    pub fn chains_and_rules(&self) -> usize {
        self.chains + self.rules
    }
}

/// Counts the objects of `nft -j list ruleset` output.
pub fn parse_nft_json(text: &str) -> Result<KernelCounts> {
    let doc: Value = serde_json::from_str(text)
        .map_err(|e| BenchError::Invalid(format!("nft -j output: {e}")))?;
    let items = doc["nftables"]
        .as_array()
        .ok_or_else(|| BenchError::Invalid("nft -j output has no nftables array".into()))?;
    let mut c = KernelCounts::default();
    for item in items {
        let Some(obj) = item.as_object() else {
            continue;
        };
        for (kind, v) in obj {
            match kind.as_str() {
                "table" => c.tables.push(format!(
                    "{} {}",
                    v["family"].as_str().unwrap_or("?"),
                    v["name"].as_str().unwrap_or("?")
                )),
                "chain" => c.chains += 1,
                "rule" => c.rules += 1,
                "set" | "map" => {
                    c.sets += 1;
                    c.elements += v["elem"].as_array().map_or(0, Vec::len);
                }
                _ => {}
            }
        }
    }
    Ok(c)
}

/// Counts the nftables objects in `ns`.
pub fn nft_counts(ns: &NetNs) -> Result<KernelCounts> {
    let out = ns.exec("nft", &["-j", "list", "ruleset"])?;
    parse_nft_json(&out)
}

/// Counts the chains (`:NAME` lines) and rules (`-A` lines) of
/// `iptables-save` output, every table included.
pub fn parse_iptables_save(text: &str) -> (usize, usize) {
    let chains = text.lines().filter(|l| l.starts_with(':')).count();
    let rules = text.lines().filter(|l| l.starts_with("-A ")).count();
    (chains, rules)
}

/// Adds the legacy iptables objects of `ns` (IPv4 and IPv6) to `c`: they
/// are not nftables objects, so `nft list ruleset` does not see them.
pub fn add_legacy_iptables(ns: &NetNs, c: &mut KernelCounts) -> Result<()> {
    for save in ["iptables-legacy-save", "ip6tables-legacy-save"] {
        let (chains, rules) = parse_iptables_save(&ns.exec(save, &[])?);
        c.chains += chains;
        c.rules += rules;
        if rules > 0 {
            c.tables.push(format!("{save} ({rules} rules)"));
        }
    }
    Ok(())
}

/// Counts the entries of every map pinned in `maps_dir` (`bpftool -j map
/// dump pinned`).
pub fn bpf_map_entries(maps_dir: &Path) -> Result<BTreeMap<String, usize>> {
    let mut out = BTreeMap::new();
    let dir = std::fs::read_dir(maps_dir)
        .map_err(|e| BenchError::io(format!("listing {}", maps_dir.display()), e))?;
    for entry in dir {
        let entry = entry.map_err(|e| BenchError::io("listing pinned maps", e))?;
        let path = entry.path();
        let text = run_cmd(
            "bpftool",
            &["-j", "map", "dump", "pinned", &path.display().to_string()],
        )?;
        let doc: Value = serde_json::from_str(&text).map_err(|e| {
            BenchError::Invalid(format!("bpftool output for {}: {e}", path.display()))
        })?;
        out.insert(
            entry.file_name().to_string_lossy().into_owned(),
            doc.as_array().map_or(0, Vec::len),
        );
    }
    Ok(out)
}

/// Counts `conntrack -L` lines: (all TCP entries, entries whose original
/// destination is inside `cidr` — i.e. connections NATed by netfilter from
/// a Service address, which socket-level load balancing never creates).
pub fn parse_conntrack(text: &str, cidr: &ipnet::IpNet) -> (usize, usize) {
    let mut total = 0;
    let mut to_cidr = 0;
    for line in text.lines() {
        let Some(dst) = line.split_whitespace().find_map(|w| w.strip_prefix("dst=")) else {
            continue;
        };
        total += 1;
        if dst.parse::<IpAddr>().is_ok_and(|ip| cidr.contains(&ip)) {
            to_cidr += 1;
        }
    }
    (total, to_cidr)
}

/// [`parse_conntrack`] of the TCP conntrack table of `ns`.
pub fn conntrack_entries(ns: &NetNs, cidr: &ipnet::IpNet) -> Result<(usize, usize)> {
    let out = ns.exec("conntrack", &["-L", "-p", "tcp"])?;
    Ok(parse_conntrack(&out, cidr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_nft_objects() {
        let text = r#"{"nftables": [
            {"metainfo": {"version": "1.0.6"}},
            {"table": {"family": "ip", "name": "keelson", "handle": 1}},
            {"chain": {"family": "ip", "table": "keelson", "name": "services"}},
            {"chain": {"family": "ip", "table": "keelson", "name": "svc-a"}},
            {"map": {"name": "service-ips", "elem": [[{"concat": []}, {"goto": "x"}], [1, 2]]}},
            {"set": {"name": "cluster-ips", "elem": ["10.96.0.1"]}},
            {"set": {"name": "empty"}},
            {"rule": {"chain": "services"}},
            {"rule": {"chain": "svc-a"}},
            {"rule": {"chain": "svc-a"}}
        ]}"#;
        let c = parse_nft_json(text).expect("parse");
        assert_eq!(c.tables, vec!["ip keelson"]);
        assert_eq!((c.chains, c.rules, c.sets, c.elements), (2, 3, 3, 3));
        assert_eq!(c.objects(), 6);
        let mut e = c.clone();
        e.bpf_map_entries = [("kl_services", 2), ("kl_backends", 4), ("kl_revnat", 90)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        assert_eq!(e.bpf_service_entries(), 6);
        assert_eq!(e.objects(), 12);
        assert!(parse_nft_json("{}").is_err());
        assert!(parse_nft_json("not json").is_err());
    }

    #[test]
    fn counts_iptables_save_objects() {
        let text = "# Generated by iptables-save\n*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n-A PREROUTING -j KUBE-SERVICES\n-A KUBE-SERVICES -d 10.96.0.1/32 -j KUBE-SVC-X\nCOMMIT\n*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n";
        assert_eq!(parse_iptables_save(text), (3, 2));
        assert_eq!(parse_iptables_save(""), (0, 0));
    }

    #[test]
    fn counts_conntrack_entries_to_a_cidr() {
        let text = "tcp      6 8 CLOSE src=10.250.2.1 dst=10.96.0.12 sport=40000 dport=80 src=10.128.0.5 dst=10.250.2.1 sport=8080 dport=40000 [ASSURED] mark=0 use=1\n\
                    tcp      6 8 CLOSE src=10.250.2.1 dst=10.128.0.7 sport=40001 dport=8080 src=10.128.0.7 dst=10.250.2.1 sport=8080 dport=40001 mark=0 use=1\n";
        let cidr: ipnet::IpNet = "10.96.0.0/12".parse().expect("cidr");
        assert_eq!(parse_conntrack(text, &cidr), (2, 1));
        assert_eq!(parse_conntrack("", &cidr), (0, 0));
    }
}

//! docs/configuration.md documents every configuration field: each key path
//! of the effective default configuration appears in it.

use keelson::config::Config;

fn paths(prefix: &str, v: &serde_yaml::Value, out: &mut Vec<String>) {
    if let serde_yaml::Value::Mapping(m) = v {
        for (k, child) in m {
            let Some(k) = k.as_str() else { continue };
            let p = if prefix.is_empty() {
                k.to_string()
            } else {
                format!("{prefix}.{k}")
            };
            // Maps of user-chosen keys (evictionHard, nodeLabels, ...) end here.
            let is_free_map = matches!(
                k,
                "evictionHard"
                    | "evictionSoft"
                    | "evictionSoftGracePeriod"
                    | "evictionMinimumReclaim"
                    | "kubeReserved"
                    | "systemReserved"
                    | "nodeLabels"
            );
            out.push(p.clone());
            if !is_free_map {
                paths(&p, child, out);
            }
        }
    }
}

#[test]
fn every_field_is_documented() {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/configuration.md"
    ))
    .expect("docs/configuration.md");
    let value = serde_yaml::to_value(Config::default()).expect("config renders");
    let mut all = Vec::new();
    paths("", &value, &mut all);
    let missing: Vec<_> = all
        .iter()
        .filter(|p| {
            // Document rows name the field relative to its section.
            let rel = p
                .strip_prefix("node.")
                .or_else(|| p.strip_prefix("proxy."))
                .unwrap_or(p);
            let is_section = matches!(p.as_str(), "node" | "proxy" | "logging")
                || p.ends_with(".clientConnection")
                || p.ends_with(".nftables")
                || p.ends_with(".conntrack")
                || p.ends_with(".ebpf")
                || p.ends_with(".authentication")
                || p.ends_with(".authorization")
                || p.ends_with(".x509")
                || p.ends_with(".webhook")
                || p.ends_with(".anonymous");
            !is_section && !doc.contains(&format!("`{rel}`"))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "fields missing from docs/configuration.md: {missing:?}"
    );
}

//! The configuration files keelson reads: its own (agent/src/config
//! `Config::from_yaml_str`), upstream's KubeletConfiguration and
//! KubeProxyConfiguration (agent/src/config/upstream: YAML to JSON, then
//! `kubelet::apply` / `proxy::apply`) and kubeadm's flags file
//! (`kubeadm_flags::parse`, `parse_taints`).
//! Holds: no panic; a configuration that loads prints to YAML that loads
//! back to the same configuration.
#![no_main]

use std::path::Path;

use keelson::config::Config;
use keelson::config::upstream::{Report, kubeadm_flags, kubelet, proxy, reader};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(cfg) = Config::from_yaml_str(text)
        && let Ok(printed) = serde_yaml::to_string(&cfg)
    {
        let back = Config::from_yaml_str(&printed).unwrap_or_else(|e| {
            panic!("{text:?} printed as {printed:?}, which does not load: {e}")
        });
        assert_eq!(back, cfg, "{text:?} printed as {printed:?}");
    }
    if let Ok(doc) = reader::parse_yaml(text) {
        let mut report = Report::default();
        let mut cfg = Config::default();
        kubelet::apply(
            &mut cfg,
            doc.clone(),
            Path::new("/nonexistent/keelson-fuzz"),
            &mut report,
        );
        let mut cfg = Config::default();
        let _ = proxy::apply(&mut cfg, doc, &mut report);
    }
    let mut report = Report::default();
    let _ = kubeadm_flags::parse(text, &mut report);
    let _ = kubeadm_flags::parse_taints(text);
});

//! The Prometheus registry shared by both roles. Process metrics
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`, ...) and
//! `keelson_build_info` are registered here; each role registers its own
//! metrics, using upstream names where the meaning is the same.

use prometheus::{Encoder, IntGaugeVec, Opts, Registry, TextEncoder};

use crate::version;

/// Creates the registry with process and build-info metrics.
pub fn new_registry() -> Registry {
    let registry = Registry::new();
    #[cfg(target_os = "linux")]
    {
        let pc = prometheus::process_collector::ProcessCollector::for_self();
        if let Err(e) = registry.register(Box::new(pc)) {
            tracing::warn!(error = %e, "cannot register process metrics");
        }
    }
    if let Ok(info) = IntGaugeVec::new(
        Opts::new("keelson_build_info", "keelson build information; always 1"),
        &["version", "kubernetes_version"],
    ) {
        info.with_label_values(&[version::KEELSON_VERSION, version::KUBERNETES_VERSION])
            .set(1);
        if let Err(e) = registry.register(Box::new(info)) {
            tracing::warn!(error = %e, "cannot register build info metric");
        }
    }
    registry
}

/// Renders every metric in the Prometheus text exposition format.
pub fn render(registry: &Registry) -> String {
    let mut buf = Vec::new();
    if let Err(e) = TextEncoder::new().encode(&registry.gather(), &mut buf) {
        return format!("# error encoding metrics: {e}\n");
    }
    String::from_utf8_lossy(&buf).into_owned()
}

/// Registers a collector, logging (not failing) when the name is taken: a
/// duplicate registration is a programming error that must not stop a node.
pub fn register<C: prometheus::core::Collector + 'static>(registry: &Registry, c: C) {
    if let Err(e) = registry.register(Box::new(c)) {
        tracing::warn!(error = %e, "metric registration failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_build_info_and_process_metrics() {
        let r = new_registry();
        let text = render(&r);
        assert!(text.contains("keelson_build_info{"), "{text}");
        assert!(text.contains("process_resident_memory_bytes"), "{text}");
    }
}

//! The eviction signals measured now, as the eviction manager measures
//! them (the node's statistics sampler, `StatsSummary` and
//! `signals::observations`), each against its
//! configured threshold: what `diagnose node` and `diagnose pod` show of
//! the node's resource pressure.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::context::Context;
use super::words;
use crate::config::eviction::Signal;
use crate::node::eviction::manager::EvictionConfig;
use crate::node::eviction::signals;
use crate::node::eviction::stats_summary::StatsSummary;
use crate::node::eviction::summary::{Summary, SummaryProvider};
use crate::node::volumes::stats_sources::OnDisk;

/// One signal against one threshold.
#[derive(Debug, Clone)]
pub struct Reading {
    /// The signal (`memory.available`, …).
    pub signal: Signal,
    /// `evictionHard` or `evictionSoft`.
    pub kind: &'static str,
    /// What is available, as text (bytes for memory and storage).
    pub available: String,
    /// The threshold, as text.
    pub limit: String,
    /// Below the threshold: the eviction manager acts.
    pub below: bool,
    /// Within twice the threshold.
    pub near: bool,
}

/// Measures the node (and per-pod usage of `pods`) and reads every
/// configured threshold against it; `None` without a runtime or figures.
pub async fn measure(ctx: &Context, pods: &[Arc<Pod>]) -> Option<(Summary, Vec<Reading>)> {
    let cri = ctx.cri.as_ref()?;
    let n = &ctx.config.node;
    let volumes = OnDisk::new(n.root_dir.clone(), pods.to_vec());
    let stats = StatsSummary::standalone(&ctx.node, n, cri.clone(), &volumes).await;
    let summary = stats.summary(pods).await.ok()?;
    let observed = signals::observations(&summary);
    let readings = EvictionConfig::from_node_config(n)
        .thresholds
        .iter()
        .filter_map(|t| {
            let o = observed.get(&t.signal)?;
            let limit = signals::quantity(t.value, o.capacity);
            let bytes = matches!(
                signals::signal_resource(t.signal),
                "memory" | "ephemeral-storage"
            );
            let text = |v: i64| {
                if bytes {
                    words::bytes(v)
                } else {
                    v.to_string()
                }
            };
            Some(Reading {
                signal: t.signal,
                kind: if t.hard {
                    "evictionHard"
                } else {
                    "evictionSoft"
                },
                available: text(o.available),
                limit: text(limit),
                below: o.available < limit,
                near: o.available < limit.saturating_mul(2),
            })
        })
        .collect();
    Some((summary, readings))
}

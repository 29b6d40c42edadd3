//! `proxy.mode: ebpf`: the socket LB for ClusterIP TCP/UDP plus the
//! nftables backend for everything else, both from the same model.
//!
//! The nftables half is the ordinary nftables backend, given the same diffs:
//! it renders the whole model, so it answers whatever the socket LB leaves
//! untranslated (NodePort, externalIPs, load-balancer IPs, SCTP, Service
//! ports without endpoints, traffic of processes outside the attached
//! cgroup, packets routed through the node). Socket-translated connections
//! never carry a Service address on the wire, so they never meet those
//! rules.

use crate::backend::{Backend, BackendError, SyncOutcome};
use crate::model::{ProxyDiff, ProxySnapshot};

use super::error::EbpfError;
use super::lb::{EbpfConfig, SocketLb, check_support};
use super::render::{changes_of, desired_of};
use super::sync::{SyncErrors, SyncStats};

/// The eBPF-mode backend.
pub struct EbpfBackend {
    lb: SocketLb,
    north_south: Box<dyn Backend>,
}

impl std::fmt::Debug for EbpfBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EbpfBackend")
            .field("lb", &self.lb)
            .field("north_south", &self.north_south.name())
            .finish()
    }
}

impl EbpfBackend {
    /// Attaches the socket LB (see [`SocketLb::start`]) and pairs it with
    /// the nftables backend that serves north-south traffic. Call
    /// [`super::check_support`] first to decide on a fallback.
    pub fn new(config: &EbpfConfig, north_south: Box<dyn Backend>) -> Result<Self, EbpfError> {
        let (lb, stats) = SocketLb::start(config)?;
        if stats.deletes > 0 {
            tracing::info!(
                deleted = stats.deletes,
                "removed stale socket-LB map entries left by a previous run"
            );
        }
        Ok(EbpfBackend { lb, north_south })
    }

    /// The socket LB (diagnostics: affinity and reverse-translation entries).
    pub fn socket_lb(&self) -> &SocketLb {
        &self.lb
    }
}

/// The backend of `proxy.mode: ebpf` as the wiring builds it: checks that
/// the kernel and node support the socket LB, then pairs it with
/// `north_south` (the nftables backend). When they do not, and
/// `fallback_to_nftables` (`proxy.ebpf.fallbackToNftables`) is set, the
/// reason is logged and `north_south` alone is returned (plain nftables
/// mode); otherwise the `Unsupported` error says what is missing.
pub fn ebpf_mode_backend(
    config: &EbpfConfig,
    north_south: Box<dyn Backend>,
    fallback_to_nftables: bool,
) -> Result<Box<dyn Backend>, EbpfError> {
    match check_support(config) {
        Ok(()) => Ok(Box::new(EbpfBackend::new(config, north_south)?)),
        Err(EbpfError::Unsupported { reason }) if fallback_to_nftables => {
            tracing::warn!(
                %reason,
                "eBPF socket LB unsupported here; falling back to nftables for all Service traffic"
            );
            Ok(north_south)
        }
        Err(e) => Err(e),
    }
}

fn outcome(stats: SyncStats) -> SyncOutcome {
    SyncOutcome {
        objects_changed: stats.puts + stats.deletes,
        messages: stats.puts + stats.deletes,
        repaired: false,
    }
}

fn sync_error(e: SyncErrors) -> BackendError {
    BackendError::Refused {
        what: "socket-LB BPF maps".to_string(),
        message: e.to_string(),
        errno: None,
    }
}

fn merge(a: SyncOutcome, b: SyncOutcome) -> SyncOutcome {
    SyncOutcome {
        objects_changed: a.objects_changed + b.objects_changed,
        messages: a.messages + b.messages,
        repaired: a.repaired || b.repaired,
    }
}

impl Backend for EbpfBackend {
    fn name(&self) -> &'static str {
        "ebpf"
    }

    /// The socket LB first, then nftables. BPF maps have no multi-entry
    /// transaction: on `Err` some service ports may already carry the new
    /// state, each one whole (never a half-written service). The syncer
    /// keeps the desired state, so the caller's retry of the same changes
    /// converges and rewrites nothing that is already right.
    fn sync(&mut self, diff: &ProxyDiff) -> Result<SyncOutcome, BackendError> {
        let lb = self.lb.apply(changes_of(diff)).map_err(sync_error)?;
        let ns = self.north_south.sync(diff)?;
        Ok(merge(outcome(lb), ns))
    }

    fn full_sync(&mut self, snapshot: &ProxySnapshot) -> Result<SyncOutcome, BackendError> {
        let t0 = std::time::Instant::now();
        let desired = desired_of(snapshot);
        let t1 = std::time::Instant::now();
        let (lb, repaired) = self
            .lb
            .verify_and_replace_all(desired)
            .map_err(sync_error)?;
        let t2 = std::time::Instant::now();
        let mut lb = outcome(lb);
        lb.repaired = repaired;
        let ns = self.north_south.full_sync(snapshot)?;
        let ms = |d: std::time::Duration| (d.as_secs_f64() * 1e4).round() / 10.0;
        tracing::debug!(
            render_ms = ms(t1 - t0),
            socket_lb_ms = ms(t2 - t1),
            nftables_ms = ms(t2.elapsed()),
            socket_lb_writes = lb.objects_changed,
            "eBPF full sync"
        );
        Ok(merge(lb, ns))
    }

    fn cleanup(&mut self) -> Result<(), BackendError> {
        let lb = self.lb.remove().map_err(|e| BackendError::Io {
            context: "removing the eBPF socket LB".to_string(),
            source: std::io::Error::other(e.to_string()),
        });
        let ns = self.north_south.cleanup();
        lb.and(ns)
    }
}

impl From<EbpfError> for BackendError {
    fn from(e: EbpfError) -> Self {
        match e {
            EbpfError::Unsupported { reason } => BackendError::Unsupported(reason),
            EbpfError::Io {
                context,
                path,
                source,
            } => BackendError::Io {
                context: format!("{context} ({})", path.display()),
                source,
            },
            other => BackendError::Refused {
                what: "eBPF socket LB".to_string(),
                message: other.to_string(),
                errno: None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nft;

    impl Backend for Nft {
        fn name(&self) -> &'static str {
            "nftables"
        }
        fn sync(&mut self, _: &ProxyDiff) -> Result<SyncOutcome, BackendError> {
            Ok(SyncOutcome::default())
        }
        fn full_sync(&mut self, _: &ProxySnapshot) -> Result<SyncOutcome, BackendError> {
            Ok(SyncOutcome::default())
        }
        fn cleanup(&mut self) -> Result<(), BackendError> {
            Ok(())
        }
    }

    fn not_a_cgroup() -> (tempfile::TempDir, EbpfConfig) {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = EbpfConfig {
            cgroup_path: Some(dir.path().to_path_buf()),
            bpffs_path: dir.path().join("bpf/keelson"),
        };
        (dir, config)
    }

    #[test]
    fn unsupported_node_falls_back_to_nftables_when_configured() {
        let (_dir, config) = not_a_cgroup();
        let b = ebpf_mode_backend(&config, Box::new(Nft), true).expect("fallback");
        assert_eq!(b.name(), "nftables");
    }

    #[test]
    fn unsupported_node_is_an_error_naming_the_reason_otherwise() {
        let (dir, config) = not_a_cgroup();
        match ebpf_mode_backend(&config, Box::new(Nft), false) {
            Err(EbpfError::Unsupported { reason }) => {
                assert!(
                    reason.contains(&dir.path().display().to_string()),
                    "{reason}"
                );
            }
            Err(e) => panic!("expected Unsupported, got {e}"),
            Ok(b) => panic!("expected Unsupported, got backend {}", b.name()),
        }
    }

    #[test]
    fn unsupported_maps_to_the_backend_error_of_the_same_name() {
        let e: BackendError = EbpfError::Unsupported {
            reason: "kernel 5.4".into(),
        }
        .into();
        assert_eq!(e.reason(), "Unsupported");
    }
}

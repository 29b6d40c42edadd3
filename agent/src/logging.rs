//! Process-wide `tracing` setup: text (default) or JSON lines on stderr,
//! filtered by `logging.level` unless `RUST_LOG` is set.

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::FmtSpan;

use crate::config::{LogFormat, LoggingConfig};

/// Installs the global subscriber. Calling it twice is harmless (the second
/// call keeps the first subscriber), which tests rely on.
pub fn init(cfg: &LoggingConfig) {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| EnvFilter::try_new(v).ok())
        .or_else(|| EnvFilter::try_new(&cfg.level).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_span_events(FmtSpan::NONE)
        .with_target(true);
    let _ = match cfg.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
    };
}

//! Parts both upstream component configurations share: their `TypeMeta`
//! and component-base's `LoggingConfiguration`.

use super::reader::{Default, Object, Report};
use crate::config::{Config, LogFormat};

/// Checks `apiVersion` and `kind`.
pub fn check_type_meta(o: &mut Object, api_version: &str, kind: &str, report: &mut Report) {
    match o.get::<String>("apiVersion", report).as_deref() {
        Some(v) if v == api_version => {}
        other => report.error(
            "apiVersion",
            format!("must be {api_version:?}, got {:?}", other.unwrap_or("")),
        ),
    }
    match o.get::<String>("kind", report).as_deref() {
        Some(k) if k == kind => {}
        other => report.error(
            "kind",
            format!("must be {kind:?}, got {:?}", other.unwrap_or("")),
        ),
    }
}

/// `logging` (component-base `LoggingConfiguration`): `format` and
/// `verbosity` map to keelson's logging; the Go logger's buffering knobs do
/// not apply (keelson writes each line as it comes) and are accepted.
pub fn apply_logging(cfg: &mut Config, o: &mut Object, report: &mut Report) {
    let mut l = o.object("logging", report);
    match l.string("format", report).as_deref() {
        None | Some("text") => {}
        Some("json") => cfg.logging.format = LogFormat::Json,
        Some(other) => report.error(
            "logging.format",
            format!("must be \"text\" or \"json\", got {other:?}"),
        ),
    }
    if let Some(v) = l.get::<i64>("verbosity", report) {
        cfg.logging.level = level_for_verbosity(v).to_string();
    }
    l.unimplemented(
        "vmodule",
        Default::Empty,
        "log filters use tracing directives",
        report,
    );
    l.accept_any("flushFrequency", report);
    l.accept_any("options", report);
    l.finish(report);
}

/// klog verbosity → a tracing level: 0–3 info (the usual `-v=2` of a
/// kubelet is keelson's info), 4–5 debug, 6 and more trace.
pub fn level_for_verbosity(v: i64) -> &'static str {
    match v {
        i64::MIN..=3 => "info",
        4..=5 => "debug",
        _ => "trace",
    }
}

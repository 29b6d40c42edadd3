//! Error messages with their causes: `kube::Error`'s own text says "client
//! error (Connect)"; operators need the "connection refused" underneath.

use std::error::Error;
use std::fmt::Write;

/// Renders an error and every source below it, joined by `: `, skipping
/// causes whose text the previous message already contains.
pub fn error_chain(e: &(dyn Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let text = s.to_string();
        if !out.contains(&text) {
            let _ = write!(out, ": {text}");
        }
        cur = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn joins_sources() {
        let e = Outer(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused",
        ));
        assert_eq!(error_chain(&e), "outer: connection refused");
    }
}

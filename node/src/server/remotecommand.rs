//! The stream options of exec and attach (`remotecommand`), which the
//! plain proxy ([`super::streaming`]) and the WebSocket translator
//! ([`super::ws_translator`]) both read.

/// The stream options of an exec/attach query (`remotecommand.NewOptions`:
/// the parameters `input`, `output`, `error`, `tty`, `1` for true).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamOptions {
    /// `input=1`.
    pub stdin: bool,
    /// `output=1`.
    pub stdout: bool,
    /// `error=1` (dropped with a tty).
    pub stderr: bool,
    /// `tty=1`.
    pub tty: bool,
}

/// An exec/attach asking for no stream at all (kubelet's text).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("you must specify at least 1 of stdin, stdout, stderr")]
pub struct NoStreams;

/// Parses and checks the stream options.
pub fn stream_options(pairs: &[(String, String)]) -> Result<StreamOptions, NoStreams> {
    let flag = |k: &str| {
        pairs
            .iter()
            .find(|(n, _)| n == k)
            .is_some_and(|(_, v)| v == "1")
    };
    let mut o = StreamOptions {
        stdin: flag("input"),
        stdout: flag("output"),
        stderr: flag("error"),
        tty: flag("tty"),
    };
    if o.tty && o.stderr {
        // kubelet bypasses stderr with a tty.
        o.stderr = false;
    }
    if !o.stdin && !o.stdout && !o.stderr {
        return Err(NoStreams);
    }
    Ok(o)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    fn q(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn stream_options_as_kubelet() {
        let o = stream_options(&q(&[("input", "1"), ("tty", "1"), ("error", "1")])).unwrap();
        assert!(o.stdin && o.tty && !o.stderr);
        // Only the API's parameter names count, and only "1".
        assert_eq!(
            stream_options(&q(&[("input", "true"), ("stdout", "1")]))
                .unwrap_err()
                .to_string(),
            "you must specify at least 1 of stdin, stdout, stderr"
        );
    }
}

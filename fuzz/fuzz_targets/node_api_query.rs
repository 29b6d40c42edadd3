//! The :10250 request router's path parameters (server/routes.rs `params`)
//! and the query decoders behind it: percent-decoded pairs
//! (server/basic.rs `url_pairs`), exec/attach stream options
//! (server/remotecommand.rs) and containerLogs options
//! (logs/options.rs `LogOptions::from_query`).
//! Holds: no panic; path parameters are non-empty single segments that
//! rebuild the path; a query without `%`, `+` or `=` decodes to its own
//! pieces; accepted log options pass their own validation (no negative
//! tail, limit or since).
#![no_main]

use keelson_node::fuzzing::{route_params, stream_options, url_pairs};
use keelson_node::logs::LogOptions;
use libfuzzer_sys::fuzz_target;

const PREFIXES: [&str; 6] = [
    "/containerLogs/",
    "/exec/",
    "/attach/",
    "/run/",
    "/portForward/",
    "/healthz/",
];

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (path, query) = text.split_once('?').unwrap_or((text, ""));
    for prefix in PREFIXES {
        if let Some(segs) = route_params(path, prefix) {
            assert!(segs.iter().all(|s| !s.is_empty() && !s.contains('/')));
            let rest = path.strip_prefix(prefix).unwrap_or_default();
            assert_eq!(segs.join("/"), rest.trim_end_matches('/'));
        }
    }
    let pairs = url_pairs(query);
    if !query.contains(['%', '+', '=']) {
        let plain: Vec<&str> = query.split('&').filter(|p| !p.is_empty()).collect();
        assert_eq!(pairs.len(), plain.len());
        for ((k, v), p) in pairs.iter().zip(plain) {
            assert_eq!((k.as_str(), v.as_str()), (p, ""));
        }
    }
    if let Ok(o) = stream_options(&pairs) {
        assert!(!(o.tty && o.stderr), "stderr kept with a tty");
    }
    if let Ok(o) = LogOptions::from_query(&pairs) {
        assert!(
            o.tail_lines.is_none_or(|n| n >= 0),
            "negative tail accepted"
        );
        assert!(
            o.limit_bytes.is_none_or(|n| n >= 1),
            "limitBytes < 1 accepted"
        );
        assert!(
            o.since_seconds.is_none_or(|n| n >= 1),
            "sinceSeconds < 1 accepted"
        );
    }
});

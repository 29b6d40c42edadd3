//! The WebSocket side of exec/attach/port-forward: the subprotocol
//! negotiation on the upgrade request's headers (server/wsstream.rs) and the
//! runtime's error channel as the translator decodes it
//! (server/ws_translator.rs `decode_error_stream`, channel 3 of v4/v5).
//! Holds: no panic; the status written back is JSON that reads back; the
//! protocols offered are the header's comma-separated tokens.
#![no_main]

use http::{HeaderMap, HeaderValue, header};
use keelson_node::fuzzing::{
    decode_error_stream, is_websocket_request, requested_protocols, with_stream_close_protocol,
    with_tunneling_protocol,
};
use libfuzzer_sys::fuzz_target;

const PROTOCOLS: [&str; 5] = [
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
];

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    // The error channel's payload, under each protocol.
    let status = decode_error_stream(PROTOCOLS[usize::from(sel) % PROTOCOLS.len()], rest);
    let json = status.to_json();
    let v: serde_json::Value =
        serde_json::from_slice(&json).unwrap_or_else(|e| panic!("status is not JSON: {e}"));
    assert!(
        v["status"] == "Success" || v["status"] == "Failure",
        "status field {:?}",
        v["status"]
    );

    // The same bytes as header values of an upgrade request.
    let mut h = HeaderMap::new();
    let mut parts = rest.splitn(3, |b| *b == b'\n');
    for name in [
        header::SEC_WEBSOCKET_PROTOCOL,
        header::UPGRADE,
        header::CONNECTION,
    ] {
        if let Some(v) = parts.next().and_then(|p| HeaderValue::from_bytes(p).ok()) {
            h.append(name, v);
        }
    }
    let offered = requested_protocols(&h);
    for p in &offered {
        assert!(!p.contains(','), "protocol {p:?} keeps a separator");
    }
    let _ = is_websocket_request(&h);
    let _ = with_stream_close_protocol(&h);
    let _ = with_tunneling_protocol(&h);
});

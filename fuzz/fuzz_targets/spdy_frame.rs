//! The SPDY/3.1 frame and header-block decoder (node/src/server/spdy/frame.rs),
//! fed the bytes a client sends to an exec/attach/port-forward upgrade.
//! Holds: no panic; a DATA frame re-encodes to exactly the bytes it was read
//! from; every decoded frame re-encodes, and what it re-encodes to decodes to
//! the same frames and encodes again to the same bytes.
#![no_main]

use bytes::BytesMut;
use keelson_node::fuzzing::{Decoder, Encoder, Frame};
use libfuzzer_sys::fuzz_target;

fn encode_all(frames: &[Frame]) -> Option<BytesMut> {
    let mut enc = Encoder::new().ok()?;
    let mut out = BytesMut::new();
    for f in frames {
        enc.encode(f, &mut out).ok()?;
    }
    Some(out)
}

fn decode_all(mut buf: BytesMut) -> (Vec<Frame>, BytesMut) {
    let mut dec = Decoder::new();
    let mut frames = Vec::new();
    while let Ok(Some(f)) = dec.decode(&mut buf) {
        frames.push(f);
    }
    (frames, buf)
}

fuzz_target!(|data: &[u8]| {
    let mut dec = Decoder::new();
    let mut buf = BytesMut::from(data);
    let mut frames = Vec::new();
    loop {
        let before = buf.len();
        match dec.decode(&mut buf) {
            Ok(Some(f)) => {
                if let Frame::Data { .. } = &f {
                    let read = &data[data.len() - before..data.len() - buf.len()];
                    let again = encode_all(std::slice::from_ref(&f));
                    assert_eq!(
                        again.as_deref(),
                        Some(read),
                        "DATA frame re-encodes differently"
                    );
                }
                frames.push(f);
            }
            Ok(None) | Err(_) => break,
        }
    }
    // Unknown control frames are dropped on the way out (nothing to send).
    frames.retain(|f| !matches!(f, Frame::Unknown(_)));
    let Some(wire) = encode_all(&frames) else {
        return;
    };
    let (back, rest) = decode_all(wire.clone());
    assert!(rest.is_empty(), "re-encoded frames leave bytes over");
    assert_eq!(back, frames, "re-encoded frames decode differently");
    let again = encode_all(&back);
    assert_eq!(again.as_ref(), Some(&wire), "encoding is not stable");
});

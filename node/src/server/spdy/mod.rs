//! A SPDY/3.1 client, as much as kubelet's WebSocket stream translator
//! needs toward the runtime's streaming server (remotecommand v4 over
//! SPDY, `k8s.io/streaming/pkg/httpstream/spdy` on moby/spdystream).
//!
//! No maintained, permissively licensed Rust SPDY crate exists (the one
//! SPDY/3.1 multiplexer on crates.io is GPL-3.0-only), so keelson has its
//! own, small and tested here and against containerd in the system tier:
//! [`frame`] (framing and the zlib header blocks with the SPDY/3
//! dictionary) and [`session`] (client streams, pings, GOAWAY).

pub mod frame;
pub mod session;

//! The four probe handlers. Each runs one check and returns a
//! [`ProbeResult`](crate::ProbeResult) with upstream's message.

pub mod dial;
pub mod exec;
pub mod grpc;
pub mod http;
pub mod tcp;

//! What both of keelson's roles share and neither owns: the API client's
//! settings and rate limit, the event recorder, the metrics and health
//! registries, the introspection surface `keelson diagnose` reads, and
//! small value types (quantities, durations). Nothing here knows a role.

pub mod apiclient;
pub mod clock;
pub mod duration;
pub mod error_chain;
pub mod events;
pub mod expansion;
pub mod gofmt;
pub mod introspection;
pub mod lifecycle;
pub mod mountinfo;
pub mod observability;
pub mod quantity;
pub mod strategic_patch;
pub mod version;

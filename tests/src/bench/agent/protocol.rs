//! Messages between the benchmark and a probe agent (one JSON object per line).

use std::net::{IpAddr, SocketAddr};

use serde::{Deserialize, Serialize};

/// Where to connect and which answers count: the backend's identity line
/// starts with the address the connection landed on, which must be one of
/// `expect`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    /// Address to connect to (a Service VIP:port, or an endpoint directly).
    pub addr: SocketAddr,
    /// Endpoint addresses a correct data path may land on.
    pub expect: Vec<IpAddr>,
}

/// A request with its id.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Envelope<T> {
    /// Chosen by the benchmark; echoed in the answer.
    pub id: u64,
    /// The message.
    pub body: T,
}

/// What the benchmark asks.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// For each target, start new connections (more often at first, then
    /// every 2 % of the time waited) until one lands on an expected
    /// endpoint; report when that connection was started.
    Reach {
        /// Targets, probed independently.
        targets: Vec<Target>,
        /// Give up after this long.
        timeout_ms: u64,
    },
    /// Correctness check: connect to each target (once, or until every
    /// expected endpoint was seen when `all_endpoints`), recording where
    /// connections land.
    Sweep {
        /// Targets.
        targets: Vec<Target>,
        /// Keep connecting until every expected endpoint answered.
        all_endpoints: bool,
        /// Connections per target at most (for `all_endpoints`).
        max_attempts: u32,
    },
    /// Data-path latency: `samples` sequential connections over the
    /// targets (round robin), timing each `connect()`.
    Latency {
        /// Targets.
        targets: Vec<Target>,
        /// Connections to time.
        samples: u32,
    },
    /// `GET path` over plain HTTP from inside the namespace (metrics).
    Scrape {
        /// Server address.
        addr: SocketAddr,
        /// Request path.
        path: String,
    },
}

/// Result of [`Request::Reach`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReachResult {
    /// Per target: start time (monotonic ns) of the earliest connection
    /// that landed on an expected endpoint, `None` if none did in time.
    pub reached_ns: Vec<Option<u64>>,
    /// Connections made in total.
    pub attempts: u64,
    /// Per target: the last failure seen (for reports on timeouts).
    pub last_error: Vec<Option<String>>,
}

/// Result of [`Request::Sweep`] for one target.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SweepResult {
    /// Expected endpoints that answered.
    pub seen: Vec<IpAddr>,
    /// Unexpected endpoints that answered (a wrong data path).
    pub wrong: Vec<IpAddr>,
    /// Connections that failed.
    pub failures: u32,
    /// The last failure.
    pub last_error: Option<String>,
}

/// Result of [`Request::Latency`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencyResult {
    /// `connect()` durations of the connections that landed correctly, ns.
    pub connect_ns: Vec<u64>,
    /// Connections that landed on an unexpected endpoint.
    pub wrong: u32,
    /// Connections that failed.
    pub failed: u32,
    /// The last failure.
    pub last_error: Option<String>,
}

/// What the agent answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Response {
    /// Sent once at start, after joining the cgroup and the namespace.
    Ready {
        /// The agent's process id.
        pid: u32,
    },
    /// Answer to [`Request::Reach`].
    Reach(ReachResult),
    /// Answer to [`Request::Sweep`], one entry per target.
    Sweep {
        /// Per target.
        results: Vec<SweepResult>,
    },
    /// Answer to [`Request::Latency`].
    Latency(LatencyResult),
    /// Answer to [`Request::Scrape`].
    Scrape {
        /// Response body.
        body: String,
    },
    /// The request failed as a whole.
    Error {
        /// Why.
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_as_json_lines() {
        let req = Envelope {
            id: 3,
            body: Request::Reach {
                targets: vec![Target {
                    addr: "10.96.0.1:80".parse().expect("addr"),
                    expect: vec!["10.128.0.1".parse().expect("ip")],
                }],
                timeout_ms: 5,
            },
        };
        let line = serde_json::to_string(&req).expect("encode");
        assert!(!line.contains('\n'));
        assert!(line.contains(r#""op":"reach""#), "{line}");
        let back: Envelope<Request> = serde_json::from_str(&line).expect("decode");
        assert_eq!(back.id, 3);
        let resp = Envelope {
            id: 3,
            body: Response::Reach(ReachResult {
                reached_ns: vec![Some(9), None],
                attempts: 4,
                last_error: vec![None, Some("refused".into())],
            }),
        };
        let line = serde_json::to_string(&resp).expect("encode");
        let back: Envelope<Response> = serde_json::from_str(&line).expect("decode");
        match back.body {
            Response::Reach(r) => assert_eq!(r.reached_ns, vec![Some(9), None]),
            other => panic!("unexpected {other:?}"),
        }
    }
}

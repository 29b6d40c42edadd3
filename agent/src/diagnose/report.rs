//! The diagnosis as data: the `-o json` schema (documented in
//! docs/diagnose.md) and what the text renderer prints. A report is a chain
//! of links in the order the failure of one blocks the next (kubelet's own
//! order for a pod); each link is marked and carries its evidence.

use serde::{Deserialize, Serialize};

use crate::introspection::types::TimelineRecord;

/// `apiVersion` of the JSON output.
pub const API_VERSION: &str = "keelson.dev/v1alpha1";
/// `kind` of the JSON output.
pub const KIND: &str = "Diagnosis";

/// How a link (or a part of it) stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Mark {
    /// Works.
    Ok,
    /// Works, with something worth knowing (restarts, pressure near).
    Warning,
    /// Broken: the chain stops here.
    Failed,
    /// Could not be checked (no permission, daemon down and no other source).
    Unknown,
    /// Not checked: an earlier link failed and this one depends on it.
    NotReached,
}

impl Mark {
    /// The mark printed in text output.
    pub fn symbol(self) -> &'static str {
        match self {
            Mark::Ok => "✔",
            Mark::Warning => "⚠",
            Mark::Failed => "✘",
            Mark::Unknown => "?",
            Mark::NotReached => "–",
        }
    }
}

/// One part of a link (a container, an image, a service port).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Part {
    /// What it is (`app`, `keelson.local/busybox:1`, `http/TCP`).
    pub name: String,
    /// How it stands.
    pub status: Mark,
    /// One line.
    pub summary: String,
    /// The facts behind it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<String>,
}

/// One link of the chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Link {
    /// Stable identifier (`bound`, `admitted`, `volumes`, `sandbox`,
    /// `images`, `containers`, `probes`, `readinessGates`, `evictionRisk`,
    /// `api`, `lease`, `runtime`, `cni`, `pressure`, `certificate`,
    /// `clock`, `cgroupDriver`, `nodeReady`, `service`, `endpoints`,
    /// `selection`, `dataPlane`, `conntrack`, `probe`).
    pub id: String,
    /// Title as printed.
    pub title: String,
    /// How it stands.
    pub status: Mark,
    /// One line: the verdict for this link.
    pub summary: String,
    /// The facts behind it, in the words upstream tools print.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<String>,
    /// Its parts, one per container / image / port where that applies.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<Part>,
    /// Where to look next when this link is not the node's to fix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

impl Link {
    /// A link with a status and summary.
    pub fn new(id: &str, title: &str, status: Mark, summary: impl Into<String>) -> Link {
        Link {
            id: id.to_string(),
            title: title.to_string(),
            status,
            summary: summary.into(),
            evidence: Vec::new(),
            parts: Vec::new(),
            next: None,
        }
    }

    /// Adds evidence.
    pub fn with_evidence(mut self, e: impl IntoIterator<Item = String>) -> Link {
        self.evidence.extend(e);
        self
    }

    /// Sets where to look next.
    pub fn with_next(mut self, next: impl Into<String>) -> Link {
        self.next = Some(next.into());
        self
    }

    /// A link made of `parts`: their worst mark, summed up by the first
    /// failed part ("name: summary"), or by `healthy` when none failed.
    pub fn of_parts(id: &str, title: &str, parts: Vec<Part>, healthy: impl Into<String>) -> Link {
        let summary = match parts.iter().find(|p| p.status == Mark::Failed) {
            Some(p) => format!("{}: {}", p.name, p.summary),
            None => healthy.into(),
        };
        let mut link = Link::new(id, title, Link::worst_part(&parts), summary);
        link.parts = parts;
        link
    }

    /// The worst mark of its parts (`Ok` without parts).
    pub fn worst_part(parts: &[Part]) -> Mark {
        parts
            .iter()
            .map(|p| p.status)
            .filter(|m| *m != Mark::NotReached)
            .max_by_key(|m| severity(*m))
            .unwrap_or(Mark::Ok)
    }
}

/// Ordering for "worst": failed > unknown > warning > ok.
pub fn severity(m: Mark) -> u8 {
    match m {
        Mark::Ok | Mark::NotReached => 0,
        Mark::Warning => 1,
        Mark::Unknown => 2,
        Mark::Failed => 3,
    }
}

/// What was diagnosed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Target {
    /// `Pod`, `Node` or `Service`.
    pub kind: String,
    /// Namespace (pods and Services).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
    /// The Service port asked for (`name` or number), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<String>,
}

impl Target {
    /// A pod.
    pub fn pod(namespace: &str, name: &str) -> Target {
        Target {
            kind: "Pod".into(),
            namespace: Some(namespace.into()),
            name: name.into(),
            port: None,
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {ns}/{}", self.kind, self.name)?,
            None => write!(f, "{} {}", self.kind, self.name)?,
        }
        if let Some(p) = &self.port {
            write!(f, ":{p}")?;
        }
        Ok(())
    }
}

/// Whether the daemon answered on its socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DaemonStatus {
    /// It answered.
    pub running: bool,
    /// The socket asked.
    pub socket: String,
    /// Its version, when it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Its process id, when it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Why it did not answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// An API request diagnose was not allowed to make, and the RBAC rule that
/// would allow it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MissingPermission {
    /// The user the API server saw (from its message), if it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// `get`, `list`.
    pub verb: String,
    /// API group (`""` for core).
    pub api_group: String,
    /// Resource plural.
    pub resource: String,
    /// Namespace, for namespaced requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// What diagnose wanted it for.
    pub needed_for: String,
    /// The rule, as it is written in a (Cluster)Role.
    pub rule: String,
    /// The API server's message.
    pub message: String,
}

/// The whole diagnosis.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// [`API_VERSION`].
    pub api_version: String,
    /// [`KIND`].
    pub kind: String,
    /// What was diagnosed.
    pub target: Target,
    /// The node diagnose ran for.
    pub node: String,
    /// When (RFC 3339).
    pub generated_at: String,
    /// The daemon.
    pub daemon: DaemonStatus,
    /// The worst mark of the chain.
    pub status: Mark,
    /// One line.
    pub verdict: String,
    /// The first failed link's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_failure: Option<String>,
    /// The chain.
    pub links: Vec<Link>,
    /// Requests that were refused for lack of a permission.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing_permissions: Vec<MissingPermission>,
    /// With `--since`: Events, keelson's records and API writes, oldest first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<Vec<TimelineRecord>>,
}

impl Report {
    /// Assembles a report and computes its status, verdict and first failure.
    pub fn new(
        target: Target,
        node: &str,
        daemon: DaemonStatus,
        links: Vec<Link>,
        missing_permissions: Vec<MissingPermission>,
    ) -> Report {
        let status = links
            .iter()
            .map(|l| l.status)
            .max_by_key(|m| severity(*m))
            .unwrap_or(Mark::Ok);
        let first = links.iter().find(|l| l.status == Mark::Failed);
        let verdict = match first {
            Some(l) => format!("broken at \"{}\": {}", l.title, l.summary),
            None => match status {
                Mark::Unknown => {
                    let l = links.iter().find(|l| l.status == Mark::Unknown);
                    format!(
                        "no link failed, but \"{}\" could not be checked",
                        l.map(|l| l.title.as_str()).unwrap_or_default()
                    )
                }
                Mark::Warning => "healthy, with warnings".to_string(),
                _ => "healthy: every link holds".to_string(),
            },
        };
        Report {
            api_version: API_VERSION.to_string(),
            kind: KIND.to_string(),
            target,
            node: node.to_string(),
            generated_at: crate::introspection::timeline::rfc3339(std::time::SystemTime::now()),
            daemon,
            status,
            verdict,
            first_failure: first.map(|l| l.id.clone()),
            links,
            missing_permissions,
            timeline: None,
        }
    }

    /// A link by id.
    pub fn link(&self, id: &str) -> Option<&Link> {
        self.links.iter().find(|l| l.id == id)
    }
}

/// Marks every link after the first failed one `NotReached`, except those
/// in `independent` (they are checked whatever happened before).
pub fn cut_after_failure(links: &mut [Link], independent: &[&str]) {
    let mut failed = false;
    for l in links.iter_mut() {
        if failed && !independent.contains(&l.id.as_str()) {
            l.status = Mark::NotReached;
            l.summary = "not reached".to_string();
            l.evidence.clear();
            l.parts.clear();
            l.next = None;
        }
        if l.status == Mark::Failed {
            failed = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn daemon() -> DaemonStatus {
        DaemonStatus {
            running: false,
            socket: "/s".into(),
            version: None,
            pid: None,
            error: Some("down".into()),
        }
    }

    #[test]
    fn the_first_failure_names_the_verdict_and_later_links_are_not_reached() {
        let mut links = vec![
            Link::new("bound", "Bound to this node", Mark::Ok, "yes"),
            Link::new("images", "Images pulled", Mark::Failed, "ErrImagePull"),
            Link::new("containers", "Containers", Mark::Failed, "waiting"),
            Link::new("evictionRisk", "Eviction risk", Mark::Warning, "close"),
        ];
        cut_after_failure(&mut links, &["evictionRisk"]);
        assert_eq!(links[2].status, Mark::NotReached);
        assert_eq!(links[3].status, Mark::Warning);
        let r = Report::new(
            Target::pod("default", "web"),
            "n1",
            daemon(),
            links,
            Vec::new(),
        );
        assert_eq!(r.status, Mark::Failed);
        assert_eq!(r.first_failure.as_deref(), Some("images"));
        assert_eq!(r.verdict, "broken at \"Images pulled\": ErrImagePull");
        let json = serde_json::to_value(&r).expect("json");
        assert_eq!(json["links"][2]["status"], "notReached");
        assert_eq!(json["kind"], "Diagnosis");
        assert_eq!(json["target"]["namespace"], "default");
        let back: Report = serde_json::from_value(json).expect("round trip");
        assert_eq!(back, r);
    }

    #[test]
    fn a_healthy_chain_says_so() {
        let r = Report::new(
            Target {
                kind: "Node".into(),
                namespace: None,
                name: "n1".into(),
                port: None,
            },
            "n1",
            daemon(),
            vec![Link::new("api", "API server", Mark::Ok, "answers")],
            Vec::new(),
        );
        assert_eq!(r.status, Mark::Ok);
        assert_eq!(r.verdict, "healthy: every link holds");
        assert_eq!(r.first_failure, None);
    }
}

//! Human output: one line per link (mark, title, summary), its parts and
//! evidence indented below, the verdict and where to look next, the
//! permissions that were missing, and the timeline with `--since`.

use std::fmt::Write as _;

use super::report::{Link, Mark, Report};
use crate::introspection::types::RecordSource;

const TITLE_WIDTH: usize = 22;

fn push_link(out: &mut String, l: &Link) {
    let _ = writeln!(
        out,
        "  {} {:<width$} {}",
        l.status.symbol(),
        l.title,
        l.summary,
        width = TITLE_WIDTH
    );
    if l.status == Mark::NotReached {
        return;
    }
    let pad = " ".repeat(4);
    for p in &l.parts {
        let _ = writeln!(out, "{pad}{} {}: {}", p.status.symbol(), p.name, p.summary);
        for e in &p.evidence {
            for line in e.lines() {
                let _ = writeln!(out, "{pad}    {line}");
            }
        }
    }
    for e in &l.evidence {
        for line in e.lines() {
            let _ = writeln!(out, "{pad}{line}");
        }
    }
    if let Some(n) = &l.next {
        let _ = writeln!(out, "{pad}next: {n}");
    }
}

/// The report as text.
pub fn text(r: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{} on node {}", r.target, r.node);
    if r.daemon.running {
        let _ = writeln!(
            out,
            "keelson daemon: running (pid {}, keelson {}), state read from {}",
            r.daemon.pid.unwrap_or_default(),
            r.daemon.version.as_deref().unwrap_or("?"),
            r.daemon.socket
        );
    } else {
        let _ = writeln!(
            out,
            "keelson daemon: DOWN ({}): read CRI, the kernel and the API directly",
            r.daemon.error.as_deref().unwrap_or("no answer")
        );
    }
    out.push('\n');
    for l in &r.links {
        push_link(&mut out, l);
    }
    out.push('\n');
    let _ = writeln!(out, "Verdict: {} {}", r.status.symbol(), r.verdict);
    if let Some(l) = r
        .first_failure
        .as_deref()
        .and_then(|id| r.link(id))
        .filter(|l| l.next.is_some())
    {
        let _ = writeln!(out, "Next: {}", l.next.as_deref().unwrap_or_default());
    }
    if !r.missing_permissions.is_empty() {
        out.push('\n');
        let _ = writeln!(
            out,
            "Missing permissions (what needs them is left out above):"
        );
        for m in &r.missing_permissions {
            let scope = match &m.namespace {
                Some(ns) => format!(" in namespace {ns}"),
                None => String::new(),
            };
            let who = m
                .user
                .as_deref()
                .map(|u| format!(" for {u}"))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "  {} {}{scope} ({}): forbidden{who}",
                m.verb, m.resource, m.needed_for
            );
            let _ = writeln!(out, "    a rule that grants it: {}", m.rule);
        }
    }
    if let Some(t) = &r.timeline {
        out.push('\n');
        let _ = writeln!(out, "Timeline ({} records):", t.len());
        for rec in t {
            let source = match rec.source {
                RecordSource::Event => "keelson",
                RecordSource::ApiWrite => "api-write",
                RecordSource::ClusterEvent => "event",
            };
            let object = if rec.field_path.is_empty() {
                format!("{}/{}", rec.kind, rec.name)
            } else {
                format!("{}/{} {}", rec.kind, rec.name, rec.field_path)
            };
            let count = rec
                .count
                .filter(|c| *c > 1)
                .map(|c| format!(" (x{c})"))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "  {}  {:<9} {:<7} {:<22} {}: {}{count}",
                rec.time, source, rec.type_, rec.reason, object, rec.message
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::report::{DaemonStatus, MissingPermission, Part, Target};
    use super::*;

    #[test]
    fn text_shows_marks_parts_evidence_verdict_and_permissions() {
        let mut containers = Link::new(
            "containers",
            "Containers",
            Mark::Failed,
            "app: CrashLoopBackOff",
        )
        .with_next("kubectl logs -n default web -c app --previous");
        containers.parts.push(Part {
            name: "app".into(),
            status: Mark::Failed,
            summary: "Waiting: CrashLoopBackOff".into(),
            evidence: vec!["Last State: Terminated\nExit Code: 3".into()],
        });
        let r = Report::new(
            Target::pod("default", "web"),
            "n1",
            DaemonStatus {
                running: true,
                socket: "/var/lib/keelson/diagnose.sock".into(),
                version: Some("0.1.0".into()),
                pid: Some(42),
                error: None,
            },
            vec![
                Link::new(
                    "bound",
                    "Bound to this node",
                    Mark::Ok,
                    "spec.nodeName is n1",
                ),
                containers,
                Link::new("probes", "Probes", Mark::NotReached, "not reached"),
            ],
            vec![MissingPermission {
                user: Some("system:node:n1".into()),
                verb: "list".into(),
                api_group: String::new(),
                resource: "events".into(),
                namespace: Some("default".into()),
                needed_for: "the pod's events".into(),
                rule: "apiGroups: [\"\"], resources: [\"events\"], verbs: [\"list\"]".into(),
                message: "forbidden".into(),
            }],
        );
        let t = text(&r);
        assert!(t.starts_with("Pod default/web on node n1\n"), "{t}");
        assert!(
            t.contains("  ✔ Bound to this node     spec.nodeName is n1\n"),
            "{t}"
        );
        assert!(t.contains("    ✘ app: Waiting: CrashLoopBackOff\n        Last State: Terminated\n        Exit Code: 3\n"), "{t}");
        assert!(
            t.contains("  – Probes                 not reached\n"),
            "{t}"
        );
        assert!(
            t.contains("Verdict: ✘ broken at \"Containers\": app: CrashLoopBackOff\n"),
            "{t}"
        );
        assert!(
            t.contains("Next: kubectl logs -n default web -c app --previous\n"),
            "{t}"
        );
        assert!(t.contains("  list events in namespace default (the pod's events): forbidden for system:node:n1\n"), "{t}");
    }
}

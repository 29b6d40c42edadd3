//! The eBPF half of the data-plane link of `keelson diagnose service`
//! (`proxy.mode: ebpf`): the socket LB's pinned maps are opened, each
//! service port's entries are read back and compared with the model
//! (`keelson_netplane::ebpf::inspect`, fed by the same rendering the
//! daemon's syncer is fed with). Reading the pins works whether keelson
//! runs or not: the pinned links keep the programs on these maps.

use std::net::IpAddr;

use keelson_netplane::ebpf::inspect::{EntryCheck, EntryFound, inspect_frontend, stale_frontends};
use keelson_netplane::ebpf::{EbpfConfig, Frontend, pinned_service_maps, service_maps_dir};
use keelson_netplane::model::ServicePortState;

use super::report::{Mark, Part};

/// One problem in words.
pub fn problem_text(c: &EntryCheck) -> String {
    match &c.found {
        EntryFound::Missing => format!(
            "{} missing from map {} (the model wants {})",
            c.entry, c.map, c.expected
        ),
        EntryFound::Different(found) => format!(
            "{} in map {}: {found}, the model wants {}",
            c.entry, c.map, c.expected
        ),
        EntryFound::Unexpected => format!("{} left over in map {}: {}", c.entry, c.map, c.expected),
        EntryFound::Present => String::new(),
    }
}

/// The socket-LB parts of the data-plane link: one per service port (named
/// `<port label> socket LB`), plus one for entries of the Service's
/// ClusterIPs that no port of the model has, when `whole_service` (no port
/// was asked for). Returns the parts and the number of entries compared.
pub fn parts(
    config: &EbpfConfig,
    ports: &[(String, &ServicePortState)],
    whole_service: bool,
) -> (Vec<Part>, usize) {
    let maps = match pinned_service_maps(config) {
        Ok(m) => m,
        Err(e) => {
            return (
                vec![Part {
                    name: "socket LB".into(),
                    status: Mark::Failed,
                    summary: format!(
                        "the socket-LB maps cannot be opened at {}: {e}",
                        service_maps_dir(config).display()
                    ),
                    evidence: vec![
                        "keelson pins its maps there while proxy.mode is ebpf (proxy.ebpf.bpffsPath); \
                         without them no ClusterIP is translated at the socket, only by nftables"
                            .into(),
                    ],
                }],
                0,
            );
        }
    };
    let mut parts = Vec::new();
    let mut entries = 0;
    let mut frontends: Vec<Frontend> = Vec::new();
    let mut vips: Vec<IpAddr> = Vec::new();
    for (label, state) in ports {
        let name = format!("{label} socket LB");
        if !vips.contains(&state.info.cluster_ip) {
            vips.push(state.info.cluster_ip);
        }
        match inspect_frontend(&maps, state) {
            Ok(ins) => {
                let Some(f) = ins.frontend else {
                    parts.push(Part {
                        name,
                        status: Mark::Ok,
                        summary: format!(
                            "{} is not served by socket LB: nftables alone translates it",
                            state.info.protocol.as_k8s()
                        ),
                        evidence: Vec::new(),
                    });
                    continue;
                };
                frontends.push(f);
                entries += ins.checks.len();
                let problems: Vec<String> = ins.problems().map(problem_text).collect();
                parts.push(Part {
                    name,
                    status: if problems.is_empty() {
                        Mark::Ok
                    } else {
                        Mark::Failed
                    },
                    summary: if problems.is_empty() {
                        format!(
                            "{f}: {} map entries, as the model renders them",
                            ins.checks.len()
                        )
                    } else {
                        format!(
                            "{f}: {} of {} map entries missing, different or left over",
                            problems.len(),
                            ins.checks.len()
                        )
                    },
                    evidence: problems,
                });
            }
            Err(e) => parts.push(Part {
                name,
                status: Mark::Unknown,
                summary: format!("reading the socket-LB maps failed: {e}"),
                evidence: Vec::new(),
            }),
        }
    }
    if whole_service && !vips.is_empty() {
        let name = "ClusterIP socket LB".to_string();
        let vip_text = vips
            .iter()
            .map(IpAddr::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        match stale_frontends(&maps, &vips, &frontends) {
            Ok(stale) if stale.is_empty() => parts.push(Part {
                name,
                status: Mark::Ok,
                summary: format!("kl_services holds no other port of {vip_text}"),
                evidence: Vec::new(),
            }),
            Ok(stale) => parts.push(Part {
                name,
                status: Mark::Failed,
                summary: format!(
                    "kl_services still translates {} port(s) of {vip_text} the Service does not have",
                    stale.len()
                ),
                evidence: stale.iter().map(problem_text).collect(),
            }),
            Err(e) => parts.push(Part {
                name,
                status: Mark::Unknown,
                summary: format!("reading kl_services failed: {e}"),
                evidence: Vec::new(),
            }),
        }
    }
    (parts, entries)
}

/// The link-level line for the eBPF mode.
pub fn mode_evidence(config: &EbpfConfig) -> String {
    format!(
        "eBPF mode: the socket LB's maps (pinned at {}) and the nftables rules (north-south \
         traffic, and ClusterIP traffic socket LB does not see) are both compared",
        service_maps_dir(config).display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(found: EntryFound, expected: &str) -> EntryCheck {
        EntryCheck {
            map: "kl_members",
            entry: "member 10.1.0.2:8080 of service id 3".into(),
            expected: expected.into(),
            found,
        }
    }

    #[test]
    fn problems_say_which_map_and_what_the_model_wants() {
        assert_eq!(
            problem_text(&check(EntryFound::Missing, "present")),
            "member 10.1.0.2:8080 of service id 3 missing from map kl_members (the model wants present)"
        );
        assert_eq!(
            problem_text(&check(
                EntryFound::Unexpected,
                "the model does not pick this backend"
            )),
            "member 10.1.0.2:8080 of service id 3 left over in map kl_members: the model does not pick this backend"
        );
        assert_eq!(
            problem_text(&check(
                EntryFound::Different("2 backend(s)".into()),
                "1 backend(s)"
            )),
            "member 10.1.0.2:8080 of service id 3 in map kl_members: 2 backend(s), the model wants 1 backend(s)"
        );
    }

    #[test]
    fn unpinned_maps_are_a_failure_that_names_the_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = EbpfConfig {
            cgroup_path: None,
            bpffs_path: dir.path().join("keelson"),
        };
        let (parts, n) = parts(&config, &[], true);
        assert_eq!(n, 0);
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].status, Mark::Failed);
        assert!(
            parts[0]
                .summary
                .contains(&format!("{}", dir.path().join("keelson/maps").display())),
            "{}",
            parts[0].summary
        );
    }
}

//! `keelson migrate --from-kubelet --apply`: the plan carried out. The
//! backup is complete before the first change; from then on any failure
//! says which step stopped and that `--rollback` restores kubelet.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use super::host::Host;
use super::plan::Plan;
use super::{MigrateError, api, backup, install, layout};

/// How `--apply` runs.
#[derive(Debug, Clone)]
pub struct ApplyOptions {
    /// The keelson binary to install (default: this one).
    pub binary: PathBuf,
    /// How long to wait for kube-proxy to leave and the Node to be Ready
    /// again; `None`: do not wait (`--no-wait`).
    pub wait: Option<Duration>,
    /// Credentials for the API (a host path; default kubelet.conf).
    pub kubeconfig: PathBuf,
}

/// The configuration file as written: a header, then the plan's YAML.
pub fn config_file(plan: &Plan) -> String {
    format!(
        "# Written by `keelson migrate --from-kubelet --apply` from kubelet's\n# {} and {} (and kube-proxy's configuration when it was\n# replaced). `keelson migrate --rollback` removes it. Fields: docs/configuration.md.\n{}",
        layout::KUBELET_CONFIG,
        layout::KUBEADM_FLAGS,
        plan.config.to_yaml()
    )
}

/// Carries out `plan` on `host`, reporting each step on `out`.
pub async fn apply(
    host: &Host,
    plan: &Plan,
    opts: &ApplyOptions,
    out: &mut dyn Write,
) -> Result<(), MigrateError> {
    if !plan.refused.is_empty() {
        return Err(MigrateError::Refused(plan.refused.clone()));
    }
    let node = plan.node_name.as_str();
    let replace = plan.options.replace_kube_proxy;
    let mut units = BTreeMap::new();
    units.insert(layout::KUBELET_UNIT.to_string(), plan.kubelet_unit.clone());
    units.insert(
        layout::KUBE_PROXY_UNIT.to_string(),
        plan.kube_proxy_unit.clone(),
    );
    let files: Vec<&str> = layout::KUBELET_FILES
        .iter()
        .chain(layout::KEELSON_FILES)
        .copied()
        .collect();
    let label = replace.then(|| format!("{}={}", layout::PROXY_LABEL, layout::PROXY_LABEL_VALUE));
    backup::write(host, node, units, &files, label)?;
    say(
        out,
        &format!(
            "backup written to {} (kubelet.service was {})",
            layout::BACKUP_DIR,
            plan.kubelet_unit
        ),
    );
    match steps(host, plan, opts, out).await {
        Ok(()) => Ok(()),
        Err(e) => Err(MigrateError::Interrupted {
            cause: Box::new(e),
            backup: layout::BACKUP_DIR.to_string(),
        }),
    }
}

fn say(out: &mut dyn Write, line: &str) {
    let _ = writeln!(out, "migrate: {line}");
    let _ = out.flush();
}

async fn steps(
    host: &Host,
    plan: &Plan,
    opts: &ApplyOptions,
    out: &mut dyn Write,
) -> Result<(), MigrateError> {
    let node = plan.node_name.as_str();
    let replace = plan.options.replace_kube_proxy;
    let needs_api = replace || opts.wait.is_some();
    let client = if needs_api {
        Some(api::client(host, &opts.kubeconfig).await?)
    } else {
        None
    };
    // The containers running before kubelet stops: the same ones must run
    // under keelson.
    let before = match (&client, opts.wait) {
        (Some(c), Some(_)) => Some(api::running_containers(c, node).await?),
        _ => None,
    };

    if let (true, Some(c)) = (replace, &client) {
        api::set_node_label(
            c,
            node,
            layout::PROXY_LABEL,
            Some(layout::PROXY_LABEL_VALUE),
        )
        .await?;
        say(
            out,
            &format!(
                "labelled Node {node} {}={}",
                layout::PROXY_LABEL,
                layout::PROXY_LABEL_VALUE
            ),
        );
        match opts.wait {
            Some(timeout) => {
                api::poll("kube-proxy's pod to leave the node", timeout, move || async move {
                    Ok(api::kube_proxy_on_node(c, node).await?.then(|| {
                        format!("a k8s-app=kube-proxy pod is still bound to {node} (does kube-proxy's DaemonSet have the {} DoesNotExist node affinity? docs/install.md)", layout::PROXY_LABEL)
                    }))
                })
                .await?;
                say(out, "kube-proxy's pod has left the node");
            }
            None => say(out, "not waiting for kube-proxy's pod to leave (--no-wait)"),
        }
    }

    host.run_systemctl(&["stop", layout::KUBELET_UNIT])?;
    if plan.kubelet_unit.is_enabled() {
        host.run_systemctl(&["disable", layout::KUBELET_UNIT])?;
    }
    say(
        out,
        "kubelet stopped and disabled (its containers keep running under the container runtime)",
    );
    if replace && plan.kube_proxy_unit.exists() {
        host.run_systemctl(&["stop", layout::KUBE_PROXY_UNIT])?;
        if plan.kube_proxy_unit.is_enabled() {
            host.run_systemctl(&["disable", layout::KUBE_PROXY_UNIT])?;
        }
        say(out, "kube-proxy.service stopped and disabled");
    }
    let stopped = jiff::Timestamp::now();

    host.write(
        std::path::Path::new(layout::KEELSON_CONFIG),
        config_file(plan).as_bytes(),
        0o644,
    )?;
    say(out, &format!("wrote {}", layout::KEELSON_CONFIG));
    let proxy_kc = if replace {
        plan.options.proxy_kubeconfig.as_deref()
    } else {
        None
    };
    install::install(host, &opts.binary, proxy_kc)?;
    say(out, "keelson.service installed, enabled and started");

    let (Some(c), Some(timeout), Some(before)) = (&client, opts.wait, before) else {
        say(
            out,
            &format!(
                "not waiting for the Node (--no-wait): kubectl get node {node} -w, and curl -s 127.0.0.1:10248/readyz?verbose"
            ),
        );
        return Ok(());
    };
    api::poll(
        &format!("Node {node} to be Ready with a heartbeat from keelson"),
        timeout,
        move || async move {
            Ok(match api::node_ready(c, node).await? {
                Some((status, Some(hb)))
                    if status == "True" && hb.as_second() > stopped.as_second() =>
                {
                    None
                }
                Some((status, hb)) => Some(format!(
                    "Ready={status}, last heartbeat {}",
                    hb.map(|t| t.to_string()).unwrap_or_else(|| "never".into())
                )),
                None => Some("no Ready condition".to_string()),
            })
        },
    )
    .await?;
    say(out, &format!("Node {node} is Ready"));
    let after = api::running_containers(c, node).await?;
    let changed = adoption_differences(&before, &after);
    if !changed.is_empty() {
        return Err(MigrateError::NotAdopted(changed));
    }
    let n: usize = before.values().map(BTreeMap::len).sum();
    say(
        out,
        &format!(
            "{n} running container(s) of {} pod(s) adopted, none restarted",
            before.len()
        ),
    );
    say(out, "done; keelson migrate --rollback returns to kubelet");
    Ok(())
}

/// Containers running before that now run with another ID or a higher
/// restart count (a pod deleted meanwhile is not counted).
pub fn adoption_differences(
    before: &BTreeMap<String, api::Containers>,
    after: &BTreeMap<String, api::Containers>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (pod, containers) in before {
        let now = after.get(pod);
        for (name, (id, restarts)) in containers {
            match now.and_then(|c| c.get(name)) {
                Some((id2, r2)) if id2 == id && r2 <= restarts => {}
                Some((id2, r2)) => out.push(format!(
                    "{pod} container {name}: was {id} (restarts {restarts}), now {id2} (restarts {r2})"
                )),
                None if now.is_some() => {
                    out.push(format!("{pod} container {name}: no longer running"));
                }
                None => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods(entries: &[(&str, &str, &str, i32)]) -> BTreeMap<String, api::Containers> {
        let mut m: BTreeMap<String, api::Containers> = BTreeMap::new();
        for (pod, c, id, r) in entries {
            m.entry((*pod).to_string())
                .or_default()
                .insert((*c).to_string(), ((*id).to_string(), *r));
        }
        m
    }

    #[test]
    fn adoption_is_judged_by_container_id_and_restarts() {
        let before = pods(&[
            ("ns/a", "app", "containerd://1", 0),
            ("ns/b", "app", "containerd://2", 3),
        ]);
        assert!(adoption_differences(&before, &before).is_empty());
        // A pod deleted meanwhile is not a failure of adoption.
        let after = pods(&[("ns/a", "app", "containerd://1", 0)]);
        assert!(adoption_differences(&before, &after).is_empty());
        let after = pods(&[
            ("ns/a", "app", "containerd://9", 1),
            ("ns/b", "app", "containerd://2", 3),
        ]);
        let d = adoption_differences(&before, &after);
        assert_eq!(d.len(), 1, "{d:?}");
        assert!(
            d[0].starts_with("ns/a container app: was containerd://1"),
            "{d:?}"
        );
    }
}

//! `keelson migrate --rollback`: kubelet back exactly as the backup found
//! it. keelson is stopped, disabled and removed by install.sh's uninstall
//! (its Service rules too, on a real node); every recorded file is put back
//! byte for byte (or removed when it did not exist); kubelet's (and
//! kube-proxy's) unit is enabled and started again when it was; the label
//! that moved kube-proxy away is removed. Works after a complete `--apply`
//! and after one that stopped half-way. The backup is then kept aside as
//! `rolled-back-<time>`, so a new `--apply` may run.

use std::io::Write;
use std::path::PathBuf;

use super::host::Host;
use super::{MigrateError, api, backup, install, layout};

/// How `--rollback` runs.
#[derive(Debug, Clone)]
pub struct RollbackOptions {
    /// Credentials to remove the node label with (a host path; default
    /// kubelet.conf, as restored).
    pub kubeconfig: PathBuf,
}

fn say(out: &mut dyn Write, line: &str) {
    let _ = writeln!(out, "rollback: {line}");
    let _ = out.flush();
}

/// Restores kubelet from the backup on `host`.
pub async fn rollback(
    host: &Host,
    opts: &RollbackOptions,
    out: &mut dyn Write,
) -> Result<(), MigrateError> {
    let manifest = backup::load(host)?;
    say(
        out,
        &format!(
            "restoring the state of {} (backup of {})",
            manifest.node_name, manifest.created
        ),
    );
    install::uninstall(host)?;
    say(out, "keelson.service stopped, disabled and removed");
    let changed = backup::restore_files(host, &manifest)?;
    for p in &changed {
        say(out, &format!("restored {}", p.display()));
    }
    host.run_systemctl(&["daemon-reload"])?;
    for unit in [layout::KUBE_PROXY_UNIT, layout::KUBELET_UNIT] {
        let Some(was) = manifest.units.get(unit) else {
            continue;
        };
        if !was.exists() {
            continue;
        }
        if was.is_enabled() {
            host.run_systemctl(&["enable", unit])?;
        }
        if was.is_active() {
            host.run_systemctl(&["start", unit])?;
        }
        say(out, &format!("{unit} is {was} again"));
    }
    if let Some(label) = &manifest.node_label {
        let key = label.split('=').next().unwrap_or_default();
        let removed: Result<(), MigrateError> = async {
            let c = api::client(host, &opts.kubeconfig).await?;
            api::set_node_label(&c, &manifest.node_name, key, None).await
        }
        .await;
        match removed {
            Ok(()) => say(
                out,
                &format!(
                    "removed the label {key} from Node {}: kube-proxy's DaemonSet returns",
                    manifest.node_name
                ),
            ),
            Err(e) => say(
                out,
                &format!(
                    "warning: could not remove the label ({e}); run: kubectl label node {} {key}-",
                    manifest.node_name
                ),
            ),
        }
    }
    if host.is_real_root()
        && !crate::certificates::kubeconfig::still_valid(&host.path(layout::KUBELET_KUBECONFIG))
    {
        say(
            out,
            &format!(
                "warning: kubelet's client certificate has expired while keelson ran; give kubelet the one keelson renewed: cp -L {root}/pki/keelson-client-current.pem {root}/pki/kubelet-client-from-keelson.pem && ln -sfn {root}/pki/kubelet-client-from-keelson.pem {current} && systemctl restart kubelet",
                root = layout::KUBELET_ROOT_DIR,
                current = layout::KUBELET_CLIENT_CURRENT
            ),
        );
    }
    let kept = backup::retire(host)?;
    let shown = kept
        .strip_prefix(host.root())
        .map(|p| PathBuf::from("/").join(p))
        .unwrap_or_else(|_| kept.clone());
    say(
        out,
        &format!("done; the backup is kept in {}", shown.display()),
    );
    Ok(())
}

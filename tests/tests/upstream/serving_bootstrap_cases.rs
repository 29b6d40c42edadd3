//! `serverTLSBootstrap` through the real control plane: the node requests
//! its :10250 serving certificate with a `kubernetes.io/kubelet-serving`
//! CSR, nobody approves it on its own (kube-controller-manager's approver
//! handles client certificates only), so `kubectl logs` fails until the
//! test approves it as an operator would; kube-controller-manager then
//! signs it with its `--cluster-signing-*` CA, the one the API server
//! checks kubelets against (`--kubelet-certificate-authority`), and
//! `kubectl logs` works through the real API server.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, ensure};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use keelson_tests::node_api::kubectl;
use keelson_tests::support::wait_for;
use keelson_tests::upstream::{Agents, Case, Env, NodeSpec, ProxyAgent};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;

use crate::node_api_cases::running;
use crate::support::{busybox_pod, create_pod, namespace};

pub const CASES: &[Case] = &[Case {
    name: "node_api_server_tls_bootstrap",
    agents: &Agents::ALL,
    run: |env, agents| Box::pin(node_api_server_tls_bootstrap(env, agents)),
}];

const T: Duration = Duration::from_secs(90);

fn decided(c: &CertificateSigningRequest) -> bool {
    c.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Approved" || c.type_ == "Denied")
        })
}

async fn node_api_server_tls_bootstrap(env: Arc<Env>, agents: Agents) -> anyhow::Result<()> {
    let spec = NodeSpec {
        proxy: ProxyAgent::None,
        keelson: Some(Arc::new(|c| {
            c.node.tls_cert_file = None;
            c.node.tls_private_key_file = None;
            c.node.server_tls_bootstrap = true;
        })),
        kubelet: Some(Arc::new(|m| {
            m.remove("tlsCertFile");
            m.remove("tlsPrivateKeyFile");
            m.insert("serverTLSBootstrap".into(), true.into());
        })),
        ..NodeSpec::of(agents)
    };
    let node = env
        .start_node(&format!("tlsboot-{}", agents.name()), spec)
        .await?;
    node.wait_ready(&env.admin).await?;
    let user = format!("system:node:{}", node.name);

    // The request, as kubelet makes it.
    let csrs = Api::<CertificateSigningRequest>::all(env.admin.clone());
    let csr = wait_for(
        "the node's kubelet-serving request",
        T,
        Duration::from_millis(500),
        || async {
            csrs.list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items
                .into_iter()
                .find(|c| {
                    c.spec.signer_name == "kubernetes.io/kubelet-serving"
                        && c.spec.username.as_deref() == Some(user.as_str())
                })
                .ok_or_else(|| "none yet".to_string())
        },
    )
    .await
    .map_err(|e| anyhow!("{e}"))?;
    ensure!(
        !decided(&csr),
        "decided without an operator: {:?}",
        csr.status
    );
    ensure!(
        csr.spec.usages.as_deref()
            == Some(&["digital signature".to_string(), "server auth".to_string()][..]),
        "{:?}",
        csr.spec.usages
    );
    let request = String::from_utf8(csr.spec.request.0.clone())?;
    let params = rcgen::CertificateSigningRequestParams::from_pem(&request)?;
    let ip = std::net::IpAddr::V4(node.ip);
    ensure!(
        params
            .params
            .subject_alt_names
            .contains(&rcgen::SanType::IpAddress(ip)),
        "{:?}",
        params.params.subject_alt_names
    );

    // A pod; its logs cannot be read while the node serves no certificate.
    let ns = namespace(&env.admin, "tlsboot").await?;
    create_pod(
        &env.admin,
        &ns,
        busybox_pod("talker", &node.name, "echo bootstrapped; sleep 3600"),
    )
    .await?;
    running(&env, &ns, "talker").await?;
    let logs = || async {
        kubectl(
            env.cp.admin_kubeconfig(),
            &["-n", &ns, "logs", "talker"],
            None,
            T,
        )
        .await
        .map_err(|e| anyhow!(e))
    };
    let before = logs().await?;
    ensure!(!before.ok, "logs without a serving certificate: {before:?}");

    // The operator approves; kube-controller-manager signs.
    let name = csr.metadata.name.clone().unwrap_or_default();
    let approval = json!({"status": {"conditions": [{
        "type": "Approved", "status": "True", "reason": "OperatorApproved",
        "message": "approved by the upstream test",
    }]}});
    csrs.patch_subresource(
        "approval",
        &name,
        &PatchParams::default(),
        &Patch::Merge(&approval),
    )
    .await?;
    wait_for(
        "kubectl logs through the bootstrapped serving certificate",
        T,
        Duration::from_secs(1),
        || async {
            let out = logs().await.map_err(|e| e.to_string())?;
            if out.ok && out.stdout.contains("bootstrapped") {
                Ok(())
            } else {
                Err(format!("{out:?}"))
            }
        },
    )
    .await
    .map_err(|e| anyhow!("{e}"))?;
    Ok(())
}

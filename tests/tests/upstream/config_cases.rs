//! keelson started as the real agents are: with the very KubeletConfiguration
//! an upstream node's kubelet reads and kube-proxy's KubeProxyConfiguration
//! (with `oomScoreAdj: 0` and conntrack zeros), and a node that joins
//! through TLS bootstrap with the real CertificateSigningRequest signer and
//! approver of kube-controller-manager.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, ensure};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use keelson_tests::support::wait_for;
use keelson_tests::upstream::{Agents, Case, Env, KeelsonFiles, NodeSpec, ProxyAgent, Reach};
use kube::Api;
use kube::api::{ListParams, PostParams};

use crate::node_api_cases::running;
use crate::service_cases::check_service;
use crate::support::{busybox_pod, create_pod, namespace};

pub const CASES: &[Case] = &[
    Case {
        name: "runs_with_kubelets_and_kube_proxys_files",
        agents: &[Agents::Keelson],
        run: |env, _| Box::pin(runs_with_kubelets_and_kube_proxys_files(env)),
    },
    Case {
        name: "joins_through_tls_bootstrap",
        agents: &[Agents::Keelson],
        run: |env, _| Box::pin(joins_through_tls_bootstrap(env)),
    },
];

/// `keelson run --kubelet-config <the kubelet's file> --proxy-config <kube-proxy's file>
/// --kubeconfig ... --root-dir ... --node-ip ... --hostname-override ...`:
/// the node is Ready, pods and Services work, and the fields keelson does
/// not implement are listed in one warning instead of stopping it.
async fn runs_with_kubelets_and_kube_proxys_files(env: Arc<Env>) -> anyhow::Result<()> {
    let spec = NodeSpec {
        keelson_files: KeelsonFiles::Upstream,
        ..NodeSpec::of(Agents::Keelson)
    };
    let node = env.start_node("kfiles", spec).await?;
    node.wait_ready(&env.admin).await?;
    let kubelet_file = std::fs::read_to_string(node.kubelet_config_path())?;
    for field in [
        "failCgroupV1: false",
        "failSwapOn: false",
        "healthzPort: 10248",
        "serializeImagePulls: false",
        "podLogsDir:",
        "tlsCertFile:",
    ] {
        ensure!(
            kubelet_file.contains(field),
            "the kubelet's file lacks {field}:\n{kubelet_file}"
        );
    }
    check_service(&env, &node).await?;
    node.check_running()?;
    // The file's kubelet API fields configure the node API: the real API
    // server reaches keelson's :10250 with its kubelet client certificate
    // (checked against the file's clientCAFile) and checks the file's
    // serving certificate (tlsCertFile) against --kubelet-certificate-authority.
    let ns = namespace(&env.admin, "kfiles").await?;
    create_pod(
        &env.admin,
        &ns,
        busybox_pod("talker", &node.name, "echo hello from the file; sleep 3600"),
    )
    .await?;
    running(&env, &ns, "talker").await?;
    let pods: Api<Pod> = Api::namespaced(env.admin.clone(), &ns);
    wait_for(
        "the pod's log through the API server",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || {
            let pods = pods.clone();
            async move {
                let text = pods
                    .logs("talker", &Default::default())
                    .await
                    .map_err(|e| e.to_string())?;
                if text.contains("hello from the file") {
                    Ok(())
                } else {
                    Err(format!("log so far: {text:?}"))
                }
            }
        },
    )
    .await?;
    let log = std::fs::read_to_string(node.node_log().unwrap_or_default()).unwrap_or_default();
    ensure!(
        !log.lines().any(
            |l| l.contains("upstream settings keelson does not implement")
                && l.contains("authentication")
        ),
        "the kubelet API fields are applied, not listed as unimplemented:\n{}",
        node.log_tails(40)
    );
    ensure!(
        !log.contains("invalid configuration"),
        "{}",
        node.log_tails(40)
    );
    Ok(())
}

const TOKEN_ID: &str = "k7s0bt";
const TOKEN_SECRET: &str = "0123456789abcdef";

async fn create_or_keep<K>(api: &Api<K>, obj: &K) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    match api.create(&PostParams::default(), obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// What kubeadm sets up for `kubeadm join`: a bootstrap token, the
/// bootstrappers' right to create CSRs, and automatic approval of node
/// client CSRs (bootstrap and renewal) by kube-controller-manager.
async fn bootstrap_token_and_rbac(admin: &kube::Client) -> anyhow::Result<()> {
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("bootstrap-token-{TOKEN_ID}"), "namespace": "kube-system"},
        "type": "bootstrap.kubernetes.io/token",
        "stringData": {
            "token-id": TOKEN_ID,
            "token-secret": TOKEN_SECRET,
            "usage-bootstrap-authentication": "true",
            "auth-extra-groups": "system:bootstrappers:kubeadm:default-node-token",
        }
    }))?;
    create_or_keep(
        &Api::<Secret>::namespaced(admin.clone(), "kube-system"),
        &secret,
    )
    .await?;
    let bindings: Api<ClusterRoleBinding> = Api::all(admin.clone());
    for (name, group, role) in [
        (
            "keelson-test:bootstrappers:node-bootstrapper",
            "system:bootstrappers",
            "system:node-bootstrapper",
        ),
        (
            "keelson-test:bootstrappers:nodeclient",
            "system:bootstrappers",
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
        ),
        (
            "keelson-test:nodes:selfnodeclient",
            "system:nodes",
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
        ),
    ] {
        let b: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}],
        }))?;
        create_or_keep(&bindings, &b).await?;
    }
    Ok(())
}

/// A node with a bootstrap token only: keelson requests its client
/// certificate, kube-controller-manager approves (csrapproving) and signs
/// (csrsigning) it, keelson writes its kubeconfig and the Node becomes
/// Ready under the Node authorizer and NodeRestriction.
async fn joins_through_tls_bootstrap(env: Arc<Env>) -> anyhow::Result<()> {
    bootstrap_token_and_rbac(&env.admin).await?;
    let files = tempfile::tempdir()?;
    let bootstrap = files.path().join("bootstrap-kubelet.conf");
    env.cp.write_token_kubeconfig(
        &bootstrap,
        &format!("system:bootstrap:{TOKEN_ID}"),
        &format!("{TOKEN_ID}.{TOKEN_SECRET}"),
        Reach::Node,
    )?;
    let boot = bootstrap.clone();
    let spec = NodeSpec {
        proxy: ProxyAgent::None,
        keelson: Some(Arc::new(move |c| {
            // No node kubeconfig yet: keelson writes it next to its root dir.
            let dir = c
                .node
                .root_dir
                .parent()
                .map(|p| p.to_path_buf())
                .unwrap_or_default();
            c.node.kubeconfig = Some(dir.join("bootstrapped.kubeconfig"));
            c.node.bootstrap_kubeconfig = Some(boot.clone());
        })),
        ..NodeSpec::of(Agents::Keelson)
    };
    let node = env.start_node("bootstrapped", spec).await?;
    node.wait_ready(&env.admin).await?;

    let csrs = Api::<CertificateSigningRequest>::all(env.admin.clone())
        .list(&ListParams::default())
        .await?;
    let ours = csrs
        .items
        .iter()
        .find(|c| c.spec.username.as_deref() == Some(&format!("system:bootstrap:{TOKEN_ID}")))
        .ok_or_else(|| anyhow!("no CSR from the bootstrap token"))?;
    ensure!(ours.spec.signer_name == "kubernetes.io/kube-apiserver-client-kubelet");
    let status = ours.status.clone().unwrap_or_default();
    ensure!(
        status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Approved" && c.reason.as_deref() == Some("AutoApproved")),
        "not approved by kube-controller-manager: {status:?}"
    );
    ensure!(
        status.certificate.is_some_and(|c| !c.0.is_empty()),
        "no certificate issued"
    );
    let kubeconfig = std::fs::read_to_string(node.dir().join("bootstrapped.kubeconfig"))?;
    ensure!(
        kubeconfig.contains("keelson-client-current.pem"),
        "{kubeconfig}"
    );
    let current = node
        .dir()
        .join("keelson-root/pki/keelson-client-current.pem");
    ensure!(
        std::fs::read_link(&current).is_ok(),
        "{} is not a link",
        current.display()
    );
    node.check_running()?;
    Ok(())
}

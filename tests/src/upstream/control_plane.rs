//! The real control plane: etcd (Debian), kube-apiserver and
//! kube-controller-manager v1.36 in a network namespace of their own,
//! their files under `/var/tmp/keelson-upstream/<suffix>/`. No scheduler:
//! tests bind pods with `nodeName`.
//!
//! [`ControlPlane::start`] returns once the API server is ready and the
//! controller manager has created the `default` ServiceAccount (pods are
//! refused before that). Dropping it stops the three processes by PID,
//! removes the namespace and the directory. A run that was killed before
//! it could do so is cleaned up by the next start (directories whose owner
//! process is gone).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Api;

use super::bins::UpstreamBins;
use super::daemon::Daemon;
use super::kubeconfig::{self, Credentials};
use super::network::{
    API_IP, API_PORT, ControlPlaneNet, HostRelay, KUBERNETES_SERVICE_IP, SERVICE_CIDR,
};
use super::pki::{Ca, CertPair, service_account_keys, write_file};
use super::{UpstreamError, stale};
use crate::support::wait_for;

/// Where control plane directories live.
pub const BASE_DIR: &str = "/var/tmp/keelson-upstream";

/// Which address a kubeconfig points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// The host-loopback relay: for the test process and kubectl.
    Host,
    /// [`API_IP`]:6443, routed from every node namespace: for node agents.
    Node,
}

/// A running control plane.
pub struct ControlPlane {
    dir: PathBuf,
    bins: UpstreamBins,
    ca: Ca,
    net: ControlPlaneNet,
    relay: HostRelay,
    admin_kubeconfig: PathBuf,
    daemons: Mutex<Vec<Daemon>>,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("dir", &self.dir)
            .field("relay", &self.relay.addr())
            .finish_non_exhaustive()
    }
}

impl ControlPlane {
    /// Starts etcd, kube-apiserver and kube-controller-manager and waits
    /// until they serve.
    pub async fn start(bins: &UpstreamBins) -> Result<ControlPlane, UpstreamError> {
        let dir = stale::register(BASE_DIR)?;
        // From here on, a failure drops `partial`, which cleans up.
        let mut partial = stale::Partial::new(dir.clone());
        let net = ControlPlaneNet::create()?;
        write_file(&dir.join("netns"), net.netns().name(), 0o644)?;
        let pki = dir.join("pki");
        std::fs::create_dir_all(&pki).map_err(UpstreamError::io("creating pki dir"))?;

        let ca = Ca::new()?;
        let (ca_crt, ca_key) = ca.pair().write(&pki, "ca")?;
        let serving = ca.server(
            "kube-apiserver",
            &[
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
                "localhost",
            ],
            &[
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V4(API_IP),
                IpAddr::V4(KUBERNETES_SERVICE_IP),
            ],
        )?;
        let (api_crt, api_key) = serving.write(&pki, "apiserver")?;
        let kubelet_client = ca.client("kube-apiserver-kubelet-client", Some("system:masters"))?;
        let (kc_crt, kc_key) = kubelet_client.write(&pki, "apiserver-kubelet-client")?;
        let (sa_private, sa_public) = service_account_keys()?;
        let sa_key = pki.join("sa.key");
        let sa_pub = pki.join("sa.pub");
        write_file(&sa_key, &sa_private, 0o600)?;
        write_file(&sa_pub, &sa_public, 0o644)?;

        let cp_ns = net.netns();
        let mut daemons = Vec::new();
        let mut etcd = cp_ns.command(&bins.etcd().display().to_string());
        etcd.args([
            "--name=keelson-upstream",
            &format!("--data-dir={}", dir.join("etcd").display()),
            "--listen-client-urls=http://127.0.0.1:2379",
            "--advertise-client-urls=http://127.0.0.1:2379",
            "--listen-peer-urls=http://127.0.0.1:2380",
            "--initial-advertise-peer-urls=http://127.0.0.1:2380",
            "--initial-cluster=keelson-upstream=http://127.0.0.1:2380",
            // The v1.36 API server's watch cache waits for progress
            // notifications, which etcd 3.4 sends only when asked, and it
            // cannot ask for one on demand (RequestWatchProgress is not
            // supported by 3.4): a watch from a fresh list's
            // resourceVersion of a quiet resource waits for the next
            // notification, for at most 3 s, then fails with "Too large
            // resource version" and closes. Every second keeps that wait
            // short (at 5 s, e2e's CSIStorageCapacity, RuntimeClass and
            // CRD watch tests lost their watch on either agent).
            "--experimental-watch-progress-notify-interval=1s",
            "--logger=zap",
        ]);
        daemons.push(Daemon::spawn("etcd", etcd, &dir.join("etcd.log"))?);

        let mut api = cp_ns.command(&bins.path("kube-apiserver").display().to_string());
        api.args([
            "--etcd-servers=http://127.0.0.1:2379".to_string(),
            "--bind-address=0.0.0.0".to_string(),
            format!("--secure-port={API_PORT}"),
            format!("--advertise-address={API_IP}"),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            format!("--cert-dir={}", dir.join("apiserver-certs").display()),
            format!("--client-ca-file={}", ca_crt.display()),
            format!("--tls-cert-file={}", api_crt.display()),
            format!("--tls-private-key-file={}", api_key.display()),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_string(),
            format!("--service-account-key-file={}", sa_pub.display()),
            format!("--service-account-signing-key-file={}", sa_key.display()),
            "--authorization-mode=Node,RBAC".to_string(),
            "--enable-admission-plugins=NodeRestriction".to_string(),
            "--allow-privileged=true".to_string(),
            "--enable-bootstrap-token-auth=true".to_string(),
            format!("--kubelet-client-certificate={}", kc_crt.display()),
            format!("--kubelet-client-key={}", kc_key.display()),
            format!("--kubelet-certificate-authority={}", ca_crt.display()),
            "--kubelet-preferred-address-types=InternalIP".to_string(),
            // Webhooks and aggregated APIs are called at their endpoints
            // (pod IPs, routed to every node from this namespace): no
            // Service proxy runs here to reach a ClusterIP.
            "--enable-aggregator-routing=true".to_string(),
            "--profiling=false".to_string(),
            "--v=1".to_string(),
        ]);
        daemons.push(Daemon::spawn(
            "kube-apiserver",
            api,
            &dir.join("kube-apiserver.log"),
        )?);
        partial.daemons = daemons;

        let relay = HostRelay::start(cp_ns, SocketAddr::from(([127, 0, 0, 1], API_PORT)))?;
        let admin = ca.client("kubernetes-admin", Some("system:masters"))?;
        let admin_kubeconfig = dir.join("admin.kubeconfig");
        kubeconfig::write(
            &admin_kubeconfig,
            &format!("https://{}", relay.addr()),
            ca.cert_pem(),
            "kubernetes-admin",
            Credentials::Certificate(&admin),
        )?;
        let client = kubeconfig::client(&admin_kubeconfig).await?;
        wait_ready(&client, &mut partial.daemons).await?;

        // The controller manager talks to the API server inside the namespace.
        let kcm_cert = ca.client("system:kube-controller-manager", None)?;
        let kcm_kubeconfig = dir.join("controller-manager.kubeconfig");
        kubeconfig::write(
            &kcm_kubeconfig,
            &format!("https://127.0.0.1:{API_PORT}"),
            ca.cert_pem(),
            "system:kube-controller-manager",
            Credentials::Certificate(&kcm_cert),
        )?;
        let mut kcm = cp_ns.command(&bins.path("kube-controller-manager").display().to_string());
        kcm.args([
            format!("--kubeconfig={}", kcm_kubeconfig.display()),
            format!("--authentication-kubeconfig={}", kcm_kubeconfig.display()),
            format!("--authorization-kubeconfig={}", kcm_kubeconfig.display()),
            "--bind-address=127.0.0.1".to_string(),
            format!("--cluster-signing-cert-file={}", ca_crt.display()),
            format!("--cluster-signing-key-file={}", ca_key.display()),
            format!("--service-account-private-key-file={}", sa_key.display()),
            format!("--root-ca-file={}", ca_crt.display()),
            "--use-service-account-credentials=true".to_string(),
            "--controllers=*,bootstrapsigner,tokencleaner".to_string(),
            "--leader-elect=false".to_string(),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            "--profiling=false".to_string(),
            "--v=1".to_string(),
        ]);
        partial.daemons.push(Daemon::spawn(
            "kube-controller-manager",
            kcm,
            &dir.join("kube-controller-manager.log"),
        )?);
        wait_controllers(&client, &mut partial.daemons).await?;

        let daemons = std::mem::take(&mut partial.daemons);
        partial.disarm();
        Ok(ControlPlane {
            dir,
            bins: bins.clone(),
            ca,
            net,
            relay,
            admin_kubeconfig,
            daemons: Mutex::new(daemons),
        })
    }

    /// The control plane's directory (certificates, kubeconfigs, logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The binaries it runs.
    pub fn bins(&self) -> &UpstreamBins {
        &self.bins
    }

    /// Its network namespace and node links.
    pub fn net(&self) -> &ControlPlaneNet {
        &self.net
    }

    /// The CA certificate (PEM) every server and client certificate chains to.
    pub fn ca_pem(&self) -> &str {
        self.ca.cert_pem()
    }

    /// `pki/ca.crt`.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("pki/ca.crt")
    }

    /// The cluster-admin kubeconfig (through the host relay).
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// A cluster-admin client.
    pub async fn admin_client(&self) -> Result<kube::Client, UpstreamError> {
        kubeconfig::client(&self.admin_kubeconfig).await
    }

    /// The API server URL as reached from `reach`.
    pub fn server(&self, reach: Reach) -> String {
        match reach {
            Reach::Host => format!("https://{}", self.relay.addr()),
            Reach::Node => format!("https://{API_IP}:{API_PORT}"),
        }
    }

    /// A client certificate signed by the cluster CA (CN = user, O = group).
    pub fn client_cert(&self, user: &str, group: Option<&str>) -> Result<CertPair, UpstreamError> {
        self.ca.client(user, group)
    }

    /// A serving certificate for a node agent on `ip`, signed by the CA the
    /// API server checks kubelets against.
    pub fn serving_cert(&self, node: &str, ip: IpAddr) -> Result<CertPair, UpstreamError> {
        self.ca.server(node, &[node], &[ip])
    }

    /// Writes a kubeconfig for `user` in `group` with a client certificate.
    pub fn write_kubeconfig(
        &self,
        path: &Path,
        user: &str,
        group: Option<&str>,
        reach: Reach,
    ) -> Result<(), UpstreamError> {
        let cert = self.client_cert(user, group)?;
        kubeconfig::write(
            path,
            &self.server(reach),
            self.ca_pem(),
            user,
            Credentials::Certificate(&cert),
        )
    }

    /// Writes a kubeconfig that authenticates with a bearer token.
    pub fn write_token_kubeconfig(
        &self,
        path: &Path,
        user: &str,
        token: &str,
        reach: Reach,
    ) -> Result<(), UpstreamError> {
        kubeconfig::write(
            path,
            &self.server(reach),
            self.ca_pem(),
            user,
            Credentials::Token(token),
        )
    }

    /// A node's kubeconfig: `system:node:<name>` in `system:nodes`, what
    /// the Node authorizer and NodeRestriction know.
    pub fn write_node_kubeconfig(&self, path: &Path, node: &str) -> Result<(), UpstreamError> {
        self.write_kubeconfig(
            path,
            &format!("system:node:{node}"),
            Some("system:nodes"),
            Reach::Node,
        )
    }

    /// kube-proxy's kubeconfig: `system:kube-proxy`, bound to
    /// `system:node-proxier` by the API server's bootstrap RBAC and
    /// nothing else.
    pub fn write_proxy_kubeconfig(&self, path: &Path) -> Result<(), UpstreamError> {
        self.write_kubeconfig(path, "system:kube-proxy", None, Reach::Node)
    }

    /// Starts `cmd` (made with [`ControlPlane::net`]'s namespace) as a
    /// daemon of the control plane: logged to `<dir>/<name>.log`, checked
    /// by [`ControlPlane::check_running`], stopped with it.
    pub fn spawn_daemon(
        &self,
        name: &str,
        cmd: std::process::Command,
    ) -> Result<(), UpstreamError> {
        let daemon = Daemon::spawn(name, cmd, &self.dir.join(format!("{name}.log")))?;
        self.daemons
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(daemon);
        Ok(())
    }

    /// Starts kube-scheduler (`system:kube-scheduler`, no leader
    /// election), for clusters whose pods are not bound by hand.
    pub fn start_scheduler(&self) -> Result<(), UpstreamError> {
        let kubeconfig = self.dir.join("scheduler.kubeconfig");
        self.write_kubeconfig(&kubeconfig, "system:kube-scheduler", None, Reach::Node)?;
        let mut cmd = self
            .net
            .netns()
            .command(&self.bins.path("kube-scheduler").display().to_string());
        cmd.args([
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--authentication-kubeconfig={}", kubeconfig.display()),
            format!("--authorization-kubeconfig={}", kubeconfig.display()),
            "--bind-address=127.0.0.1".to_string(),
            "--leader-elect=false".to_string(),
            "--profiling=false".to_string(),
            "--v=1".to_string(),
        ]);
        self.spawn_daemon("kube-scheduler", cmd)
    }

    /// `Err` with the log tail of a control plane process that exited.
    pub fn check_running(&self) -> Result<(), UpstreamError> {
        let mut daemons = self.daemons.lock().unwrap_or_else(|p| p.into_inner());
        daemons.iter_mut().try_for_each(Daemon::check_running)
    }

    /// The last lines of every control plane log, for a failing test.
    pub fn log_tails(&self, lines: usize) -> String {
        let daemons = self.daemons.lock().unwrap_or_else(|p| p.into_inner());
        daemons
            .iter()
            .map(|d| format!("--- {} ---\n{}", d.name(), d.log_tail(lines)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl ControlPlane {
    /// Stops the processes (controller manager first, etcd last) and
    /// removes the namespace and the directory. Idempotent; also done on drop.
    pub fn shutdown(&self) {
        let mut daemons = self.daemons.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(mut d) = daemons.pop() {
            d.stop();
        }
        drop(daemons);
        stale::remove(&self.dir);
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Polls `probe` until it answers, failing at once with the log of a
/// process that exited, and after two minutes with the logs' tails.
async fn wait_serving<F, Fut>(
    what: &str,
    daemons: &mut [Daemon],
    mut probe: F,
) -> Result<(), UpstreamError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    wait_for(
        what,
        Duration::from_secs(120),
        Duration::from_millis(250),
        || {
            let exited = daemons
                .iter_mut()
                .map(Daemon::check_running)
                .find_map(Result::err);
            let answer = probe();
            async move {
                match exited {
                    Some(e) => Ok(Err(e)),
                    None => answer.await.map(Ok),
                }
            }
        },
    )
    .await
    .map_err(|e| UpstreamError::Setup {
        context: format!("waiting for {what}"),
        message: format!("{e}\n{}", tails(daemons)),
    })?
}

async fn wait_ready(client: &kube::Client, daemons: &mut [Daemon]) -> Result<(), UpstreamError> {
    wait_serving("kube-apiserver /readyz", daemons, || {
        let client = client.clone();
        async move {
            let req = http::Request::get("/readyz")
                .body(Vec::new())
                .map_err(|e| e.to_string())?;
            client
                .request_text(req)
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        }
    })
    .await
}

async fn wait_controllers(
    client: &kube::Client,
    daemons: &mut [Daemon],
) -> Result<(), UpstreamError> {
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    wait_serving(
        "kube-controller-manager to create the default ServiceAccount",
        daemons,
        || {
            let sas = sas.clone();
            async move {
                match sas.get_opt("default").await {
                    Ok(Some(_)) => Ok(()),
                    Ok(None) => Err("not yet".to_string()),
                    Err(e) => Err(e.to_string()),
                }
            }
        },
    )
    .await
}

fn tails(daemons: &[Daemon]) -> String {
    daemons
        .iter()
        .map(|d| format!("--- {} ---\n{}", d.name(), d.log_tail(30)))
        .collect::<Vec<_>>()
        .join("\n")
}

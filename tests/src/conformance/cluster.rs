//! The conformance cluster: the upstream tier's control plane with
//! kube-scheduler and cluster DNS, and `--nodes` nodes of the chosen
//! agents, all Ready before the suite starts; what the cluster lacks
//! (an OpenAPI document) is probed and recorded for [`super::skips`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::containerd::ContainerdOptions;
use crate::images::{self, e2e};
use crate::upstream::control_plane::ControlPlane;
use crate::upstream::kubeconfig::{self, Credentials};
use crate::upstream::network::API_PORT;
use crate::upstream::{ClusterNode, NodeSpec, UpstreamError};

use super::skips::Environment;
use super::{ConformanceError, Options, dns};
use crate::support::wait_for;

/// A running conformance cluster; dropping it removes everything.
pub struct Cluster {
    /// The nodes (dropped before the control plane).
    pub nodes: Vec<ClusterNode>,
    /// The control plane.
    pub cp: Arc<ControlPlane>,
    /// A cluster-admin kubeconfig that reaches the API server from inside
    /// the control plane's namespace (where the suite runs).
    pub kubeconfig: PathBuf,
    /// What the cluster lacks ([`skips`]).
    pub environment: Environment,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("cp", &self.cp)
            .field("nodes", &self.nodes.len())
            .finish()
    }
}

impl Cluster {
    /// Builds the e2e images, starts the control plane, the scheduler,
    /// DNS and the nodes, and waits until every node is Ready.
    pub async fn start(opts: &Options) -> Result<Cluster, ConformanceError> {
        let image_dir = opts.out.join("images");
        let (bins_dir, files, dir) = (
            opts.bins.dir().to_path_buf(),
            opts.image_files.clone(),
            image_dir.clone(),
        );
        eprintln!("conformance: building the e2e images in {}", dir.display());
        let built = tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&dir).map_err(|source| images::ImageError::Io {
                context: format!("creating {}", dir.display()),
                source,
            })?;
            e2e::build_e2e_images(&bins_dir, &files, &dir)
        })
        .await
        .map_err(|e| ConformanceError::Suite {
            context: "building the e2e images".into(),
            message: e.to_string(),
        })??;

        eprintln!("conformance: starting the control plane");
        let cp = Arc::new(ControlPlane::start(&opts.bins).await?);
        cp.start_scheduler()?;
        let admin = cp.admin_client().await?;
        dns::start(&cp, &admin).await?;
        let environment = Environment {
            openapi_broken: !serves_openapi_v2(&admin).await,
        };
        if environment.openapi_broken {
            eprintln!(
                "conformance: the API server serves no OpenAPI v2 document: the tests that need it are left out (tests/src/conformance/skips.rs)"
            );
        }

        let mut cluster = Cluster {
            nodes: Vec::new(),
            kubeconfig: cp.dir().join("e2e.kubeconfig"),
            cp,
            environment,
        };
        cluster.write_suite_kubeconfig()?;
        for i in 1..=opts.nodes {
            let name = format!("{}-node-{i}", opts.agents.name());
            eprintln!("conformance: starting node {name}");
            let spec = NodeSpec {
                runtime: ContainerdOptions {
                    sandbox_image: Some(e2e::PAUSE.to_string()),
                    host_ports: true,
                    extra_images: built.clone(),
                    ..ContainerdOptions::default()
                },
                ..NodeSpec::of(opts.agents)
            };
            cluster
                .nodes
                .push(ClusterNode::start(&cluster.cp, &name, spec).await?);
        }
        for node in &cluster.nodes {
            node.wait_ready(&admin).await?;
        }
        Ok(cluster)
    }

    /// A cluster-admin kubeconfig for `https://127.0.0.1:6443`, which the
    /// suite and its kubectl use from inside the control plane's namespace.
    fn write_suite_kubeconfig(&self) -> Result<(), UpstreamError> {
        let admin = self
            .cp
            .client_cert("kubernetes-admin", Some("system:masters"))?;
        kubeconfig::write(
            &self.kubeconfig,
            &format!("https://127.0.0.1:{API_PORT}"),
            self.cp.ca_pem(),
            "kubernetes-admin",
            Credentials::Certificate(&admin),
        )
    }

    /// `Err` when a control plane process or an agent exited.
    pub fn check_running(&self) -> Result<(), UpstreamError> {
        self.cp.check_running()?;
        self.nodes.iter().try_for_each(ClusterNode::check_running)
    }

    /// Copies the agents' and the control plane's logs into `dir` (they
    /// are removed with the cluster).
    pub fn save_logs(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let mut logs: Vec<(String, PathBuf)> = Vec::new();
        for node in &self.nodes {
            for path in [node.node_log(), node.proxy_log()].into_iter().flatten() {
                let file = path.file_name().map(|f| f.to_string_lossy().into_owned());
                logs.push((format!("{}-{}", node.name, file.unwrap_or_default()), path));
            }
        }
        for entry in std::fs::read_dir(self.cp.dir())? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "log") {
                let file = path.file_name().map(|f| f.to_string_lossy().into_owned());
                logs.push((file.unwrap_or_default(), path));
            }
        }
        logs.sort();
        logs.dedup();
        for (name, path) in logs {
            std::fs::copy(&path, dir.join(name))?;
        }
        Ok(())
    }
}

/// Whether `GET /openapi/v2` in kubectl's protobuf form answers within
/// 30 s (it answers 503 while the API server builds the document, and for
/// good when it cannot).
async fn serves_openapi_v2(admin: &kube::Client) -> bool {
    wait_for(
        "the API server's OpenAPI v2 document",
        Duration::from_secs(30),
        Duration::from_secs(1),
        || {
            let admin = admin.clone();
            async move {
                // kubectl asks for the protobuf form; the JSON form can
                // answer where the protobuf one fails.
                let req = http::Request::get("/openapi/v2")
                    .header(
                        http::header::ACCEPT,
                        "application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
                    )
                    .body(kube::client::Body::from(Vec::new()))
                    .map_err(|e| e.to_string())?;
                let status = admin.send(req).await.map_err(|e| e.to_string())?.status();
                if status.is_success() {
                    Ok(())
                } else {
                    Err(format!("GET /openapi/v2: {status}"))
                }
            }
        },
    )
    .await
    .is_ok()
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Nodes first: their agents talk to the control plane until stopped.
        self.nodes.clear();
        self.cp.shutdown();
    }
}

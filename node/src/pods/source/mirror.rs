//! Mirror pods (kubelet's `MirrorClient`): the API's read-only copy of each
//! static pod, owned by the Node, annotated with the manifest hash; the
//! static pod's status is written to it.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Api;
use kube::api::{DeleteParams, PostParams, Preconditions};
use tokio::sync::Mutex;

use crate::pod::podutil::{self, CONFIG_MIRROR_ANNOTATION};

/// Why a mirror pod could not be created or deleted (kubelet's
/// `basicMirrorClient` texts).
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    /// The Node could not be read.
    #[error("failed to get node info: {0}")]
    GetNode(kube::Error),
    /// A mirror pod of another version of the static pod is in the way.
    #[error("mirror pod {0} already exists and differs")]
    Differs(String),
    /// The API refused the mirror pod.
    #[error("failed creating a mirror pod for {pod}: {error}")]
    Create {
        /// `namespace/name`.
        pod: String,
        /// Why.
        error: kube::Error,
    },
    /// The API refused the deletion.
    #[error("failed deleting mirror pod {pod}: {error}")]
    Delete {
        /// `namespace/name`.
        pod: String,
        /// Why.
        error: kube::Error,
    },
}

/// Creates and deletes mirror pods.
#[derive(Clone)]
pub struct MirrorClient {
    client: kube::Client,
    node_name: String,
    node_uid: Arc<Mutex<Option<String>>>,
}

impl std::fmt::Debug for MirrorClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MirrorClient")
            .field("node", &self.node_name)
            .finish()
    }
}

/// `IsMirrorPodOf`: same full name and the mirror carries the static
/// pod's hash.
pub fn is_mirror_pod_of(mirror: &Pod, static_pod: &Pod) -> bool {
    podutil::full_name(mirror) == podutil::full_name(static_pod)
        && podutil::mirror_hash(mirror).is_some()
        && podutil::mirror_hash(mirror) == podutil::config_hash(static_pod)
}

impl MirrorClient {
    /// Mirror pods owned by `node_name`.
    pub fn new(client: kube::Client, node_name: &str) -> Self {
        MirrorClient {
            client,
            node_name: node_name.to_string(),
            node_uid: Arc::new(Mutex::new(None)),
        }
    }

    async fn node(&self) -> Result<Node, MirrorError> {
        let api: Api<Node> = Api::all(self.client.clone());
        api.get(&self.node_name).await.map_err(MirrorError::GetNode)
    }

    /// `CreateMirrorPod`: none is created while the Node is missing or
    /// being deleted.
    pub async fn create(&self, static_pod: &Pod) -> Result<(), MirrorError> {
        let node = self.node().await?;
        if node.metadata.deletion_timestamp.is_some() {
            tracing::info!(node = %self.node_name, "no need to create a mirror pod, since node has been removed from the cluster");
            return Ok(());
        }
        let node_uid = node.metadata.uid.clone().unwrap_or_default();
        *self.node_uid.lock().await = Some(node_uid.clone());
        let hash = podutil::config_hash(static_pod)
            .unwrap_or_default()
            .to_string();
        let mut copy = static_pod.clone();
        copy.metadata.uid = None;
        copy.metadata.resource_version = None;
        copy.metadata.creation_timestamp = None;
        copy.status = None;
        copy.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(CONFIG_MIRROR_ANNOTATION.into(), hash.clone());
        copy.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: self.node_name.clone(),
            uid: node_uid,
            controller: Some(true),
            block_owner_deletion: None,
        }]);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), podutil::namespace(static_pod));
        match api.create(&PostParams::default(), &copy).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let existing = api.get_opt(podutil::name(static_pod)).await.ok().flatten();
                if existing.is_some_and(|e| podutil::mirror_hash(&e) == Some(hash.as_str())) {
                    Ok(())
                } else {
                    Err(MirrorError::Differs(podutil::key(static_pod)))
                }
            }
            Err(error) => Err(MirrorError::Create {
                pod: podutil::key(static_pod),
                error,
            }),
        }
    }

    /// `DeleteMirrorPod`: grace 0, guarded by the mirror's UID.
    pub async fn delete(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
    ) -> Result<bool, MirrorError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: uid.map(|u| Preconditions {
                uid: Some(u.to_string()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(name, &dp).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
            Err(error) => Err(MirrorError::Delete {
                pod: format!("{namespace}/{name}"),
                error,
            }),
        }
    }
}

//! What a projected volume holds: configMap, secret and downwardAPI sources
//! as their own volumes would, and service account tokens from the
//! TokenRequest API bound to the pod. ClusterTrustBundle and podCertificate
//! sources are not supported: an optional ClusterTrustBundle source is
//! skipped with a Warning event, a required one (and any podCertificate
//! source) fails the volume with a message saying so.

use std::collections::BTreeSet;

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ProjectedVolumeSource};

use super::atomic_writer::{FileProjection, Payload};
use super::ownership::{fs_group_from, fs_user_from};
use super::{VolumeManager, ns_of, payload, uid_of};
use keelson_common::events::EventType;

impl VolumeManager {
    pub(super) async fn collect_projected(
        &self,
        pod: &Pod,
        volume: &str,
        src: &ProjectedVolumeSource,
        warned: &mut BTreeSet<String>,
    ) -> Result<Payload, String> {
        let ns = ns_of(pod);
        let default_mode = src.default_mode.unwrap_or(payload::DEFAULT_MODE);
        let fs_user = fs_user_from(pod);
        let fs_group = fs_group_from(pod);
        let mut out = Payload::new();
        let mut errors: Vec<String> = Vec::new();
        for source in src.sources.iter().flatten() {
            if let Some(s) = &source.secret {
                let optional = s.optional == Some(true);
                let obj = match self.inner.secrets.get(ns, &s.name).await {
                    Ok(o) => Some(o),
                    Err(e) if e.is_not_found() && optional => None,
                    Err(e) => {
                        errors.push(e.to_string());
                        continue;
                    }
                };
                match payload::secret(s.items.as_deref(), obj.as_deref(), default_mode, optional) {
                    Ok(p) => out.extend(p),
                    Err(e) => errors.push(e),
                }
            } else if let Some(c) = &source.config_map {
                let optional = c.optional == Some(true);
                let obj = match self.inner.config_maps.get(ns, &c.name).await {
                    Ok(o) => Some(o),
                    Err(e) if e.is_not_found() && optional => None,
                    Err(e) => {
                        errors.push(e.to_string());
                        continue;
                    }
                };
                match payload::config_map(
                    c.items.as_deref(),
                    obj.as_deref(),
                    default_mode,
                    optional,
                ) {
                    Ok(p) => out.extend(p),
                    Err(e) => errors.push(e),
                }
            } else if let Some(d) = &source.downward_api {
                match payload::downward_api(
                    d.items.as_deref().unwrap_or_default(),
                    pod,
                    &(self.inner.allocatable)(),
                    default_mode,
                ) {
                    Ok(p) => out.extend(p),
                    Err(e) => errors.push(e),
                }
            } else if let Some(t) = &source.service_account_token {
                // With fsGroup the ownership pass widens 0600 to 0640.
                let mode = if fs_user.is_some() || fs_group.is_some() {
                    0o600
                } else {
                    default_mode
                };
                let audiences = t
                    .audience
                    .as_ref()
                    .filter(|a| !a.is_empty())
                    .map(|a| vec![a.clone()]);
                let request = TokenRequest {
                    spec: Some(TokenRequestSpec {
                        audiences,
                        expiration_seconds: t.expiration_seconds,
                        bound_object_ref: Some(BoundObjectReference {
                            api_version: Some("v1".to_string()),
                            kind: Some("Pod".to_string()),
                            name: pod.metadata.name.clone(),
                            uid: Some(uid_of(pod).to_string()),
                        }),
                    }),
                    ..TokenRequest::default()
                };
                let sa = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.service_account_name.clone())
                    .filter(|s| !s.is_empty())
                    .unwrap_or_else(|| "default".to_string());
                match self
                    .inner
                    .tokens
                    .get_service_account_token(ns, &sa, &request)
                    .await
                {
                    Ok(tr) => {
                        let token = tr.status.and_then(|s| s.token).unwrap_or_default();
                        out.insert(
                            t.path.clone(),
                            FileProjection {
                                data: token.into_bytes(),
                                mode: (mode as u32) & 0o7777,
                                fs_user,
                            },
                        );
                    }
                    Err(e) => errors.push(e.to_string()),
                }
            } else if let Some(b) = &source.cluster_trust_bundle {
                let what = match (&b.name, &b.signer_name) {
                    (Some(n), _) => format!("name {n:?}"),
                    (None, Some(s)) => format!("signerName {s:?}"),
                    _ => "no name".to_string(),
                };
                if b.optional == Some(true) {
                    if warned.insert(format!("ctb/{volume}/{}", b.path)) {
                        self.event(
                            pod,
                            EventType::Warning,
                            "ClusterTrustBundleSkipped",
                            format!(
                                "projected volume {volume:?}: optional clusterTrustBundle source ({what}) for path {:?} skipped: keelson does not project ClusterTrustBundles",
                                b.path
                            ),
                        );
                    }
                } else {
                    errors.push(format!(
                        "clusterTrustBundle source ({what}) for path {:?}: keelson does not project ClusterTrustBundles; mark the source optional to start the pod without it",
                        b.path
                    ));
                }
            } else if source.pod_certificate.is_some() {
                errors.push("podCertificate projection is not supported by keelson".to_string());
            }
        }
        if errors.is_empty() {
            Ok(out)
        } else {
            Err(payload::aggregate(&errors))
        }
    }
}

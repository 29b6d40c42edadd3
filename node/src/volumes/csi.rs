//! CSI volumes, as kubelet v1.36's CSI volume plugin mounts them
//! (`pkg/volume/csi/csi_mounter.go` `SetUpAt` / `TearDownAt`):
//!
//! - inline `csi` volumes (the ephemeral lifecycle): the CSIDriver object
//!   must list `Ephemeral` in `volumeLifecycleModes`; the volume handle is
//!   `csi-<sha256(pod UID + volume name)>`; attributes, `fsType`,
//!   `readOnly` and `nodePublishSecretRef` come from the pod;
//! - `NodePublishVolume` to `<pod>/volumes/kubernetes.io~csi/<volume>/mount`
//!   after `vol_data.json` (what teardown needs) is written beside it;
//!   `podInfoOnMount` adds `csi.storage.k8s.io/pod.*`, `tokenRequests`
//!   adds `csi.storage.k8s.io/serviceAccount.tokens` (in the secrets with
//!   `serviceAccountTokenInSecrets`); `fsGroup` goes to the driver when it
//!   has `VOLUME_MOUNT_GROUP`, else keelson applies it as `fsGroupPolicy`
//!   says (`fsGroupChangePolicy: OnRootMismatch` honoured);
//! - CSI PersistentVolumes: the same publish (`publish_csi`) with the PV's
//!   parameters and the staging path, after the attachment
//!   (`csi_attach.rs`) and the staging (`csi_device.rs`);
//! - teardown: `NodeUnpublishVolume` for every directory of the plugin
//!   (from its `vol_data.json`, so it also works for pods of an earlier
//!   keelson process), then the mount directory, `vol_data.json` and the
//!   volume directory are removed when nothing is mounted there; a
//!   PersistentVolume's device is then unstaged when no pod uses it.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, Secret, Volume};
use k8s_openapi::api::storage::v1::CSIDriver;
use kube::Api;
use sha2::{Digest, Sha256};

use super::csi_attach::attachment_name;
use super::csi_data::{key, load_vol_data, remove_mount_dir, save_vol_data};
use super::ownership::{fs_group_from, set_volume_ownership};
use super::plugins::{Plugin, blocking};
use super::{Mounted, VolumeManager, ns_of, uid_of};
use crate::csi::PLUGIN_NAME;
use crate::csi::client::{Access, VolumeRequest, access_mode};

/// `<pod>/volumes/kubernetes.io~csi`.
pub const CSI_DIR: &str = "kubernetes.io~csi";
pub use super::csi_data::VOL_DATA_FILE;

/// `csi.storage.k8s.io/ephemeral` and the other pod info keys
/// (`getPodInfoAttrs`).
fn pod_info(pod: &Pod, ephemeral: bool) -> HashMap<String, String> {
    let sa = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_default();
    [
        (
            "csi.storage.k8s.io/pod.name",
            pod.metadata.name.clone().unwrap_or_default(),
        ),
        ("csi.storage.k8s.io/pod.namespace", ns_of(pod).to_string()),
        ("csi.storage.k8s.io/pod.uid", uid_of(pod).to_string()),
        ("csi.storage.k8s.io/serviceAccount.name", sa),
        ("csi.storage.k8s.io/ephemeral", ephemeral.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// `makeVolumeHandle`: `csi-<sha256(podUID + volume name)>`.
pub fn ephemeral_volume_handle(pod_uid: &str, volume: &str) -> String {
    let digest = Sha256::digest(format!("{pod_uid}{volume}").as_bytes());
    format!("csi-{}", hex::encode(digest))
}

/// The CSIDriver's `fsGroupPolicy` as kubelet reads it
/// (`getFSGroupPolicy`): no CSIDriver is `ReadWriteOnceWithFSType`, a
/// CSIDriver without one is an error.
fn fs_group_policy(driver: Option<&CSIDriver>) -> Result<String, String> {
    match driver {
        None => Ok("ReadWriteOnceWithFSType".to_string()),
        Some(d) => d
            .spec
            .fs_group_policy
            .clone()
            .filter(|p| !p.is_empty())
            .ok_or_else(|| {
                format!("{PLUGIN_NAME}: expected valid fsGroupPolicy, received nil value or empty string")
            }),
    }
}

/// `supportsVolumeLifecycleMode` for `mode`.
fn check_lifecycle(driver: Option<&CSIDriver>, name: &str, mode: &str) -> Result<(), String> {
    match driver {
        None if mode == "Persistent" => Ok(()),
        None => Err(format!(
            "volume mode {mode:?} not supported by driver {name} (no CSIDriver object)"
        )),
        Some(d) => {
            let modes = d
                .spec
                .volume_lifecycle_modes
                .clone()
                .unwrap_or_else(|| vec!["Persistent".to_string()]);
            if modes.iter().any(|m| m == mode) {
                Ok(())
            } else {
                let q: Vec<String> = modes.iter().map(|m| format!("{m:?}")).collect();
                Err(format!(
                    "volume mode {mode:?} not supported by driver {name} (only supports [{}])",
                    q.join(" ")
                ))
            }
        }
    }
}

/// `supportsFSGroup` for an inline volume (always ReadWriteOnce).
fn applies_fs_group(policy: &str, fs_type: &str, read_only: bool) -> bool {
    match policy {
        "None" => false,
        _ if read_only => false,
        "File" => true,
        _ => !fs_type.is_empty(),
    }
}

/// kubelet's `requiresPermissionChange` for `OnRootMismatch`: the root
/// already has the group, the permissions and setgid.
fn root_matches(dir: &Path, gid: u32, read_only: bool) -> bool {
    let Ok(meta) = std::fs::metadata(dir) else {
        return false;
    };
    if meta.gid() != gid || !meta.is_dir() {
        return false;
    }
    let want = if read_only { 0o440 } else { 0o660 } | 0o110;
    let mode = meta.permissions().mode();
    mode & want == want && mode & 0o2000 != 0
}

/// What `SetUpAt` publishes: an inline volume's or a PersistentVolume's
/// parameters.
#[derive(Debug, Clone)]
pub(super) struct PublishSpec {
    /// The CSI driver.
    pub(super) driver: String,
    /// `Ephemeral` (inline) or `Persistent`.
    pub(super) lifecycle: &'static str,
    /// The volume's directory name: the pod volume's name (inline) or the
    /// PV's name.
    pub(super) spec_name: String,
    /// `volume_id`.
    pub(super) handle: String,
    /// `readonly`.
    pub(super) read_only: bool,
    /// `fsType`.
    pub(super) fs_type: String,
    /// The volume's attributes.
    pub(super) attributes: HashMap<String, String>,
    /// `nodePublishSecretRef` as (namespace, name).
    pub(super) secret_ref: Option<(String, String)>,
    /// The API access mode (the PV's first; inline volumes ReadWriteOnce).
    pub(super) access_mode: String,
    /// fsGroup may apply: an inline volume, or a PV whose access modes
    /// include ReadWriteOnce (`supportsFSGroup`).
    pub(super) read_write_once: bool,
    /// The PV's `mountOptions`.
    pub(super) mount_options: Vec<String>,
    /// The staging path (`globalmount`) when the driver stages.
    pub(super) staging: Option<PathBuf>,
    /// The VolumeAttachment's `attachmentMetadata`.
    pub(super) publish_context: HashMap<String, String>,
}

impl VolumeManager {
    /// Sets up an inline `csi` volume (`SetUpAt`, ephemeral lifecycle).
    pub(super) async fn setup_inline_csi(
        &self,
        pod: &Pod,
        vol: &Volume,
    ) -> Result<Mounted, String> {
        let src = vol.csi.clone().unwrap_or_default();
        let uid = uid_of(pod).to_string();
        let spec = PublishSpec {
            driver: src.driver.clone(),
            lifecycle: "Ephemeral",
            spec_name: vol.name.clone(),
            handle: ephemeral_volume_handle(&uid, &vol.name),
            read_only: src.read_only == Some(true),
            fs_type: src.fs_type.clone().unwrap_or_default(),
            attributes: src
                .volume_attributes
                .clone()
                .unwrap_or_default()
                .into_iter()
                .collect(),
            secret_ref: src
                .node_publish_secret_ref
                .as_ref()
                .map(|r| (ns_of(pod).to_string(), r.name.clone())),
            access_mode: "ReadWriteOnce".to_string(),
            read_write_once: true,
            mount_options: Vec::new(),
            staging: None,
            publish_context: HashMap::new(),
        };
        self.publish_csi(pod, spec).await
    }

    /// `SetUpAt` for both lifecycles: the checks against the CSIDriver,
    /// `vol_data.json`, `NodePublishVolume`, then fsGroup when keelson
    /// applies it.
    pub(super) async fn publish_csi(
        &self,
        pod: &Pod,
        spec: PublishSpec,
    ) -> Result<Mounted, String> {
        let Some(csi) = self.inner.csi.clone() else {
            return Err(format!("{PLUGIN_NAME}: CSI is not enabled on this node"));
        };
        let driver_name = spec.driver.clone();
        let client = csi
            .client(&driver_name)
            .map_err(|e| format!("{PLUGIN_NAME}: mounter.SetUpAt failed to get CSI client: {e}"))?;
        let driver = csi.lister().get(&driver_name).await.map_err(|e| {
            format!("{PLUGIN_NAME}: mounter.SetupAt failed to check volume lifecycle mode: {e}")
        })?;
        check_lifecycle(driver.as_deref(), &driver_name, spec.lifecycle).map_err(|e| {
            format!("{PLUGIN_NAME}: mounter.SetupAt failed to check volume lifecycle mode: {e}")
        })?;
        let policy = fs_group_policy(driver.as_deref()).map_err(|e| {
            format!("{PLUGIN_NAME}: mounter.SetupAt failed to check fsGroup policy: {e}")
        })?;
        let uid = uid_of(pod).to_string();
        let read_only = spec.read_only;
        let fs_type = spec.fs_type.clone();
        let handle = spec.handle.clone();
        let vol_dir = self.inner.layout.volume_dir(&uid, CSI_DIR, &spec.spec_name);
        let mount_dir = vol_dir.join("mount");

        let mut secrets = HashMap::new();
        if let Some((ns, name)) = &spec.secret_ref {
            secrets = self.csi_secret(ns, name, "NodePublishSecretRef").await?;
        }
        let mut attrs = spec.attributes.clone();
        if driver
            .as_ref()
            .is_some_and(|d| d.spec.pod_info_on_mount == Some(true))
        {
            attrs.extend(pod_info(pod, spec.lifecycle == "Ephemeral"));
        }
        if let Some(d) = &driver {
            let (tokens, in_secrets) = self.csi_token_attrs(pod, d).await.map_err(|e| {
                format!("{PLUGIN_NAME}: mounter.SetUpAt failed to get service accoount token attributes: {e}")
            })?;
            if in_secrets {
                secrets.extend(tokens);
            } else {
                attrs.extend(tokens);
            }
        }
        let caps = client.node_get_capabilities().await.map_err(|e| {
            format!("{PLUGIN_NAME}: mounter.SetUpAt failed to determine if the node service has VOLUME_MOUNT_GROUP capability: {e}")
        })?;
        let fs_group = fs_group_from(pod);
        let mount_group = if caps.volume_mount_group {
            fs_group.map(i64::from)
        } else {
            None
        };

        // The volume's directory and what teardown needs, then publish.
        let data: BTreeMap<&str, String> = [
            (key::SPEC_VOL_ID, spec.spec_name.clone()),
            (key::VOLUME_HANDLE, handle.clone()),
            (key::DRIVER_NAME, driver_name.clone()),
            (key::NODE_NAME, csi.node_name().to_string()),
            (key::LIFECYCLE_MODE, spec.lifecycle.to_string()),
            (
                key::ATTACHMENT_ID,
                attachment_name(&handle, &driver_name, csi.node_name()),
            ),
        ]
        .into();
        let dir = vol_dir.clone();
        blocking(move || save_vol_data(&dir, &data)).await?;
        let request = VolumeRequest {
            volume_id: handle,
            publish_context: spec.publish_context.clone(),
            volume_context: attrs,
            secrets,
            access_mode: access_mode(&spec.access_mode, caps.single_node_multi_writer),
            access: Access::Mount {
                fs_type: fs_type.clone(),
                flags: spec.mount_options.clone(),
                mount_group,
            },
        };
        if let Err(e) = client
            .node_publish_volume(&request, spec.staging.as_deref(), &mount_dir, read_only)
            .await
        {
            if e.is_final() {
                let mounter = self.inner.mounter.clone();
                let m = mount_dir.clone();
                if let Err(r) = blocking(move || remove_mount_dir(mounter.as_ref(), &m)).await {
                    tracing::error!(dir = %mount_dir.display(), error = %r, "removing the mount dir after a NodePublish error");
                }
            }
            return Err(e.to_string());
        }
        if mount_group.is_none()
            && let Some(gid) = fs_group
            && spec.read_write_once
            && applies_fs_group(&policy, &fs_type, read_only)
        {
            let on_root_mismatch = pod
                .spec
                .as_ref()
                .and_then(|s| s.security_context.as_ref())
                .and_then(|s| s.fs_group_change_policy.as_deref())
                == Some("OnRootMismatch");
            let m = mount_dir.clone();
            let handle = request.volume_id.clone();
            blocking(move || {
                if on_root_mismatch && root_matches(&m, gid, read_only) {
                    return Ok(());
                }
                set_volume_ownership(&m, Some(gid), read_only)
                    .map_err(|e| format!("applyFSGroup failed for vol {handle}: {e}"))
            })
            .await?;
        }
        Ok(Mounted {
            plugin: Plugin::Csi,
            path: mount_dir,
            read_only,
            selinux_labeled: false,
        })
    }

    /// `getCredentialsFromSecret` for the secret reference `what`.
    pub(super) async fn csi_secret(
        &self,
        ns: &str,
        name: &str,
        what: &str,
    ) -> Result<HashMap<String, String>, String> {
        let Some(csi) = self.inner.csi.clone() else {
            return Err(format!("{PLUGIN_NAME}: CSI is not enabled on this node"));
        };
        let api: Api<Secret> = Api::namespaced(csi.api_client(), ns);
        let secret = api.get(name).await.map_err(|e| {
            format!(
                "fetching {what} {ns}/{name} failed: {PLUGIN_NAME}: failed to find the secret {name} in the namespace {ns} with error: {}",
                super::tokens::api_message(&e)
            )
        })?;
        Ok(secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
            .collect())
    }

    /// `podServiceAccountTokenAttrs`: a token per `tokenRequests` entry,
    /// bound to the pod, as `csi.storage.k8s.io/serviceAccount.tokens`
    /// (JSON audience → TokenRequestStatus); and whether they go into the
    /// secrets.
    async fn csi_token_attrs(
        &self,
        pod: &Pod,
        driver: &CSIDriver,
    ) -> Result<(HashMap<String, String>, bool), String> {
        let requests = driver.spec.token_requests.clone().unwrap_or_default();
        if requests.is_empty() {
            return Ok((HashMap::new(), false));
        }
        let sa = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default();
        let mut outputs = BTreeMap::new();
        for r in requests {
            let audiences = if r.audience.is_empty() {
                vec![]
            } else {
                vec![r.audience.clone()]
            };
            let tr = TokenRequest {
                spec: Some(TokenRequestSpec {
                    audiences: Some(audiences),
                    expiration_seconds: r.expiration_seconds,
                    bound_object_ref: Some(BoundObjectReference {
                        api_version: Some("v1".to_string()),
                        kind: Some("Pod".to_string()),
                        name: pod.metadata.name.clone(),
                        uid: Some(uid_of(pod).to_string()),
                    }),
                }),
                ..TokenRequest::default()
            };
            let got = self
                .inner
                .tokens
                .get_service_account_token(ns_of(pod), &sa, &tr)
                .await
                .map_err(|e| e.to_string())?;
            outputs.insert(r.audience, got.status.unwrap_or_default());
        }
        let json = serde_json::to_string(&outputs).map_err(|e| e.to_string())?;
        Ok((
            [("csi.storage.k8s.io/serviceAccount.tokens".to_string(), json)].into(),
            driver.spec.service_account_token_in_secrets == Some(true),
        ))
    }

    /// Unpublishes every CSI volume of the pod (`TearDownAt`); the
    /// directories of those that failed stay. Errors are joined.
    pub(super) async fn teardown_csi(&self, uid: &str) -> Result<(), String> {
        let plugin_dir = self.inner.layout.pod_volumes_dir(uid).join(CSI_DIR);
        let names = match std::fs::read_dir(&plugin_dir) {
            Ok(r) => r
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect::<Vec<_>>(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(format!("reading {}: {e}", plugin_dir.display())),
        };
        let mut errors = Vec::new();
        for name in names {
            let vol_dir = plugin_dir.join(&name);
            let started = std::time::Instant::now();
            let result = self.teardown_csi_volume(&vol_dir).await;
            self.inner.metrics.operation(
                PLUGIN_NAME,
                "volume_unmount",
                result.is_ok(),
                started.elapsed(),
            );
            if let Err(e) = result {
                errors.push(format!(
                    "UnmountVolume.TearDown failed for volume {name:?} (plugin {CSI_DIR}): {e}"
                ));
            }
        }
        let _ = std::fs::remove_dir(&plugin_dir);
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }

    async fn teardown_csi_volume(&self, vol_dir: &Path) -> Result<(), String> {
        let mount_dir = vol_dir.join("mount");
        let mounter = self.inner.mounter.clone();
        let is_mounted = {
            let m = mount_dir.clone();
            let mounter = mounter.clone();
            blocking(move || {
                Ok(mounter
                    .mount_points()
                    .map_err(|e| e.to_string())?
                    .iter()
                    .any(|p| p.path == m))
            })
            .await?
        };
        let data = match load_vol_data(vol_dir) {
            Ok(d) => Some(d),
            // Without its data a volume that is not mounted can still go.
            Err(_) if !is_mounted => None,
            Err(e) => return Err(e),
        };
        if let Some(d) = &data {
            let Some(csi) = self.inner.csi.clone() else {
                return Err(format!("{PLUGIN_NAME}: CSI is not enabled on this node"));
            };
            let client = csi.client(&d.driver).map_err(|e| {
                format!("{PLUGIN_NAME}: Unmounter.TearDownAt failed to get CSI client: {e}")
            })?;
            client
                .node_unpublish_volume(&d.volume_handle, &mount_dir)
                .await
                .map_err(|e| format!("{PLUGIN_NAME}: Unmounter.TearDownAt failed: {e}"))?;
        }
        let m = mount_dir.clone();
        blocking(move || remove_mount_dir(mounter.as_ref(), &m))
            .await
            .map_err(|e| {
                format!(
                    "{PLUGIN_NAME}: Unmounter.TearDownAt failed to clean mount dir [{}]: {e}",
                    mount_dir.display()
                )
            })?;
        // A PersistentVolume's device goes once no pod uses it.
        match data {
            Some(d) if d.is_persistent() => self
                .unmount_device_if_unused(&d)
                .await
                .map_err(|e| format!("UnmountDevice failed: {e}")),
            _ => Ok(()),
        }
    }
}

/// The path of an inline volume's mount directory (tests, docs).
pub fn mount_path(root: &Path, pod_uid: &str, volume: &str) -> PathBuf {
    super::paths::Layout::new(root)
        .volume_dir(pod_uid, CSI_DIR, volume)
        .join("mount")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::storage::v1::CSIDriverSpec;

    fn driver(modes: Option<&[&str]>, policy: Option<&str>) -> CSIDriver {
        CSIDriver {
            spec: CSIDriverSpec {
                volume_lifecycle_modes: modes.map(|m| m.iter().map(|s| s.to_string()).collect()),
                fs_group_policy: policy.map(String::from),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn handles_as_kubelet() {
        // sha256("uid1" + "vol") and sha256("h" + "d" + "n").
        assert_eq!(
            ephemeral_volume_handle("uid1", "vol"),
            format!("csi-{}", hex::encode(Sha256::digest(b"uid1vol")))
        );
        assert_eq!(
            attachment_name("h", "d", "n"),
            format!("csi-{}", hex::encode(Sha256::digest(b"hdn")))
        );
        assert_eq!(ephemeral_volume_handle("a", "b").len(), 4 + 64);
    }

    #[test]
    fn lifecycle_modes() {
        assert!(check_lifecycle(None, "d", "Persistent").is_ok());
        assert_eq!(
            check_lifecycle(None, "d", "Ephemeral").unwrap_err(),
            r#"volume mode "Ephemeral" not supported by driver d (no CSIDriver object)"#
        );
        assert_eq!(
            check_lifecycle(Some(&driver(Some(&["Persistent"]), None)), "d", "Ephemeral")
                .unwrap_err(),
            r#"volume mode "Ephemeral" not supported by driver d (only supports ["Persistent"])"#
        );
        assert!(
            check_lifecycle(
                Some(&driver(Some(&["Persistent", "Ephemeral"]), None)),
                "d",
                "Ephemeral"
            )
            .is_ok()
        );
    }

    #[test]
    fn fs_group_policies() {
        assert_eq!(fs_group_policy(None).unwrap(), "ReadWriteOnceWithFSType");
        assert_eq!(
            fs_group_policy(Some(&driver(None, None))).unwrap_err(),
            "kubernetes.io/csi: expected valid fsGroupPolicy, received nil value or empty string"
        );
        assert!(applies_fs_group("File", "", false));
        assert!(!applies_fs_group("File", "ext4", true));
        assert!(!applies_fs_group("None", "ext4", false));
        assert!(!applies_fs_group("ReadWriteOnceWithFSType", "", false));
        assert!(applies_fs_group("ReadWriteOnceWithFSType", "ext4", false));
    }

    #[test]
    fn pod_info_keys() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"containers": [], "serviceAccountName": "sa"}
        }))
        .unwrap();
        let info = pod_info(&pod, true);
        assert_eq!(info["csi.storage.k8s.io/pod.name"], "p");
        assert_eq!(info["csi.storage.k8s.io/pod.namespace"], "ns");
        assert_eq!(info["csi.storage.k8s.io/pod.uid"], "u");
        assert_eq!(info["csi.storage.k8s.io/serviceAccount.name"], "sa");
        assert_eq!(info["csi.storage.k8s.io/ephemeral"], "true");
    }
}

//! Resolving a pod's `persistentVolumeClaim` and generic `ephemeral`
//! volumes to the PersistentVolume bound to their claim, with kubelet's
//! checks, order and error texts:
//!
//! - pkg/kubelet/volumemanager/populator/desired_state_of_world_populator.go
//!   (`createVolumeSpec`, `getPVCExtractPV`, `getPVSpec`): PVC from the API
//!   server, refused while being deleted without the `kubernetes.io/pvc-protection`
//!   finalizer, not `Bound`, or without `spec.volumeName`; PV from the API
//!   server, refused without `claimRef` or with a `claimRef.uid` other than
//!   the claim's; then the volumeMode checks against `volumeMounts` /
//!   `volumeDevices`.
//! - staging/src/k8s.io/component-helpers/storage/ephemeral/ephemeral.go
//!   (`VolumeClaimName`, `VolumeIsForPod`): an ephemeral volume's claim is
//!   `<pod name>-<volume name>` and must be controlled by the pod.
//! - pkg/volume/plugins.go (`NewSpecFromPersistentVolume`) and
//!   pkg/volume/util (`GetVolumeMode`): the pod volume's `readOnly` becomes
//!   the volume's, an unset `volumeMode` is `Filesystem`.
//!
//! Both objects are read with the node's credentials on every resolution
//! (the Node authorizer lets a node get the claims of its pods and the
//! volumes bound to them), as kubelet's populator does; nothing is cached.
//!
//! The result, [`BoundVolume`], carries the PV's source as a [`PvSource`]:
//! the plugin layer (`plugins.rs`, `Plugin::of_pv`) decides which source
//! keelson mounts. A new PV source type plugs in by matching its
//! `PvSource` variant there; this module does not change.

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, HostPathVolumeSource, LocalVolumeSource, PersistentVolume,
    PersistentVolumeClaim, Pod, Volume,
};
use kube::Api;

/// kubelet's `util.PVCProtectionFinalizer`.
pub const PVC_PROTECTION_FINALIZER: &str = "kubernetes.io/pvc-protection";
/// kubelet's `util.VolumeGidAnnotationKey`.
pub const VOLUME_GID_ANNOTATION: &str = "pv.beta.kubernetes.io/gid";

/// Why a claim or its volume could not be read, as the API server said.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct FetchError {
    /// The API server's message (`persistentvolumeclaims "x" not found`)
    /// or the transport error.
    pub message: String,
}

impl From<kube::Error> for FetchError {
    fn from(e: kube::Error) -> Self {
        let message = match &e {
            kube::Error::Api(s) if !s.message.is_empty() => s.message.clone(),
            other => other.to_string(),
        };
        FetchError { message }
    }
}

/// Reads claims and volumes (the API server with the node's identity in
/// production; a map in unit tests).
pub trait ClaimReader: Send + Sync {
    /// The PersistentVolumeClaim `namespace/name`.
    fn claim<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<PersistentVolumeClaim, FetchError>>;
    /// The PersistentVolume `name`.
    fn volume<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<PersistentVolume, FetchError>>;
}

/// [`ClaimReader`] over the API server: one GET per object per resolution,
/// as kubelet's populator does.
#[derive(Clone)]
pub struct ApiClaimReader {
    client: kube::Client,
}

impl ApiClaimReader {
    /// Reads with `client` (the node's credentials).
    pub fn new(client: kube::Client) -> Self {
        ApiClaimReader { client }
    }
}

impl ClaimReader for ApiClaimReader {
    fn claim<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<PersistentVolumeClaim, FetchError>> {
        Box::pin(async move {
            Ok(
                Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), namespace)
                    .get(name)
                    .await?,
            )
        })
    }

    fn volume<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<PersistentVolume, FetchError>> {
        Box::pin(async move {
            Ok(Api::<PersistentVolume>::all(self.client.clone())
                .get(name)
                .await?)
        })
    }
}

/// What is wrong with a claim or the volume bound to it (kubelet's texts;
/// shown after `error processing PVC <namespace>/<claim>: `).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimProblem {
    /// The claim could not be read (not found, forbidden, API down).
    #[error("failed to fetch PVC from API server: {0}")]
    FetchClaim(FetchError),
    /// The claim has a deletion timestamp and no pvc-protection finalizer.
    #[error("PVC is being deleted")]
    Deleting,
    /// `status.phase` is not `Bound` (yet).
    #[error("PVC is not bound")]
    NotBound,
    /// Bound, but `spec.volumeName` is empty.
    #[error("PVC has empty pvc.Spec.VolumeName")]
    NoVolumeName,
    /// The bound PersistentVolume could not be read.
    #[error("failed to fetch PV {name} from API server: {error}")]
    FetchVolume {
        /// The PV's name.
        name: String,
        /// Why.
        error: FetchError,
    },
    /// The PV has no `claimRef`.
    #[error(
        "found PV object {0} but it has a nil pv.Spec.ClaimRef indicating it is not yet bound to the claim"
    )]
    NoClaimRef(String),
    /// The PV's `claimRef.uid` is another claim's.
    #[error(
        "found PV object {name} but its pv.Spec.ClaimRef.UID {found} does not point to claim.UID {expected}"
    )]
    OtherClaim {
        /// The PV's name.
        name: String,
        /// `claimRef.uid` on the PV.
        found: String,
        /// The claim's UID.
        expected: String,
    },
}

/// Why a claim-backed pod volume cannot be used (yet). Display texts are
/// kubelet's; they end up in the pod's `FailedMount` events.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// The claim or its PV is missing, unbound or inconsistent.
    #[error("error processing PVC {namespace}/{claim}: {problem}")]
    Processing {
        /// The pod's namespace.
        namespace: String,
        /// The claim's name.
        claim: String,
        /// What is wrong.
        problem: ClaimProblem,
    },
    /// An ephemeral volume's claim exists but the pod does not control it
    /// (a claim of that name made by someone else).
    #[error(
        "PVC {namespace}/{claim} was not created for pod {pod_namespace}/{pod} (pod is not owner)"
    )]
    NotOwner {
        /// The claim's namespace.
        namespace: String,
        /// The claim's name.
        claim: String,
        /// The pod's namespace.
        pod_namespace: String,
        /// The pod's name.
        pod: String,
    },
    /// A Block volume in `volumeMounts`.
    #[error("volume {volume} has volumeMode {mode}, but is specified in volumeMounts")]
    MountedNotFilesystem {
        /// The pod volume's name.
        volume: String,
        /// The PV's volumeMode.
        mode: String,
    },
    /// A Filesystem volume in `volumeDevices`.
    #[error("volume {volume} has volumeMode {mode}, but is specified in volumeDevices")]
    DeviceNotBlock {
        /// The pod volume's name.
        volume: String,
        /// The PV's volumeMode.
        mode: String,
    },
}

/// The source of a bound PersistentVolume: the seam where PV types plug
/// in. keelson mounts `HostPath` and `Local` itself and `Csi` through the
/// node's CSI drivers; every other source is `Other` with its API field
/// name (refused by the plugin layer).
#[derive(Debug, Clone, PartialEq)]
pub enum PvSource {
    /// `spec.hostPath`.
    HostPath(HostPathVolumeSource),
    /// `spec.local`.
    Local(LocalVolumeSource),
    /// `spec.csi`.
    Csi(Box<CSIPersistentVolumeSource>),
    /// Any other source, by its field name (`nfs`, `iscsi`, ...).
    Other(String),
}

impl PvSource {
    /// The source of `pv`.
    pub fn of(pv: &PersistentVolume) -> PvSource {
        let spec = pv.spec.clone().unwrap_or_default();
        if let Some(s) = spec.host_path {
            return PvSource::HostPath(s);
        }
        if let Some(s) = spec.local {
            return PvSource::Local(s);
        }
        if let Some(s) = spec.csi {
            return PvSource::Csi(Box::new(s));
        }
        PvSource::Other(other_source_name(pv))
    }

    /// The API field name of the source (`hostPath`, `local`, `csi`, ...).
    pub fn kind(&self) -> &str {
        match self {
            PvSource::HostPath(_) => "hostPath",
            PvSource::Local(_) => "local",
            PvSource::Csi(_) => "csi",
            PvSource::Other(name) => name,
        }
    }
}

/// Fields of a PV spec that are not its source.
const PV_SPEC_NON_SOURCE: &[&str] = &[
    "accessModes",
    "capacity",
    "claimRef",
    "mountOptions",
    "nodeAffinity",
    "persistentVolumeReclaimPolicy",
    "storageClassName",
    "volumeAttributesClassName",
    "volumeMode",
];

fn other_source_name(pv: &PersistentVolume) -> String {
    let value = serde_json::to_value(pv.spec.clone().unwrap_or_default()).unwrap_or_default();
    value
        .as_object()
        .and_then(|o| {
            o.keys()
                .find(|k| !PV_SPEC_NON_SOURCE.contains(&k.as_str()))
                .cloned()
        })
        .unwrap_or_else(|| "unknown".to_string())
}

/// `volumeMode` of a PV (kubelet's `GetVolumeMode`: unset is Filesystem).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumeMode {
    /// `Filesystem` (also when unset).
    Filesystem,
    /// `Block`.
    Block,
}

impl VolumeMode {
    fn of(pv: &PersistentVolume) -> VolumeMode {
        match pv.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) {
            Some("Block") => VolumeMode::Block,
            _ => VolumeMode::Filesystem,
        }
    }

    /// The API value.
    pub fn as_str(self) -> &'static str {
        match self {
            VolumeMode::Filesystem => "Filesystem",
            VolumeMode::Block => "Block",
        }
    }
}

/// A pod volume resolved to its bound PersistentVolume.
#[derive(Debug, Clone)]
pub struct BoundVolume {
    /// The claim (as read).
    pub claim: Arc<PersistentVolumeClaim>,
    /// The bound PV (as read).
    pub pv: Arc<PersistentVolume>,
    /// The PV's name: kubelet's volume spec name (directory names, events).
    pub pv_name: String,
    /// The pod volume's `persistentVolumeClaim.readOnly` (false for
    /// ephemeral volumes).
    pub read_only: bool,
    /// The PV's `volumeMode`.
    pub mode: VolumeMode,
    /// The PV's source.
    pub source: PvSource,
    /// The PV's `mountOptions`.
    pub mount_options: Vec<String>,
    /// The PV's `pv.beta.kubernetes.io/gid` annotation (a supplemental
    /// group kubelet adds to the pod's containers).
    pub gid: Option<String>,
}

/// The claim a pod volume reads: `(claim name, read-only, ephemeral)`,
/// or `None` for volumes that are not claim-backed.
pub fn claim_of(pod: &Pod, vol: &Volume) -> Option<(String, bool, bool)> {
    if let Some(pvc) = &vol.persistent_volume_claim {
        return Some((pvc.claim_name.clone(), pvc.read_only == Some(true), false));
    }
    vol.ephemeral.as_ref()?;
    Some((ephemeral_claim_name(pod, vol), false, true))
}

/// `<pod name>-<volume name>`: the claim kube-controller-manager's
/// ephemeral volume controller creates for a generic ephemeral volume.
pub fn ephemeral_claim_name(pod: &Pod, vol: &Volume) -> String {
    format!(
        "{}-{}",
        pod.metadata.name.as_deref().unwrap_or_default(),
        vol.name
    )
}

/// Names of the volumes the pod's containers (init, regular, ephemeral)
/// use in `volumeMounts` and in `volumeDevices` (kubelet's
/// `GetPodVolumeNames`).
pub fn mounts_and_devices(pod: &Pod) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut mounts = BTreeSet::new();
    let mut devices = BTreeSet::new();
    let Some(spec) = pod.spec.as_ref() else {
        return (mounts, devices);
    };
    for c in spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
    {
        mounts.extend(c.volume_mounts.iter().flatten().map(|m| m.name.clone()));
        devices.extend(c.volume_devices.iter().flatten().map(|d| d.name.clone()));
    }
    for c in spec.ephemeral_containers.iter().flatten() {
        mounts.extend(c.volume_mounts.iter().flatten().map(|m| m.name.clone()));
        devices.extend(c.volume_devices.iter().flatten().map(|d| d.name.clone()));
    }
    (mounts, devices)
}

/// Resolves a claim-backed pod volume to its bound PV, or `Ok(None)` when
/// `vol` is not claim-backed.
pub async fn resolve(
    reader: &dyn ClaimReader,
    pod: &Pod,
    vol: &Volume,
) -> Result<Option<BoundVolume>, ClaimError> {
    let Some((claim_name, read_only, ephemeral)) = claim_of(pod, vol) else {
        return Ok(None);
    };
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let processing = |problem| ClaimError::Processing {
        namespace: namespace.clone(),
        claim: claim_name.clone(),
        problem,
    };
    let claim = bound_claim(reader, &namespace, &claim_name)
        .await
        .map_err(processing)?;
    if ephemeral {
        volume_is_for_pod(pod, &claim)?;
    }
    let pv_name = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .unwrap_or_default();
    let claim_uid = claim.metadata.uid.clone().unwrap_or_default();
    let pv = bound_volume(reader, &pv_name, &claim_uid)
        .await
        .map_err(processing)?;
    let mode = VolumeMode::of(&pv);
    let (mounts, devices) = mounts_and_devices(pod);
    if mounts.contains(&vol.name) && mode != VolumeMode::Filesystem {
        return Err(ClaimError::MountedNotFilesystem {
            volume: vol.name.clone(),
            mode: mode.as_str().to_string(),
        });
    }
    if devices.contains(&vol.name) && mode != VolumeMode::Block {
        return Err(ClaimError::DeviceNotBlock {
            volume: vol.name.clone(),
            mode: mode.as_str().to_string(),
        });
    }
    Ok(Some(BoundVolume {
        source: PvSource::of(&pv),
        mount_options: pv
            .spec
            .as_ref()
            .and_then(|s| s.mount_options.clone())
            .unwrap_or_default(),
        gid: pv
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(VOLUME_GID_ANNOTATION).cloned()),
        claim: Arc::new(claim),
        pv: Arc::new(pv),
        pv_name,
        read_only,
        mode,
    }))
}

/// kubelet's `getPVCExtractPV`.
async fn bound_claim(
    reader: &dyn ClaimReader,
    namespace: &str,
    name: &str,
) -> Result<PersistentVolumeClaim, ClaimProblem> {
    let claim = reader
        .claim(namespace, name)
        .await
        .map_err(ClaimProblem::FetchClaim)?;
    let protected = claim
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == PVC_PROTECTION_FINALIZER);
    if claim.metadata.deletion_timestamp.is_some() && !protected {
        return Err(ClaimProblem::Deleting);
    }
    if claim.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
        return Err(ClaimProblem::NotBound);
    }
    if claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .unwrap_or_default()
        .is_empty()
    {
        return Err(ClaimProblem::NoVolumeName);
    }
    Ok(claim)
}

/// kubelet's `getPVSpec`.
async fn bound_volume(
    reader: &dyn ClaimReader,
    name: &str,
    claim_uid: &str,
) -> Result<PersistentVolume, ClaimProblem> {
    let pv = reader
        .volume(name)
        .await
        .map_err(|error| ClaimProblem::FetchVolume {
            name: name.to_string(),
            error,
        })?;
    let Some(claim_ref) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return Err(ClaimProblem::NoClaimRef(name.to_string()));
    };
    let found = claim_ref.uid.clone().unwrap_or_default();
    if found != claim_uid {
        return Err(ClaimProblem::OtherClaim {
            name: name.to_string(),
            found,
            expected: claim_uid.to_string(),
        });
    }
    Ok(pv)
}

/// `ephemeral.VolumeIsForPod`: same namespace and controlled by the pod.
fn volume_is_for_pod(pod: &Pod, claim: &PersistentVolumeClaim) -> Result<(), ClaimError> {
    let pod_ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let claim_ns = claim.metadata.namespace.as_deref().unwrap_or_default();
    let pod_uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let controlled = claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == pod_uid);
    if claim_ns != pod_ns || !controlled {
        return Err(ClaimError::NotOwner {
            namespace: claim_ns.to_string(),
            claim: claim.metadata.name.clone().unwrap_or_default(),
            pod_namespace: pod_ns.to_string(),
            pod: pod.metadata.name.clone().unwrap_or_default(),
        });
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::super::fakes::FakeClaims;
    use super::*;

    fn pod(volume: serde_json::Value, mount: bool) -> Pod {
        let mut c = json!({"name": "c", "image": "i"});
        if mount {
            c["volumeMounts"] = json!([{"name": "data", "mountPath": "/d"}]);
        } else {
            c["volumeDevices"] = json!([{"name": "data", "devicePath": "/dev/d"}]);
        }
        let mut v = volume;
        v["name"] = "data".into();
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "pod-uid"},
            "spec": {"containers": [c], "volumes": [v]}
        }))
        .unwrap()
    }

    fn claim(name: &str, phase: &str, pv: &str) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
            "spec": {"volumeName": pv},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    fn pv(name: &str, claim_uid: Option<&str>, source: serde_json::Value) -> PersistentVolume {
        let mut spec = json!({"capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"]});
        for (k, v) in source.as_object().unwrap() {
            spec[k] = v.clone();
        }
        if let Some(uid) = claim_uid {
            spec["claimRef"] = json!({"namespace": "ns", "name": "c", "uid": uid});
        }
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
    }

    fn objects(claims: Vec<PersistentVolumeClaim>, pvs: Vec<PersistentVolume>) -> FakeClaims {
        let o = FakeClaims::default();
        claims.into_iter().for_each(|c| o.put_claim(c));
        pvs.into_iter().for_each(|v| o.put_volume(v));
        o
    }

    async fn run(o: &FakeClaims, p: &Pod) -> Result<Option<BoundVolume>, String> {
        let vol = p.spec.as_ref().unwrap().volumes.as_ref().unwrap()[0].clone();
        resolve(o, p, &vol).await.map_err(|e| e.to_string())
    }

    fn pvc_volume(read_only: bool) -> serde_json::Value {
        json!({"persistentVolumeClaim": {"claimName": "c", "readOnly": read_only}})
    }

    #[tokio::test]
    async fn a_bound_claim_resolves_to_its_volume_and_source() {
        let o = objects(
            vec![claim("c", "Bound", "pv1")],
            vec![pv(
                "pv1",
                Some("uid-c"),
                json!({"local": {"path": "/mnt/disk"}, "mountOptions": ["noatime"]}),
            )],
        );
        let b = run(&o, &pod(pvc_volume(true), true))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(b.pv_name, "pv1");
        assert!(b.read_only);
        assert_eq!(b.mode, VolumeMode::Filesystem);
        assert_eq!(b.mount_options, ["noatime"]);
        assert!(matches!(&b.source, PvSource::Local(l) if l.path == "/mnt/disk"));
        assert_eq!(b.source.kind(), "local");

        // Not claim-backed: nothing to resolve.
        assert!(
            run(&o, &pod(json!({"emptyDir": {}}), true))
                .await
                .unwrap()
                .is_none()
        );
    }

    #[tokio::test]
    async fn claim_problems_have_kubelets_texts_in_kubelets_order() {
        let p = pod(pvc_volume(false), true);
        let err = |o: FakeClaims| {
            let p = p.clone();
            async move { run(&o, &p).await.unwrap_err() }
        };
        assert_eq!(
            err(objects(vec![], vec![])).await,
            "error processing PVC ns/c: failed to fetch PVC from API server: persistentvolumeclaims \"c\" not found"
        );
        assert_eq!(
            err(objects(vec![claim("c", "Pending", "")], vec![])).await,
            "error processing PVC ns/c: PVC is not bound"
        );
        assert_eq!(
            err(objects(vec![claim("c", "Bound", "")], vec![])).await,
            "error processing PVC ns/c: PVC has empty pvc.Spec.VolumeName"
        );
        let mut deleting = claim("c", "Bound", "pv1");
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
        );
        assert_eq!(
            err(objects(vec![deleting.clone()], vec![])).await,
            "error processing PVC ns/c: PVC is being deleted"
        );
        // Protected by the finalizer: used (the PV is read next).
        deleting.metadata.finalizers = Some(vec![PVC_PROTECTION_FINALIZER.to_string()]);
        assert_eq!(
            err(objects(vec![deleting], vec![])).await,
            "error processing PVC ns/c: failed to fetch PV pv1 from API server: persistentvolumes \"pv1\" not found"
        );
        assert_eq!(
            err(objects(
                vec![claim("c", "Bound", "pv1")],
                vec![pv("pv1", None, json!({"hostPath": {"path": "/x"}}))]
            ))
            .await,
            "error processing PVC ns/c: found PV object pv1 but it has a nil pv.Spec.ClaimRef indicating it is not yet bound to the claim"
        );
        assert_eq!(
            err(objects(
                vec![claim("c", "Bound", "pv1")],
                vec![pv(
                    "pv1",
                    Some("other"),
                    json!({"hostPath": {"path": "/x"}})
                )]
            ))
            .await,
            "error processing PVC ns/c: found PV object pv1 but its pv.Spec.ClaimRef.UID other does not point to claim.UID uid-c"
        );
    }

    #[tokio::test]
    async fn volume_mode_must_match_mounts_and_devices() {
        let block = objects(
            vec![claim("c", "Bound", "pv1")],
            vec![pv(
                "pv1",
                Some("uid-c"),
                json!({"local": {"path": "/dev/sdz"}, "volumeMode": "Block"}),
            )],
        );
        assert_eq!(
            run(&block, &pod(pvc_volume(false), true))
                .await
                .unwrap_err(),
            "volume data has volumeMode Block, but is specified in volumeMounts"
        );
        let b = run(&block, &pod(pvc_volume(false), false))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(b.mode, VolumeMode::Block);
        let fs = objects(
            vec![claim("c", "Bound", "pv1")],
            vec![pv(
                "pv1",
                Some("uid-c"),
                json!({"hostPath": {"path": "/x"}}),
            )],
        );
        assert_eq!(
            run(&fs, &pod(pvc_volume(false), false)).await.unwrap_err(),
            "volume data has volumeMode Filesystem, but is specified in volumeDevices"
        );
    }

    #[tokio::test]
    async fn ephemeral_claims_are_named_after_the_pod_and_must_be_owned_by_it() {
        let p = pod(
            json!({"ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}}}),
            true,
        );
        assert_eq!(
            run(&objects(vec![], vec![]), &p).await.unwrap_err(),
            "error processing PVC ns/web-data: failed to fetch PVC from API server: persistentvolumeclaims \"web-data\" not found"
        );
        let pvs = vec![pv(
            "pv1",
            Some("uid-web-data"),
            json!({"nfs": {"server": "s", "path": "/"}}),
        )];
        // Someone else's claim of that name.
        let foreign = claim("web-data", "Bound", "pv1");
        assert_eq!(
            run(&objects(vec![foreign.clone()], pvs.clone()), &p)
                .await
                .unwrap_err(),
            "PVC ns/web-data was not created for pod ns/web (pod is not owner)"
        );
        // Owned, but not as controller: still not the pod's.
        let mut owned = foreign;
        owned.metadata.owner_references = Some(vec![
            serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Pod", "name": "web", "uid": "pod-uid"
            }))
            .unwrap(),
        ]);
        assert!(
            run(&objects(vec![owned.clone()], pvs.clone()), &p)
                .await
                .is_err()
        );
        owned.metadata.owner_references.as_mut().unwrap()[0].controller = Some(true);
        let b = run(&objects(vec![owned], pvs), &p).await.unwrap().unwrap();
        assert!(!b.read_only);
        assert_eq!(b.source, PvSource::Other("nfs".to_string()));
    }
}

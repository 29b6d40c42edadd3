//! kubelet's image pull manager (KubeletEnsureSecretPulledImages, beta and
//! on in v1.36; `pkg/kubelet/images/pullmanager/`): which images the node
//! pulled, and with which credentials, so that a pod may use an image
//! already on the node only with credentials that could pull it.
//!
//! Records live under `<rootDir>/image_manager/` as kubelet writes them:
//! `pulling/` holds an `ImagePullIntent` while a pull runs, `pulled/` an
//! `ImagePulledRecord` per image id with the credentials each image name
//! was pulled with (the secrets' coordinates and a hash of the
//! credentials, or `nodePodsAccessible` for a pull without credentials).
//! Files are named `sha256-<hex of the image or image id>` and written
//! atomically. An image on the node without a record was not pulled by
//! the node (preloaded) and, under the default policy
//! `NeverVerifyPreloadedImages`, any pod may use it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use prometheus::IntCounterVec;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
const FILE_PREFIX: &str = "sha256-";
const TMP_SUFFIX: &str = ".tmp";
/// kubelet's `writeRecordWhileMatchingLimit`.
const WRITE_WHILE_MATCHING_LIMIT: usize = 100;

/// Why a pull-record setting, image name or record file was refused or
/// could not be written. Display texts are kubelet's
/// (`pkg/kubelet/images/pullmanager`); a wrapped cause is part of the text.
#[derive(Debug, thiserror::Error)]
pub enum PullRecordError {
    /// `imagePullCredentialsVerificationPolicy` names no policy.
    #[error(
        "option {0:?} specified for imagePullCredentialsVerificationPolicy. Valid options are \"NeverVerify\", \"NeverVerifyPreloadedImages\", \"NeverVerifyAllowlistedImages\" or \"AlwaysVerify\""
    )]
    UnknownPolicy(String),
    /// An allowlist pattern with surrounding spaces.
    #[error("leading/trailing spaces are not allowed: {0}")]
    PatternSpaces(String),
    /// An empty allowlist pattern.
    #[error("the supplied pattern is too short: {0}")]
    PatternTooShort(String),
    /// A `*` anywhere but a trailing `/*`.
    #[error("not a valid wildcard pattern, only patterns ending with '/*' are allowed: {0}")]
    PatternWildcard(String),
    /// A bare `/*`.
    #[error("at least registry hostname is required")]
    PatternNoRegistry,
    /// A pattern that is not an image name.
    #[error("failed to parse as an image name: {0}")]
    PatternName(Box<PullRecordError>),
    /// A pattern with a tag or digest.
    #[error("neither tag nor digest is accepted in an image reference: {0}")]
    PatternTagged(String),
    /// An image that is not a reference.
    #[error("invalid reference format: {0:?}")]
    InvalidReference(String),
    /// A digest without its algorithm.
    #[error("invalid digest {digest:?} in {image:?}")]
    InvalidDigest {
        /// The digest as written.
        digest: String,
        /// The image.
        image: String,
    },
    /// The image of a record to write is not a reference.
    #[error("invalid image name {image:?}: {error}")]
    ImageName {
        /// The image.
        image: String,
        /// Why.
        error: Box<PullRecordError>,
    },
    /// A record could not be encoded.
    #[error("{0}")]
    Encode(serde_json::Error),
    /// A pulled record could not be read.
    #[error("{path}: {error}")]
    ReadPulled {
        /// The record file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// A pulled record is not JSON of its kind.
    #[error("failed to decode ImagePulledRecord {path}: {error}")]
    DecodePulled {
        /// The record file.
        path: PathBuf,
        /// Why.
        error: serde_json::Error,
    },
    /// The pull intent could not be written.
    #[error("failed to record image pull intent: {0}")]
    WriteIntent(std::io::Error),
    /// The pulled record could not be written.
    #[error("failed to write ImagePulledRecord: {0}")]
    WritePulled(std::io::Error),
}

/// `imagePullCredentialsVerificationPolicy`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VerificationPolicy {
    /// Any image on the node may be used by any pod.
    NeverVerify,
    /// Images the node did not pull may be used by any pod (the default).
    NeverVerifyPreloadedImages,
    /// Images matching the allowlist may be used by any pod.
    NeverVerifyAllowlistedImages(Allowlist),
    /// Every image needs credentials that pulled it (or a pull).
    AlwaysVerify,
}

impl VerificationPolicy {
    /// The policy named in the configuration; the allowlist is used by
    /// `NeverVerifyAllowlistedImages` only.
    pub fn parse(name: &str, allowlist: &[String]) -> Result<Self, PullRecordError> {
        Ok(match name {
            "NeverVerify" => Self::NeverVerify,
            "NeverVerifyPreloadedImages" => Self::NeverVerifyPreloadedImages,
            "NeverVerifyAllowlistedImages" => {
                Self::NeverVerifyAllowlistedImages(Allowlist::new(allowlist)?)
            }
            "AlwaysVerify" => Self::AlwaysVerify,
            other => return Err(PullRecordError::UnknownPolicy(other.to_string())),
        })
    }

    /// `RequireCredentialVerificationForImage`.
    fn require_verification(&self, image: &str, pulled_by_node: bool) -> bool {
        match self {
            Self::NeverVerify => false,
            Self::NeverVerifyPreloadedImages => pulled_by_node,
            Self::NeverVerifyAllowlistedImages(list) => !list.matches(image),
            Self::AlwaysVerify => true,
        }
    }
}

/// `preloadedImagesVerificationAllowlist`: image names without tag or
/// digest, or `registry/path/*` prefixes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist {
    names: HashSet<String>,
    prefixes: Vec<String>,
}

impl Allowlist {
    /// Validates the patterns as kubelet's `getAllowlistImagePattern`.
    pub fn new(patterns: &[String]) -> Result<Self, PullRecordError> {
        let mut list = Allowlist::default();
        for p in patterns {
            if p.trim() != p {
                return Err(PullRecordError::PatternSpaces(p.clone()));
            }
            let (trimmed, wildcard) = match p.strip_suffix("/*") {
                Some(t) => (format!("{t}/"), true),
                None => (p.clone(), false),
            };
            if trimmed.is_empty() {
                return Err(PullRecordError::PatternTooShort(p.clone()));
            }
            if trimmed.contains('*') {
                return Err(PullRecordError::PatternWildcard(p.clone()));
            }
            if wildcard {
                if trimmed.len() == 1 {
                    return Err(PullRecordError::PatternNoRegistry);
                }
                list.prefixes.push(trimmed);
            } else {
                let name = trim_tag_digest(&trimmed)
                    .map_err(|e| PullRecordError::PatternName(Box::new(e)))?;
                if name != trimmed {
                    return Err(PullRecordError::PatternTagged(p.clone()));
                }
                list.names.insert(name);
            }
        }
        Ok(list)
    }

    fn matches(&self, image: &str) -> bool {
        let name = trim_tag_digest(image).unwrap_or_else(|_| image.to_string());
        self.names.contains(&name) || self.prefixes.iter().any(|p| name.starts_with(p))
    }
}

/// kubelet's `trimImageTagDigest`: the image as written without its tag
/// and digest (`docker.io/library/busybox:1` → `docker.io/library/busybox`,
/// `busybox` stays `busybox`).
pub fn trim_tag_digest(image: &str) -> Result<String, PullRecordError> {
    if image.is_empty() || image.chars().any(|c| c.is_whitespace() || c.is_uppercase()) {
        return Err(PullRecordError::InvalidReference(image.to_string()));
    }
    let (named, digest) = match image.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (image, None),
    };
    if let Some(d) = digest
        && !d.contains(':')
    {
        return Err(PullRecordError::InvalidDigest {
            digest: d.to_string(),
            image: image.to_string(),
        });
    }
    // A tag follows the last ':' after the last '/'.
    let name = match named.rfind(':') {
        Some(i) if !named[i..].contains('/') => &named[..i],
        _ => named,
    };
    if name.is_empty() || name.ends_with('/') {
        return Err(PullRecordError::InvalidReference(image.to_string()));
    }
    Ok(name.to_string())
}

/// A Secret that pulled an image (`ImagePullSecret`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PullSecret {
    /// The Secret's UID.
    pub uid: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// SHA-256 of the credentials it held (kubelet's `hashAuthConfig`).
    pub credential_hash: String,
}

/// A ServiceAccount whose token pulled an image (credential provider
/// plugins in service account token mode).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PullServiceAccount {
    /// UID.
    pub uid: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

/// The credentials an image name was pulled with (`ImagePullCredentials`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PullCredentials {
    /// Secrets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kubernetes_secrets: Vec<PullSecret>,
    /// ServiceAccounts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kubernetes_service_accounts: Vec<PullServiceAccount>,
    /// Pulled without credentials: every pod on the node may use it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub node_pods_accessible: bool,
}

/// What [`PullManager::check_pull`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullCheck {
    /// Pull (`true`) or use the image on the node (`false`).
    Decided(bool),
    /// The pod's credentials are needed to decide.
    NeedsPodCredentials,
}

impl PullCredentials {
    /// What a pull recorded for credentials from `source` with `hash`
    /// (`trackedToImagePullCreds`): a Secret, a service account, or the
    /// node's (accessible to every pod).
    pub fn from_source(
        source: Option<&crate::credentials::docker_keyring::Source>,
        hash: &str,
    ) -> Self {
        use crate::credentials::docker_keyring::Source;
        match source {
            None => PullCredentials {
                node_pods_accessible: true,
                ..Default::default()
            },
            Some(Source::Secret {
                uid,
                namespace,
                name,
            }) => PullCredentials {
                kubernetes_secrets: vec![PullSecret {
                    uid: uid.clone(),
                    namespace: namespace.clone(),
                    name: name.clone(),
                    credential_hash: hash.to_string(),
                }],
                ..Default::default()
            },
            Some(Source::ServiceAccount {
                uid,
                namespace,
                name,
            }) => PullCredentials {
                kubernetes_service_accounts: vec![PullServiceAccount {
                    uid: uid.clone(),
                    namespace: namespace.clone(),
                    name: name.clone(),
                }],
                ..Default::default()
            },
        }
    }

    /// What a pull recorded: the Secret whose credentials worked, or no
    /// credentials at all (`trackedToImagePullCreds`).
    pub fn used(secret: Option<PullSecret>) -> Self {
        match secret {
            Some(s) => PullCredentials {
                kubernetes_secrets: vec![s],
                ..Default::default()
            },
            None => PullCredentials {
                node_pods_accessible: true,
                ..Default::default()
            },
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PullIntent {
    api_version: String,
    kind: String,
    image: String,
}

/// `ImagePulledRecord`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PulledRecord {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    last_updated_time: Time,
    image_ref: String,
    #[serde(default)]
    credential_mapping: BTreeMap<String, PullCredentials>,
}

impl PulledRecord {
    fn new(image_ref: &str) -> Self {
        PulledRecord {
            api_version: API_VERSION.to_string(),
            kind: "ImagePulledRecord".to_string(),
            last_updated_time: Time(jiff::Timestamp::now()),
            image_ref: image_ref.to_string(),
            credential_mapping: BTreeMap::new(),
        }
    }
}

/// The pull manager.
#[derive(Debug)]
pub struct PullManager {
    pulling: PathBuf,
    pulled: PathBuf,
    policy: VerificationPolicy,
    /// Pulls in flight per image (`intentCounters`); the lock also
    /// serializes every read-decide-write of the record files.
    intents: Mutex<HashMap<String, u32>>,
    checks: Option<IntCounterVec>,
}

fn file_name(key: &str) -> String {
    format!("{FILE_PREFIX}{:x}", Sha256::digest(key.as_bytes()))
}

/// Writes through a temporary file and a rename (kubelet's `writeFile`).
fn write_atomic(dir: &Path, name: &str, content: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::create_dir_all(dir)?;
    let target = dir.join(name);
    let tmp = dir.join(format!("{name}{TMP_SUFFIX}"));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        std::io::Write::write_all(&mut f, content)?;
        std::fs::rename(&tmp, &target)
    };
    write().inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

fn remove(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The record files of a directory (no temporaries, nothing foreign).
fn record_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.starts_with(FILE_PREFIX) && !n.ends_with(TMP_SUFFIX)
        })
        .map(|e| e.path())
        .collect()
}

/// Merges `new` into the credentials recorded for one image name
/// (`pulledRecordMergeNewCreds`); `None` when nothing changed.
fn merge_credentials(
    old: Option<&PullCredentials>,
    new: &PullCredentials,
) -> Option<PullCredentials> {
    if !new.node_pods_accessible
        && new.kubernetes_secrets.is_empty()
        && new.kubernetes_service_accounts.is_empty()
    {
        return None;
    }
    let Some(old) = old else {
        return Some(new.clone());
    };
    if old.node_pods_accessible {
        return None;
    }
    if new.node_pods_accessible {
        return Some(PullCredentials {
            node_pods_accessible: true,
            ..Default::default()
        });
    }
    let mut merged = old.clone();
    if !new.kubernetes_secrets.is_empty() {
        // Unique per (namespace, name, uid); the new hash wins.
        let mut by_coords: BTreeMap<(String, String, String), String> = old
            .kubernetes_secrets
            .iter()
            .map(|s| {
                (
                    (s.namespace.clone(), s.name.clone(), s.uid.clone()),
                    s.credential_hash.clone(),
                )
            })
            .collect();
        let mut changed = false;
        for s in &new.kubernetes_secrets {
            let key = (s.namespace.clone(), s.name.clone(), s.uid.clone());
            if by_coords.get(&key) != Some(&s.credential_hash) {
                by_coords.insert(key, s.credential_hash.clone());
                changed = true;
            }
        }
        if !changed {
            return None;
        }
        merged.kubernetes_secrets = by_coords
            .into_iter()
            .map(|((namespace, name, uid), credential_hash)| PullSecret {
                uid,
                namespace,
                name,
                credential_hash,
            })
            .collect();
    } else {
        let mut set: std::collections::BTreeSet<PullServiceAccount> =
            old.kubernetes_service_accounts.iter().cloned().collect();
        let before = set.len();
        set.extend(new.kubernetes_service_accounts.iter().cloned());
        if set.len() == before {
            return None;
        }
        merged.kubernetes_service_accounts = set.into_iter().collect();
    }
    Some(merged)
}

impl PullManager {
    /// A pull manager keeping its records under `<root_dir>/image_manager`;
    /// `checks` counts `MustAttemptImagePull` results.
    pub fn new(root_dir: &Path, policy: VerificationPolicy, checks: Option<IntCounterVec>) -> Self {
        let base = root_dir.join("image_manager");
        let m = PullManager {
            pulling: base.join("pulling"),
            pulled: base.join("pulled"),
            policy,
            intents: Mutex::new(HashMap::new()),
            checks,
        };
        for d in [&m.pulling, &m.pulled] {
            if let Err(e) = std::fs::create_dir_all(d) {
                tracing::warn!(dir = %d.display(), error = %e, "cannot create the image pull records directory");
            }
        }
        m
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, u32>> {
        self.intents.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn count(&self, result: &str) {
        if let Some(c) = &self.checks {
            c.with_label_values(&[result]).inc();
        }
    }

    /// Images with a pull intent left by an earlier run (`initialize`).
    pub fn leftover_intents(&self) -> Vec<String> {
        record_files(&self.pulling)
            .into_iter()
            .filter_map(|p| std::fs::read(&p).ok())
            .filter_map(|b| serde_json::from_slice::<PullIntent>(&b).ok())
            .map(|i| i.image)
            .collect()
    }

    /// `initialize`: an intent left by an earlier run whose image is now on
    /// the node (`images`: image id → its tags and digests) becomes a
    /// pulled record without credentials (so a pod must show credentials),
    /// and the intent goes.
    pub fn initialize(&self, images: &[(String, Vec<String>)]) {
        let intents: HashSet<String> = self.leftover_intents().into_iter().collect();
        if intents.is_empty() {
            return;
        }
        let _g = self.lock();
        for (id, names) in images {
            for name in names.iter().filter(|n| intents.contains(*n)) {
                if let Err(e) = self.write_pulled_if_changed(name, id, None) {
                    tracing::warn!(image = %name, error = %e, "cannot write an image pulled record");
                    continue;
                }
                let _ = remove(&self.pulling.join(file_name(name)));
            }
        }
    }

    /// `RecordPullIntent`: a pull of `image` starts.
    pub fn record_pull_intent(&self, image: &str) -> Result<(), PullRecordError> {
        let mut intents = self.lock();
        let intent = PullIntent {
            api_version: API_VERSION.to_string(),
            kind: "ImagePullIntent".to_string(),
            image: image.to_string(),
        };
        let bytes = serde_json::to_vec(&intent).map_err(PullRecordError::Encode)?;
        write_atomic(&self.pulling, &file_name(image), &bytes)
            .map_err(PullRecordError::WriteIntent)?;
        *intents.entry(image.to_string()).or_default() += 1;
        Ok(())
    }

    /// `RecordImagePulled`: the pull of `image` gave `image_ref` with
    /// `credentials`.
    pub fn record_image_pulled(&self, image: &str, image_ref: &str, credentials: &PullCredentials) {
        let mut intents = self.lock();
        if let Err(e) = self.write_pulled_if_changed(image, image_ref, Some(credentials)) {
            // The intent stays: the next start turns it into a record.
            tracing::warn!(image_ref, error = %e, "failed to write image pulled record");
            return;
        }
        self.decrement_intent(&mut intents, image);
    }

    /// `RecordImagePullFailed`.
    pub fn record_image_pull_failed(&self, image: &str) {
        let mut intents = self.lock();
        self.decrement_intent(&mut intents, image);
    }

    fn decrement_intent(&self, intents: &mut HashMap<String, u32>, image: &str) {
        let n = intents.get(image).copied().unwrap_or(0);
        if n <= 1 {
            if let Err(e) = remove(&self.pulling.join(file_name(image))) {
                tracing::warn!(image, error = %e, "failed to remove image pull intent");
                return;
            }
            intents.remove(image);
        } else {
            intents.insert(image.to_string(), n - 1);
        }
    }

    fn read_pulled(&self, image_ref: &str) -> Result<Option<PulledRecord>, PullRecordError> {
        let path = self.pulled.join(file_name(image_ref));
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(PullRecordError::ReadPulled { path, error }),
        };
        let rec: PulledRecord = serde_json::from_slice(&bytes)
            .map_err(|error| PullRecordError::DecodePulled { path, error })?;
        Ok((rec.image_ref == image_ref).then_some(rec))
    }

    /// `writePulledRecordIfChanged` (the caller holds the lock). `None`
    /// credentials: the image is known as pulled by the node, with nothing
    /// that lets a pod use it unverified.
    fn write_pulled_if_changed(
        &self,
        image: &str,
        image_ref: &str,
        credentials: Option<&PullCredentials>,
    ) -> Result<(), PullRecordError> {
        let name = trim_tag_digest(image).map_err(|e| PullRecordError::ImageName {
            image: image.to_string(),
            error: Box::new(e),
        })?;
        let existing = self.read_pulled(image_ref).unwrap_or_else(|e| {
            tracing::info!(image, error = %e, "failed to retrieve an ImagePulledRecord");
            None
        });
        let record = match existing {
            None => {
                let mut r = PulledRecord::new(image_ref);
                if let Some(c) = credentials {
                    r.credential_mapping.insert(name, c.clone());
                }
                r
            }
            Some(mut r) => {
                let Some(c) = credentials else { return Ok(()) };
                let Some(merged) = merge_credentials(r.credential_mapping.get(&name), c) else {
                    return Ok(());
                };
                r.credential_mapping.insert(name, merged);
                r.last_updated_time = Time(jiff::Timestamp::now());
                r.api_version = API_VERSION.to_string();
                r.kind = "ImagePulledRecord".to_string();
                r
            }
        };
        let bytes = serde_json::to_vec(&record).map_err(PullRecordError::Encode)?;
        write_atomic(&self.pulled, &file_name(image_ref), &bytes)
            .map_err(PullRecordError::WritePulled)
    }

    /// `MustAttemptImagePull`: whether a pod holding `pod_secrets` (the
    /// Secrets with credentials for `image`'s registry) must pull `image`
    /// although `image_ref` is on the node.
    pub fn must_attempt_pull(
        &self,
        image: &str,
        image_ref: &str,
        pod_secrets: &[PullSecret],
    ) -> bool {
        match self.check_pull(image, image_ref, Some((pod_secrets, None))) {
            PullCheck::Decided(pull) => pull,
            PullCheck::NeedsPodCredentials => true,
        }
    }

    /// `MustAttemptImagePull` with the pod's credentials looked up only
    /// when the record needs them (kubelet's `getPodCredentials` runs
    /// lazily, so that credential provider plugins are not called for
    /// images any pod may use): with `pod_credentials` `None`, answers
    /// [`PullCheck::NeedsPodCredentials`] where kubelet would look them
    /// up; call again with them.
    pub fn check_pull(
        &self,
        image: &str,
        image_ref: &str,
        pod_credentials: Option<(&[PullSecret], Option<&PullServiceAccount>)>,
    ) -> PullCheck {
        PullCheck::Decided(
            match self.check_pull_inner(image, image_ref, pod_credentials) {
                Some(pull) => pull,
                None => return PullCheck::NeedsPodCredentials,
            },
        )
    }

    fn check_pull_inner(
        &self,
        image: &str,
        image_ref: &str,
        pod_credentials: Option<(&[PullSecret], Option<&PullServiceAccount>)>,
    ) -> Option<bool> {
        if image_ref.is_empty() {
            return Some(true);
        }
        let intents = self.lock();
        let (record, pulled_by_node) = match self.read_pulled(image_ref) {
            Ok(Some(r)) => (Some(r), true),
            Ok(None) => (None, self.intent_exists(&intents, image)),
            Err(e) => {
                tracing::warn!(error = %e, "unable to access cache records about image pulls");
                self.count("error");
                return Some(true);
            }
        };
        if !self.policy.require_verification(image, pulled_by_node) {
            self.count("credentialPolicyAllowed");
            return Some(false);
        }
        let Some(record) = record else {
            self.count("mustAuthenticate");
            return Some(true);
        };
        let Ok(name) = trim_tag_digest(image) else {
            self.count("error");
            return Some(true);
        };
        let Some(cached) = record.credential_mapping.get(&name) else {
            self.count("mustAuthenticate");
            return Some(true);
        };
        if cached.node_pods_accessible {
            self.count("credentialRecordFound");
            return Some(false);
        }
        if cached.kubernetes_secrets.is_empty() && cached.kubernetes_service_accounts.is_empty() {
            self.count("mustAuthenticate");
            return Some(true);
        }
        let (pod_secrets, pod_account) = pod_credentials?;
        for pod_secret in pod_secrets {
            for cached_secret in &cached.kubernetes_secrets {
                let hashes = !cached_secret.credential_hash.is_empty()
                    && pod_secret.credential_hash == cached_secret.credential_hash;
                let coords = pod_secret.uid == cached_secret.uid
                    && pod_secret.namespace == cached_secret.namespace
                    && pod_secret.name == cached_secret.name;
                if hashes || coords {
                    // The same credentials under another Secret, or the same
                    // Secret with new credentials: remembered for next time.
                    if (hashes != coords)
                        && cached.kubernetes_secrets.len() < WRITE_WHILE_MATCHING_LIMIT
                        && let Err(e) = self.write_pulled_if_changed(
                            image,
                            image_ref,
                            Some(&PullCredentials::used(Some(pod_secret.clone()))),
                        )
                    {
                        tracing::warn!(image, error = %e, "failed to write an image pulled record");
                    }
                    self.count("credentialRecordFound");
                    return Some(false);
                }
            }
        }
        if let Some(account) = pod_account
            && cached.kubernetes_service_accounts.contains(account)
        {
            self.count("credentialRecordFound");
            return Some(false);
        }
        self.count("mustAuthenticate");
        Some(true)
    }

    /// Whether a pull of `image` is in flight or was left by an earlier
    /// run.
    fn intent_exists(&self, intents: &HashMap<String, u32>, image: &str) -> bool {
        intents.get(image).copied().unwrap_or(0) > 0
            || std::fs::read(self.pulling.join(file_name(image)))
                .ok()
                .and_then(|b| serde_json::from_slice::<PullIntent>(&b).ok())
                .is_some_and(|i| i.image == image)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;

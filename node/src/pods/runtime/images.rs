//! kubelet's image manager (`EnsureImageExists`): the pull policy, the
//! credentials (pull Secrets, then credential provider plugins, looked up
//! once and only when needed: `keyring`), a present image used only with
//! credentials that could pull it
//! (KubeletEnsureSecretPulledImages, `pull_records`), per-image backoff
//! (ErrImagePull → ImagePullBackOff, 10 s doubling to 5 min, the waiting
//! message keeping the pull's error), serialized or bounded parallel
//! pulls, and the Pulling/Pulled/Failed/BackOff events with kubelet's
//! texts.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, Secret};
use keelson_common::gofmt;
use keelson_cri::{RuntimeClient, api};
use tokio::sync::Semaphore;

use super::errors::{
    ERR_IMAGE_NEVER_PULL, ERR_IMAGE_PULL, IMAGE_INSPECT_ERROR, IMAGE_PULL_BACK_OFF,
    INVALID_IMAGE_NAME, REGISTRY_UNAVAILABLE, StepError, grpc_text,
};
use super::imageref::{apply_default_tag, repository_name};
use super::keyring;
use super::pull_records::{
    PullCheck, PullCredentials, PullManager, PullSecret, PullServiceAccount,
};
use crate::credentials::CredentialProviders;
use crate::credentials::docker_keyring::Source;
use crate::credentials::provider::PodRef;
use crate::pod::podutil;
use crate::pods::backoff::Backoff;
use crate::pods::events::{self as reasons, PodEvents};
use crate::pods::metrics::{PodMetrics, image_size_bucket};
use keelson_common::events::EventType;

/// Ensures images are present before containers are created.
#[derive(Debug)]
pub struct ImageManager {
    cri: RuntimeClient,
    backoff: Arc<Backoff>,
    events: PodEvents,
    metrics: PodMetrics,
    /// `None`: unlimited parallel pulls.
    pulls: Option<Arc<Semaphore>>,
    /// Which images were pulled with which credentials.
    records: Arc<PullManager>,
    /// The last pull error per backoff key (`prevPullErrMsg`).
    last_errors: std::sync::Mutex<std::collections::HashMap<String, String>>,
    /// Credential provider plugins.
    providers: CredentialProviders,
}

/// What an image ensure did (for the pod start SLI).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnsuredImage {
    /// The image id to create the container from.
    pub image_ref: String,
    /// Time spent pulling (zero when present).
    pub pulled_for: Duration,
}

/// Should an image be pulled under `policy` (`shouldPullImage`)?
pub fn should_pull(policy: &str, present: bool) -> bool {
    match policy {
        "Never" => false,
        "Always" => true,
        _ => !present,
    }
}

impl ImageManager {
    /// `serialize` = `serializeImagePulls`; `max_parallel` is used when not
    /// serialized (`None`/`≤0`: unlimited).
    pub fn new(
        cri: RuntimeClient,
        backoff: Arc<Backoff>,
        events: PodEvents,
        metrics: PodMetrics,
        serialize: bool,
        max_parallel: Option<i32>,
        records: Arc<PullManager>,
    ) -> Self {
        let pulls = if serialize {
            Some(Arc::new(Semaphore::new(1)))
        } else {
            max_parallel
                .filter(|n| *n > 0)
                .map(|n| Arc::new(Semaphore::new(n as usize)))
        };
        ImageManager {
            cri,
            backoff,
            events,
            metrics,
            pulls,
            records,
            last_errors: std::sync::Mutex::new(std::collections::HashMap::new()),
            providers: CredentialProviders::none(),
        }
    }

    /// Asks `providers` (credential provider plugins) for credentials too.
    pub fn with_credential_providers(mut self, providers: CredentialProviders) -> Self {
        self.providers = providers;
        self
    }

    /// The image id of a present image (`""` when absent).
    async fn image_ref(&self, image: &str) -> Result<String, keelson_cri::CriError> {
        self.metrics
            .runtime_op(
                "image_status",
                self.cri.image_status(keelson_cri::image_spec(image)),
            )
            .await
            .map(|i| i.map(|i| i.id).unwrap_or_default())
    }

    /// Makes `container`'s image present per its pull policy (kubelet's
    /// `EnsureImageExists`); returns the image id to create the container
    /// from. The image as the container names it is what events, backoff
    /// and pull records use; the pull uses it with the default tag.
    pub async fn ensure_image_exists(
        &self,
        pod: &Pod,
        container: &Container,
        pull_secrets: &[Secret],
        sandbox_config: Option<&api::PodSandboxConfig>,
    ) -> Result<EnsuredImage, StepError> {
        let requested = container.image.as_deref().unwrap_or_default();
        let name = &container.name;
        let event = |kind: EventType, reason: &str, msg: &str| {
            self.events.container(pod, name, "", kind, reason, msg);
        };
        let image = match apply_default_tag(requested) {
            Ok(i) => i,
            Err(e) => {
                let msg = format!(
                    "Failed to apply default image tag {}: {e}",
                    gofmt::quote(requested)
                );
                event(EventType::Warning, reasons::INSPECT_FAILED, &msg);
                return Err(StepError::new(INVALID_IMAGE_NAME, msg));
            }
        };
        let policy = container
            .image_pull_policy
            .as_deref()
            .unwrap_or("IfNotPresent");
        // `imagePullPrecheck`: Always pulls without looking.
        let present_ref = if policy == "Always" {
            String::new()
        } else {
            match self.image_ref(&image).await {
                Ok(r) => r,
                Err(e) => {
                    // kubelet names the (empty) image id it did not get.
                    let msg = format!("Failed to inspect image \"\": {}", grpc_text(&e));
                    event(EventType::Warning, reasons::INSPECT_FAILED, &msg);
                    return Err(StepError::new(IMAGE_INSPECT_ERROR, msg));
                }
            }
        };
        if present_ref.is_empty() && policy == "Never" {
            return Err(self.not_present_on_never(pod, name, requested));
        }
        let mut tracked: Option<Vec<keyring::Tracked>> = None;
        if !present_ref.is_empty() {
            // KubeletEnsureSecretPulledImages: the pod may use the image
            // only with credentials that could pull it.
            let must_pull = match self.records.check_pull(requested, &present_ref, None) {
                PullCheck::Decided(pull) => pull,
                PullCheck::NeedsPodCredentials => {
                    let found = self.lookup_credentials(pod, &image, pull_secrets).await;
                    let (secrets, account) = pod_credentials(&found);
                    tracked = Some(found);
                    self.records.check_pull(
                        requested,
                        &present_ref,
                        Some((&secrets, account.as_ref())),
                    ) != PullCheck::Decided(false)
                }
            };
            if !must_pull {
                let msg = format!(
                    "Container image {} already present on machine and can be accessed by the pod",
                    gofmt::quote(requested)
                );
                event(EventType::Normal, reasons::PULLED, &msg);
                return Ok(EnsuredImage {
                    image_ref: present_ref,
                    pulled_for: Duration::ZERO,
                });
            }
        }
        if policy == "Never" {
            // Present but not for this pod: the same answer as absent, so
            // that its presence is not revealed.
            return Err(self.not_present_on_never(pod, name, requested));
        }
        let tracked = match tracked {
            Some(t) => t,
            None => self.lookup_credentials(pod, &image, pull_secrets).await,
        };
        self.pull_image(pod, name, requested, &image, &tracked, sandbox_config)
            .await
    }

    /// `makeLookupPullCredentialsFunc`: the pull Secrets' and the plugins'
    /// credentials for the image's repository, for this pod.
    async fn lookup_credentials(
        &self,
        pod: &Pod,
        image: &str,
        pull_secrets: &[Secret],
    ) -> Vec<keyring::Tracked> {
        // `image` passed apply_default_tag, so it parses.
        let repository = repository_name(image).unwrap_or_else(|_| image.to_string());
        let pod_ref = PodRef {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: podutil::uid(pod).to_string(),
            service_account: pod
                .spec
                .as_ref()
                .and_then(|s| s.service_account_name.clone())
                .unwrap_or_default(),
        };
        keyring::lookup_tracked(&repository, pull_secrets, &self.providers, &pod_ref).await
    }

    fn not_present_on_never(&self, pod: &Pod, name: &str, requested: &str) -> StepError {
        let msg = format!(
            "Container image {} is not present with pull policy of Never",
            gofmt::quote(requested)
        );
        self.events.container(
            pod,
            name,
            "",
            EventType::Warning,
            reasons::ERR_IMAGE_NEVER_PULL,
            &msg,
        );
        StepError::new(ERR_IMAGE_NEVER_PULL, msg)
    }

    /// kubelet's `pullImage`: the pull intent, the backoff (whose message
    /// keeps the last pull error), the pull, the pulled record.
    async fn pull_image(
        &self,
        pod: &Pod,
        name: &str,
        requested: &str,
        image: &str,
        tracked: &[keyring::Tracked],
        sandbox_config: Option<&api::PodSandboxConfig>,
    ) -> Result<EnsuredImage, StepError> {
        if let Err(e) = self.records.record_pull_intent(requested) {
            let msg = format!(
                "Failed to record image pull intent for container image {}: {e}",
                gofmt::quote(requested)
            );
            return Err(StepError::new(ERR_IMAGE_PULL, msg));
        }
        let outcome = self
            .pull_after_backoff(pod, name, requested, image, tracked, sandbox_config)
            .await;
        match &outcome {
            Ok((ensured, used)) => self.records.record_image_pulled(
                requested,
                &ensured.image_ref,
                &match used {
                    Some(t) => PullCredentials::from_source(t.source.as_ref(), &t.hash),
                    None => PullCredentials::used(None),
                },
            ),
            Err(_) => self.records.record_image_pull_failed(requested),
        }
        outcome.map(|(e, _)| e)
    }

    async fn pull_after_backoff(
        &self,
        pod: &Pod,
        name: &str,
        requested: &str,
        image: &str,
        tracked: &[keyring::Tracked],
        sandbox_config: Option<&api::PodSandboxConfig>,
    ) -> Result<(EnsuredImage, Option<keyring::Tracked>), StepError> {
        let event = |kind: EventType, reason: &str, msg: &str| {
            self.events.container(pod, name, "", kind, reason, msg);
        };
        let key = format!("{}_{}", podutil::uid(pod), requested);
        if self
            .backoff
            .is_in_backoff_since_update(&key, self.clock_now())
        {
            let mut msg = format!("Back-off pulling image {}", gofmt::quote(requested));
            event(EventType::Normal, reasons::BACK_OFF, &msg);
            // The waiting message carries the pull's error (`prevPullErrMsg`).
            if let Some(prev) = self.last_errors().get(&key) {
                msg = format!("{msg}: {prev}");
            }
            return Err(StepError::new(IMAGE_PULL_BACK_OFF, msg));
        }
        self.last_errors().remove(&key);
        event(
            EventType::Normal,
            reasons::PULLING,
            &format!("Pulling image {}", gofmt::quote(requested)),
        );
        let waiting_since = tokio::time::Instant::now();
        let _permit = match &self.pulls {
            Some(s) => s.clone().acquire_owned().await.ok(),
            None => None,
        };
        let pull_start = tokio::time::Instant::now();
        let result = self.pull(image, tracked, sandbox_config).await;
        let pull_duration = pull_start.elapsed();
        drop(_permit);
        match result {
            Err(text) => {
                event(
                    EventType::Warning,
                    reasons::FAILED,
                    &format!("Failed to pull image {}: {text}", gofmt::quote(requested)),
                );
                self.backoff.next(&key, self.clock_now());
                let err = eval_pull_error(requested, text);
                self.last_errors()
                    .insert(key, format!("{}: {}", err.reason, err.message));
                Err(err)
            }
            Ok((image_ref, source)) => {
                let size = self
                    .cri
                    .image_status(keelson_cri::image_spec(&image_ref))
                    .await
                    .ok()
                    .flatten()
                    .map(|i| i.size)
                    .unwrap_or(0);
                let total = waiting_since.elapsed();
                event(
                    EventType::Normal,
                    reasons::PULLED,
                    &format!(
                        "Successfully pulled image {} in {} ({} including waiting). Image size: {size} bytes.",
                        gofmt::quote(requested),
                        gofmt::duration(truncate_ms(pull_duration)),
                        gofmt::duration(truncate_ms(total)),
                    ),
                );
                self.metrics
                    .image_pull_duration
                    .with_label_values(&[image_size_bucket(size)])
                    .observe(pull_duration.as_secs_f64());
                self.backoff.gc();
                Ok((
                    EnsuredImage {
                        image_ref,
                        pulled_for: total,
                    },
                    source,
                ))
            }
        }
    }

    fn last_errors(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, String>> {
        self.last_errors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// When the pull back-off of `key` (`<pod uid>_<image as the container
    /// names it>`) ends.
    pub fn backoff_until(&self, key: &str) -> Option<std::time::SystemTime> {
        self.backoff.update_expires_at(key)
    }

    /// The current pull back-off delay of `key`.
    pub fn backoff_delay(&self, key: &str) -> std::time::Duration {
        self.backoff.get(key)
    }

    fn clock_now(&self) -> std::time::SystemTime {
        self.backoff.now()
    }

    /// Pulls with each matching credential in turn (none: anonymously;
    /// when all fail, no anonymous try), as kubelet's `PullImage`; returns
    /// the image id and the credentials that worked, or the errors as
    /// kubelet aggregates them.
    async fn pull(
        &self,
        image: &str,
        tracked: &[keyring::Tracked],
        sandbox: Option<&api::PodSandboxConfig>,
    ) -> Result<(String, Option<keyring::Tracked>), String> {
        let spec = keelson_cri::image_spec(image);
        if tracked.is_empty() {
            return self
                .metrics
                .runtime_op(
                    "pull_image",
                    self.cri.pull_image(spec, None, sandbox.cloned()),
                )
                .await
                .map(|r| (r, None))
                .map_err(|e| grpc_text(&e));
        }
        let mut errors: Vec<String> = Vec::new();
        for t in tracked {
            match self
                .metrics
                .runtime_op(
                    "pull_image",
                    self.cri
                        .pull_image(spec.clone(), Some(t.auth.clone()), sandbox.cloned()),
                )
                .await
            {
                Ok(r) => return Ok((r, Some(t.clone()))),
                Err(e) => {
                    let text = grpc_text(&e);
                    if !errors.contains(&text) {
                        errors.push(text);
                    }
                }
            }
        }
        // utilerrors.NewAggregate: one message alone, several in brackets.
        Err(match errors.as_slice() {
            [one] => one.clone(),
            many => format!("[{}]", many.join(", ")),
        })
    }
}

/// `getPodCredentials`: the pod's Secrets and the first service account
/// among the credentials (node credentials are left out).
fn pod_credentials(tracked: &[keyring::Tracked]) -> (Vec<PullSecret>, Option<PullServiceAccount>) {
    let mut secrets = Vec::new();
    let mut account = None;
    for t in tracked {
        match &t.source {
            Some(Source::Secret {
                uid,
                namespace,
                name,
            }) => secrets.push(PullSecret {
                uid: uid.clone(),
                namespace: namespace.clone(),
                name: name.clone(),
                credential_hash: t.hash.clone(),
            }),
            Some(Source::ServiceAccount {
                uid,
                namespace,
                name,
            }) if account.is_none() => {
                account = Some(PullServiceAccount {
                    uid: uid.clone(),
                    namespace: namespace.clone(),
                    name: name.clone(),
                });
            }
            _ => {}
        }
    }
    (secrets, account)
}

fn truncate_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

/// kubelet's `evalCRIPullErr`: registry-unavailable gets its own reason.
fn eval_pull_error(image: &str, text: String) -> StepError {
    const UNAVAILABLE: &str = "RegistryUnavailable";
    if let Some(rest) = text.strip_prefix(UNAVAILABLE) {
        return StepError::new(
            REGISTRY_UNAVAILABLE,
            format!("image pull failed for {image} because the registry is unavailable{rest}"),
        );
    }
    StepError::new(ERR_IMAGE_PULL, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_policy() {
        assert!(!should_pull("Never", false));
        assert!(should_pull("Always", true));
        assert!(should_pull("IfNotPresent", false));
        assert!(!should_pull("IfNotPresent", true));
    }
}

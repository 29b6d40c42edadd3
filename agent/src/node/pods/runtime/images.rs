//! kubelet's image manager (`EnsureImageExists`): the pull policy, pull
//! secrets, per-image backoff (ErrImagePull → ImagePullBackOff, 10 s
//! doubling to 5 min), serialized or bounded parallel pulls, and the
//! Pulling/Pulled/Failed/BackOff events with kubelet's texts.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, Secret};
use keelson_cri::{RuntimeClient, api};
use keelson_probes::gofmt;
use tokio::sync::Semaphore;

use super::errors::{
    ERR_IMAGE_NEVER_PULL, ERR_IMAGE_PULL, IMAGE_INSPECT_ERROR, IMAGE_PULL_BACK_OFF,
    INVALID_IMAGE_NAME, REGISTRY_UNAVAILABLE, StepError, grpc_text,
};
use super::imageref::apply_default_tag;
use super::keyring;
use crate::events::EventType;
use crate::node::pods::backoff::Backoff;
use crate::node::pods::events::{self as reasons, PodEvents};
use crate::node::pods::metrics::{PodMetrics, image_size_bucket};
use crate::node::pods::podutil;

/// Ensures images are present before containers are created.
#[derive(Debug)]
pub struct ImageManager {
    cri: RuntimeClient,
    backoff: Arc<Backoff>,
    events: PodEvents,
    metrics: PodMetrics,
    /// `None`: unlimited parallel pulls.
    pulls: Option<Arc<Semaphore>>,
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
        }
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

    /// Makes `container`'s image present per its pull policy; returns the
    /// image id to create the container from.
    pub async fn ensure_image_exists(
        &self,
        pod: &Pod,
        container: &Container,
        pull_secrets: &[Secret],
        sandbox_config: Option<&api::PodSandboxConfig>,
    ) -> Result<EnsuredImage, StepError> {
        let raw = container.image.as_deref().unwrap_or_default();
        let name = &container.name;
        let image = match apply_default_tag(raw) {
            Ok(i) => i,
            Err(e) => {
                let msg = format!(
                    "Failed to apply default image tag {}: {e}",
                    gofmt::quote(raw)
                );
                self.events.container(
                    pod,
                    name,
                    "",
                    EventType::Warning,
                    reasons::INSPECT_FAILED,
                    &msg,
                );
                return Err(StepError::new(INVALID_IMAGE_NAME, msg));
            }
        };
        let present_ref = match self.image_ref(&image).await {
            Ok(r) => r,
            Err(e) => {
                let msg = format!(
                    "Failed to inspect image {}: {}",
                    gofmt::quote(&image),
                    grpc_text(&e)
                );
                self.events.container(
                    pod,
                    name,
                    "",
                    EventType::Warning,
                    reasons::INSPECT_FAILED,
                    &msg,
                );
                return Err(StepError::new(IMAGE_INSPECT_ERROR, msg));
            }
        };
        let present = !present_ref.is_empty();
        let policy = container
            .image_pull_policy
            .as_deref()
            .unwrap_or("IfNotPresent");
        if !should_pull(policy, present) {
            if present {
                let msg = format!(
                    "Container image {} already present on machine",
                    gofmt::quote(&image)
                );
                self.events
                    .container(pod, name, "", EventType::Normal, reasons::PULLED, msg);
                return Ok(EnsuredImage {
                    image_ref: present_ref,
                    pulled_for: Duration::ZERO,
                });
            }
            let msg = format!(
                "Container image {} is not present with pull policy of Never",
                gofmt::quote(&image)
            );
            self.events.container(
                pod,
                name,
                "",
                EventType::Warning,
                reasons::ERR_IMAGE_NEVER_PULL,
                &msg,
            );
            return Err(StepError::new(ERR_IMAGE_NEVER_PULL, msg));
        }
        let key = format!("{}_{}", podutil::uid(pod), image);
        if self
            .backoff
            .is_in_backoff_since_update(&key, self.clock_now())
        {
            let msg = format!("Back-off pulling image {}", gofmt::quote(&image));
            self.events
                .container(pod, name, "", EventType::Normal, reasons::BACK_OFF, &msg);
            return Err(StepError::new(IMAGE_PULL_BACK_OFF, msg));
        }
        self.events.container(
            pod,
            name,
            "",
            EventType::Normal,
            reasons::PULLING,
            format!("Pulling image {}", gofmt::quote(&image)),
        );
        let waiting_since = tokio::time::Instant::now();
        let _permit = match &self.pulls {
            Some(s) => s.clone().acquire_owned().await.ok(),
            None => None,
        };
        let pull_start = tokio::time::Instant::now();
        let result = self.pull(&image, pull_secrets, sandbox_config).await;
        let pull_duration = pull_start.elapsed();
        drop(_permit);
        match result {
            Err(e) => {
                let text = grpc_text(&e);
                self.events.container(
                    pod,
                    name,
                    "",
                    EventType::Warning,
                    reasons::FAILED,
                    format!("Failed to pull image {}: {text}", gofmt::quote(&image)),
                );
                self.backoff.next(&key, self.clock_now());
                Err(eval_pull_error(&image, text))
            }
            Ok(image_ref) => {
                let size = self
                    .cri
                    .image_status(keelson_cri::image_spec(&image_ref))
                    .await
                    .ok()
                    .flatten()
                    .map(|i| i.size)
                    .unwrap_or(0);
                let total = waiting_since.elapsed();
                self.events.container(
                    pod,
                    name,
                    "",
                    EventType::Normal,
                    reasons::PULLED,
                    format!(
                        "Successfully pulled image {} in {} ({} including waiting). Image size: {size} bytes.",
                        gofmt::quote(&image),
                        gofmt::duration(truncate_ms(pull_duration)),
                        gofmt::duration(truncate_ms(total)),
                    ),
                );
                self.metrics
                    .image_pull_duration
                    .with_label_values(&[image_size_bucket(size)])
                    .observe(pull_duration.as_secs_f64());
                self.backoff.gc();
                Ok(EnsuredImage {
                    image_ref,
                    pulled_for: total,
                })
            }
        }
    }

    fn clock_now(&self) -> std::time::SystemTime {
        self.backoff.now()
    }

    /// Pulls with each matching credential in turn (none: anonymously).
    async fn pull(
        &self,
        image: &str,
        secrets: &[Secret],
        sandbox: Option<&api::PodSandboxConfig>,
    ) -> Result<String, keelson_cri::CriError> {
        let creds = keyring::lookup(image, secrets);
        let spec = keelson_cri::image_spec(image);
        if creds.is_empty() {
            return self
                .metrics
                .runtime_op(
                    "pull_image",
                    self.cri.pull_image(spec, None, sandbox.cloned()),
                )
                .await;
        }
        let mut last = None;
        for auth in creds {
            match self
                .metrics
                .runtime_op(
                    "pull_image",
                    self.cri
                        .pull_image(spec.clone(), Some(auth), sandbox.cloned()),
                )
                .await
            {
                Ok(r) => return Ok(r),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or(keelson_cri::CriError::MissingField {
            method: "PullImage",
            field: "image_ref",
        }))
    }
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

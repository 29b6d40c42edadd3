//! Image references as containerd's CRI plugin sees them: normalized
//! (`busybox` → `docker.io/library/busybox:latest`) and found by tag,
//! digest or id.

use k8s_cri::v1 as api;

/// One image in the fake runtime's store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeImage {
    /// Image id, `sha256:<64 hex>`.
    pub id: String,
    /// Normalized tagged references (`docker.io/library/busybox:1.36`).
    pub repo_tags: Vec<String>,
    /// Digested references (`name@sha256:...`).
    pub repo_digests: Vec<String>,
    /// Size in bytes.
    pub size: u64,
    /// Pinned images are never garbage-collected by kubelet.
    pub pinned: bool,
    /// The image config's user as a number, if numeric.
    pub uid: Option<i64>,
    /// The image config's user as a name, if not numeric.
    pub username: String,
}

impl FakeImage {
    pub(crate) fn to_api(&self) -> api::Image {
        api::Image {
            id: self.id.clone(),
            repo_tags: self.repo_tags.clone(),
            repo_digests: self.repo_digests.clone(),
            size: self.size,
            uid: self.uid.map(|value| api::Int64Value { value }),
            username: self.username.clone(),
            spec: Some(api::ImageSpec {
                image: self.id.clone(),
                ..Default::default()
            }),
            pinned: self.pinned,
        }
    }

    /// The reference containerd reports as a container's `image_ref`: the
    /// first repo digest, else the id.
    pub(crate) fn image_ref(&self) -> String {
        self.repo_digests
            .first()
            .cloned()
            .unwrap_or_else(|| self.id.clone())
    }

    /// Whether `reference` (already normalized, or an id) names this image.
    pub(crate) fn matches(&self, reference: &str) -> bool {
        let id_hex = self.id.trim_start_matches("sha256:");
        reference == self.id
            || reference == id_hex
            || self.repo_tags.iter().any(|t| t == reference)
            || self.repo_digests.iter().any(|d| d == reference)
    }
}

/// Normalizes an image reference the way containerd does for CRI (docker
/// reference rules): default domain `docker.io`, `library/` for official
/// images, tag `latest` when neither tag nor digest is given. Ids
/// (`sha256:...`) are returned unchanged.
pub fn normalize_reference(reference: &str) -> String {
    if reference.starts_with("sha256:") {
        return reference.to_string();
    }
    let (name, digest) = match reference.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (reference, None),
    };
    let (domain, path) = match name.split_once('/') {
        Some((first, rest))
            if first.contains('.') || first.contains(':') || first == "localhost" =>
        {
            (first.to_string(), rest.to_string())
        }
        _ => ("docker.io".to_string(), name.to_string()),
    };
    let path = if domain == "docker.io" && !path.contains('/') {
        format!("library/{path}")
    } else {
        path
    };
    let last = path.rsplit('/').next().unwrap_or_default();
    let tagged = last.contains(':');
    match digest {
        Some(d) => format!("{domain}/{path}@{d}"),
        None if tagged => format!("{domain}/{path}"),
        None => format!("{domain}/{path}:latest"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_like_containerd() {
        let cases = [
            ("busybox", "docker.io/library/busybox:latest"),
            ("busybox:1.36", "docker.io/library/busybox:1.36"),
            ("me/app", "docker.io/me/app:latest"),
            ("keelson.local/pause:3.10", "keelson.local/pause:3.10"),
            ("localhost/x", "localhost/x:latest"),
            ("reg:5000/a/b:v1", "reg:5000/a/b:v1"),
            ("busybox@sha256:abc", "docker.io/library/busybox@sha256:abc"),
            ("sha256:abc", "sha256:abc"),
        ];
        for (input, want) in cases {
            assert_eq!(normalize_reference(input), want, "{input}");
        }
    }

    #[test]
    fn image_matches_tag_digest_and_id() {
        let img = FakeImage {
            id: "sha256:ab12".into(),
            repo_tags: vec!["docker.io/library/busybox:1".into()],
            repo_digests: vec!["docker.io/library/busybox@sha256:ff".into()],
            size: 1,
            pinned: false,
            uid: None,
            username: String::new(),
        };
        assert!(img.matches("sha256:ab12"));
        assert!(img.matches("ab12"));
        assert!(img.matches("docker.io/library/busybox:1"));
        assert!(img.matches("docker.io/library/busybox@sha256:ff"));
        assert!(!img.matches("docker.io/library/busybox:2"));
        assert_eq!(img.image_ref(), "docker.io/library/busybox@sha256:ff");
    }
}

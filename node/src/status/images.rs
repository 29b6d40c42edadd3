//! `status.images`: the images the runtime holds, largest first (ties by id,
//! descending, as kubelet's image cache sorts), at most
//! `nodeStatusMaxImages` of them, each with up to five names (digests
//! first, then tags).

use k8s_openapi::api::core::v1::ContainerImage;
use keelson_cri::api;

/// Most names listed per image (kubelet's `MaxNamesPerImageInNodeStatus`).
pub const MAX_NAMES_PER_IMAGE: usize = 5;

/// Sorts images as kubelet's image cache does: size descending, then id descending.
pub fn sort_by_size(images: &mut [api::Image]) {
    images.sort_by(|a, b| b.size.cmp(&a.size).then_with(|| b.id.cmp(&a.id)));
}

/// The Images setter: `max` images (-1: all) from a list sorted by size.
pub fn node_images(sorted: &[api::Image], max: i32) -> Vec<ContainerImage> {
    let take = if max < 0 {
        sorted.len()
    } else {
        sorted.len().min(usize::try_from(max).unwrap_or(0))
    };
    sorted[..take]
        .iter()
        .map(|img| {
            let names: Vec<String> = img
                .repo_digests
                .iter()
                .chain(img.repo_tags.iter())
                .take(MAX_NAMES_PER_IMAGE)
                .cloned()
                .collect();
            ContainerImage {
                names: if names.is_empty() { None } else { Some(names) },
                size_bytes: Some(i64::try_from(img.size).unwrap_or(i64::MAX)),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn img(id: &str, size: u64, tags: &[&str], digests: &[&str]) -> api::Image {
        api::Image {
            id: id.into(),
            size,
            repo_tags: tags.iter().map(|s| s.to_string()).collect(),
            repo_digests: digests.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn largest_first_truncated_names_limited() {
        let mut images = vec![
            img("sha256:a", 10, &["a:1"], &["a@sha256:1"]),
            img(
                "sha256:b",
                30,
                &["b:1", "b:2", "b:3", "b:4"],
                &["b@sha256:1", "b@sha256:2"],
            ),
            img("sha256:c", 10, &["c:1"], &[]),
            img("sha256:d", 20, &[], &[]),
        ];
        sort_by_size(&mut images);
        let ids: Vec<&str> = images.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["sha256:b", "sha256:d", "sha256:c", "sha256:a"]);
        let out = node_images(&images, 3);
        assert_eq!(out.len(), 3);
        assert_eq!(
            out[0].names.as_deref(),
            Some(
                &[
                    "b@sha256:1".to_string(),
                    "b@sha256:2".into(),
                    "b:1".into(),
                    "b:2".into(),
                    "b:3".into()
                ][..]
            )
        );
        assert_eq!(out[0].size_bytes, Some(30));
        assert_eq!(out[1].names, None);
        assert_eq!(node_images(&images, -1).len(), 4);
        assert!(node_images(&images, 0).is_empty());
    }
}

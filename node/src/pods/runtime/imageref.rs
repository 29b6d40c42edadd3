//! Image references as kubelet reads them (`applyDefaultImageTag` over
//! distribution's `ParseNormalizedNamed`): refused when malformed, `:latest`
//! added when neither a tag nor a digest is given.

/// Why an image reference does not parse. Display texts are distribution's
/// (`reference.ErrReferenceInvalidFormat`, `ErrNameContainsUppercase`,
/// `ErrNameTooLong`), which kubelet puts in the `InvalidImageName` message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    /// Not a reference at all (bad tag, digest, domain or path).
    #[error("invalid reference format")]
    InvalidFormat,
    /// A repository path component with upper-case letters.
    #[error("invalid reference format: repository name ({0}) must be lowercase")]
    Uppercase(String),
    /// A repository name longer than 255 characters.
    #[error("invalid reference format: repository name must not be more than 255 characters")]
    TooLong,
}

/// Returns the image with `:latest` appended when it has no tag or digest.
pub fn apply_default_tag(image: &str) -> Result<String, ReferenceError> {
    let parsed = parse(image)?;
    if parsed.tag.is_none() && parsed.digest.is_none() {
        Ok(format!("{image}:latest"))
    } else {
        Ok(image.to_string())
    }
}

/// The repository an image pulls from as `ParseImageName` gives it
/// (distribution's `ParseNormalizedNamed(image).Name()`): the registry
/// host (`docker.io` for short names, `index.docker.io` read as
/// `docker.io`, `library/` before official images) and the path, without
/// tag or digest. This is what kubelet looks credentials up for.
pub fn repository_name(image: &str) -> Result<String, ReferenceError> {
    parse(image)?;
    let without_digest = image.split('@').next().unwrap_or_default();
    let name = match without_digest.rfind(':') {
        Some(i) if !without_digest[i..].contains('/') => &without_digest[..i],
        _ => without_digest,
    };
    let (domain, remainder) = match name.split_once('/') {
        Some((first, rest))
            if first.contains(['.', ':'])
                || first == "localhost"
                || first.to_lowercase() != first =>
        {
            (first, rest.to_string())
        }
        _ => ("docker.io", name.to_string()),
    };
    let domain = if domain == "index.docker.io" {
        "docker.io"
    } else {
        domain
    };
    let remainder = if domain == "docker.io" && !remainder.contains('/') {
        format!("library/{remainder}")
    } else {
        remainder
    };
    Ok(format!("{domain}/{remainder}"))
}

struct Parsed<'a> {
    tag: Option<&'a str>,
    digest: Option<&'a str>,
}

fn parse(image: &str) -> Result<Parsed<'_>, ReferenceError> {
    if image.is_empty() {
        return Err(ReferenceError::InvalidFormat);
    }
    let (rest, digest) = match image.split_once('@') {
        Some((r, d)) => {
            let (algo, hex) = d.split_once(':').ok_or(ReferenceError::InvalidFormat)?;
            if algo.is_empty()
                || !algo
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+.-_".contains(c))
                || hex.len() < 32
                || !hex.chars().all(|c| c.is_ascii_hexdigit())
            {
                return Err(ReferenceError::InvalidFormat);
            }
            (r, Some(d))
        }
        None => (image, None),
    };
    let (name, tag) = match rest.rfind(':') {
        Some(i) if !rest[i..].contains('/') => (&rest[..i], Some(&rest[i + 1..])),
        _ => (rest, None),
    };
    if let Some(t) = tag {
        let mut chars = t.chars();
        let first_ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        if !first_ok
            || t.len() > 128
            || !t
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
        {
            return Err(ReferenceError::InvalidFormat);
        }
    }
    let mut components: Vec<&str> = name.split('/').collect();
    if components.len() > 1 {
        let first = components[0];
        if first.contains('.') || first.contains(':') || first == "localhost" {
            if !valid_domain(first) {
                return Err(ReferenceError::InvalidFormat);
            }
            components.remove(0);
        }
    }
    if components.is_empty() {
        return Err(ReferenceError::InvalidFormat);
    }
    for c in &components {
        if c.chars().any(|ch| ch.is_ascii_uppercase()) {
            return Err(ReferenceError::Uppercase(name.to_string()));
        }
        if !valid_path_component(c) {
            return Err(ReferenceError::InvalidFormat);
        }
    }
    if name.len() > 255 {
        return Err(ReferenceError::TooLong);
    }
    Ok(Parsed { tag, digest })
}

fn valid_domain(d: &str) -> bool {
    let (host, port) = match d.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || d.starts_with('[') => (h, Some(p)),
        _ => (d, None),
    };
    if let Some(p) = port
        && (p.is_empty() || !p.chars().all(|c| c.is_ascii_digit()))
    {
        return false;
    }
    if host.starts_with('[') && host.ends_with(']') {
        return host[1..host.len() - 1]
            .parse::<std::net::Ipv6Addr>()
            .is_ok();
    }
    !host.is_empty()
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`
fn valid_path_component(c: &str) -> bool {
    let b = c.as_bytes();
    if b.is_empty() {
        return false;
    }
    let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    let mut i = 0;
    let run = |i: &mut usize| {
        let start = *i;
        while *i < b.len() && alnum(b[*i]) {
            *i += 1;
        }
        *i > start
    };
    if !run(&mut i) {
        return false;
    }
    while i < b.len() {
        match b[i] {
            b'.' => i += 1,
            b'_' => {
                i += 1;
                if i < b.len() && b[i] == b'_' {
                    i += 1;
                }
            }
            b'-' => {
                while i < b.len() && b[i] == b'-' {
                    i += 1;
                }
            }
            _ => return false,
        }
        if !run(&mut i) {
            return false;
        }
    }
    true
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn repository_names_as_parse_image_name() {
        for (image, repo) in [
            ("busybox", "docker.io/library/busybox"),
            ("busybox:1.36", "docker.io/library/busybox"),
            ("team/app:1", "docker.io/team/app"),
            ("index.docker.io/busybox", "docker.io/library/busybox"),
            ("reg.io:5000/team/app:1", "reg.io:5000/team/app"),
            ("localhost/app", "localhost/app"),
            (
                "reg.io/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                "reg.io/app",
            ),
        ] {
            assert_eq!(repository_name(image).unwrap(), repo, "{image}");
        }
    }

    #[test]
    fn default_tag_and_validation() {
        assert_eq!(
            apply_default_tag("busybox").as_deref(),
            Ok("busybox:latest")
        );
        assert_eq!(apply_default_tag("busybox:1").as_deref(), Ok("busybox:1"));
        assert_eq!(
            apply_default_tag("localhost:5000/a/b").as_deref(),
            Ok("localhost:5000/a/b:latest")
        );
        let digest =
            "busybox@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        assert_eq!(apply_default_tag(digest).as_deref(), Ok(digest));
        assert_eq!(
            apply_default_tag("keelson.local/busybox:1").as_deref(),
            Ok("keelson.local/busybox:1")
        );
        assert_eq!(
            apply_default_tag("Busybox")
                .expect_err("an error")
                .to_string(),
            "invalid reference format: repository name (Busybox) must be lowercase"
        );
        for bad in ["", "a b", "busybox:", "a//b", "-x", "x:-1"] {
            assert!(apply_default_tag(bad).is_err(), "{bad:?}");
        }
    }
}

//! The CSI versions a driver may register with, as kubelet v1.36 checks
//! them (`csi_plugin.go` `validateVersions` with apimachinery's
//! `version.HighestSupportedVersion` and `ParseGeneric`): only 1.x is
//! supported; a driver whose highest 1.x version is not above the one
//! already registered under the same name is refused.

use std::fmt;

/// A "generic" version: two or more dot-separated numbers, the first
/// without a leading zero, after an optional `v` (`ParseGeneric`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Version(Vec<u64>);

impl Version {
    /// `ParseGeneric`.
    pub(crate) fn parse(s: &str) -> Result<Version, String> {
        let t = s.trim();
        let t = t.strip_prefix('v').unwrap_or(t);
        let numeric_len = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        // The numeric part must not end in a dot: "1." is "1" followed by
        // extra text, as the regular expression reads it.
        let mut numbers = &t[..numeric_len];
        while let Some(n) = numbers.strip_suffix('.') {
            numbers = n;
        }
        if numbers.is_empty() || !numbers.starts_with(|c: char| c.is_ascii_digit()) {
            return Err(format!("could not parse {s:?} as version"));
        }
        let parts: Vec<&str> = numbers.split('.').collect();
        if parts.len() < 2 || parts.iter().any(|p| p.is_empty()) {
            return Err(format!("illegal version string {s:?}"));
        }
        let mut out = Vec::with_capacity(parts.len());
        for (i, p) in parts.iter().enumerate() {
            if i == 0 && p.starts_with('0') && *p != "0" {
                return Err(format!(
                    "illegal zero-prefixed version component {p:?} in {s:?}"
                ));
            }
            out.push(p.parse::<u64>().map_err(|e| {
                format!("illegal non-numeric version component {p:?} in {s:?}: {e}")
            })?);
        }
        Ok(Version(out))
    }

    fn major(&self) -> u64 {
        self.0.first().copied().unwrap_or(0)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(u64::to_string).collect();
        f.write_str(&parts.join("."))
    }
}

/// `HighestSupportedVersion`: the highest 1.x version among `versions`.
pub(crate) fn highest_supported(versions: &[String]) -> Result<Version, String> {
    if versions.is_empty() {
        return Err("empty array for supported versions".to_string());
    }
    let mut highest: Option<Version> = None;
    let mut last_err: Option<String> = None;
    for v in versions.iter().rev() {
        match Version::parse(v) {
            Ok(p) if p.major() > 1 => {}
            Ok(p) => {
                if highest.as_ref().is_none_or(|h| *h < p) {
                    highest = Some(p);
                }
            }
            Err(e) => last_err = Some(e),
        }
    }
    let Some(h) = highest else {
        return Err(format!(
            "could not find a highest supported version from versions ([{}]) reported: {}",
            versions.join(" "),
            last_err.unwrap_or_else(|| "<nil>".to_string())
        ));
    };
    if h.major() != 1 {
        return Err(format!(
            "highest supported version reported is {h}, must be v1.x"
        ));
    }
    Ok(h)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn v(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parse_generic() {
        assert_eq!(Version::parse("1.0.0").unwrap(), Version(vec![1, 0, 0]));
        assert_eq!(Version::parse("v1.2").unwrap(), Version(vec![1, 2]));
        assert_eq!(
            Version::parse(" 1.5.0-rc1 ").unwrap(),
            Version(vec![1, 5, 0])
        );
        assert!(
            Version::parse("1")
                .unwrap_err()
                .contains("illegal version string")
        );
        assert!(
            Version::parse("01.0")
                .unwrap_err()
                .contains("zero-prefixed")
        );
        assert!(
            Version::parse("x1.0")
                .unwrap_err()
                .contains("could not parse")
        );
    }

    #[test]
    fn highest_is_the_highest_1x() {
        assert_eq!(
            highest_supported(&v(&["0.3.0", "1.0.0", "1.2.0", "2.0.0"]))
                .unwrap()
                .to_string(),
            "1.2.0"
        );
        assert_eq!(
            highest_supported(&v(&["0.3.0"])).unwrap_err(),
            "highest supported version reported is 0.3.0, must be v1.x"
        );
        assert_eq!(
            highest_supported(&v(&["2.0.0"])).unwrap_err(),
            "could not find a highest supported version from versions ([2.0.0]) reported: <nil>"
        );
        assert_eq!(
            highest_supported(&[]).unwrap_err(),
            "empty array for supported versions"
        );
    }
}

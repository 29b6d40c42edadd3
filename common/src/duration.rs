//! Durations in the form Kubernetes configuration files use (Go's
//! `time.ParseDuration`): `10s`, `5m`, `1h30m`, `500ms`, `1.5s`, `0`.
//!
//! Negative durations are rejected: no keelson setting accepts one.

use std::fmt;
use std::time::Duration as StdDuration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A non-negative duration written as Kubernetes writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct KubeDuration(pub StdDuration);

/// Why a duration string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// The text was empty.
    #[error("empty duration")]
    Empty,
    /// The text starts with `-`.
    #[error("negative duration {0:?} is not allowed")]
    Negative(String),
    /// A number or unit could not be read.
    #[error("invalid duration {text:?}: {reason} (use forms like 10s, 5m, 1h30m, 500ms)")]
    Invalid {
        /// The whole input.
        text: String,
        /// What was wrong.
        reason: String,
    },
}

impl KubeDuration {
    /// Builds from whole seconds.
    pub const fn from_secs(s: u64) -> Self {
        KubeDuration(StdDuration::from_secs(s))
    }

    /// Builds from milliseconds.
    pub const fn from_millis(ms: u64) -> Self {
        KubeDuration(StdDuration::from_millis(ms))
    }

    /// The std duration.
    pub const fn get(self) -> StdDuration {
        self.0
    }

    /// Parses Go duration syntax (without sign; `+` is accepted, `-` refused).
    pub fn parse(text: &str) -> Result<Self, DurationError> {
        let t = text.trim();
        if t.is_empty() {
            return Err(DurationError::Empty);
        }
        if t.starts_with('-') {
            // "-0s" is still a negative spelling; refuse it too, like a typo.
            return Err(DurationError::Negative(text.to_string()));
        }
        let t = t.strip_prefix('+').unwrap_or(t);
        if t == "0" {
            return Ok(KubeDuration(StdDuration::ZERO));
        }
        let invalid = |reason: &str| DurationError::Invalid {
            text: text.to_string(),
            reason: reason.to_string(),
        };
        let mut total_nanos: u128 = 0;
        let mut rest = t;
        if rest.is_empty() {
            return Err(invalid("no number"));
        }
        while !rest.is_empty() {
            let num_len = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .unwrap_or(rest.len());
            if num_len == 0 {
                return Err(invalid("expected a number"));
            }
            let (num, after) = rest.split_at(num_len);
            let unit_len = after
                .find(|c: char| c.is_ascii_digit() || c == '.')
                .unwrap_or(after.len());
            let (unit, next) = after.split_at(unit_len);
            let unit_nanos: u128 = match unit {
                "ns" => 1,
                "us" | "µs" | "μs" => 1_000,
                "ms" => 1_000_000,
                "s" => 1_000_000_000,
                "m" => 60 * 1_000_000_000,
                "h" => 3600 * 1_000_000_000,
                "" => return Err(invalid("missing unit")),
                other => return Err(invalid(&format!("unknown unit {other:?}"))),
            };
            let (int_part, frac_part) = match num.split_once('.') {
                Some((i, f)) => (i, f),
                None => (num, ""),
            };
            if int_part.is_empty() && frac_part.is_empty() {
                return Err(invalid("expected a number"));
            }
            if frac_part.contains('.') {
                return Err(invalid("more than one decimal point"));
            }
            let int: u128 = if int_part.is_empty() {
                0
            } else {
                int_part.parse().map_err(|_| invalid("number too large"))?
            };
            let mut value = int
                .checked_mul(unit_nanos)
                .ok_or_else(|| invalid("duration too large"))?;
            if !frac_part.is_empty() {
                let digits = frac_part.len().min(18) as u32;
                let frac: u128 = frac_part[..digits as usize]
                    .parse()
                    .map_err(|_| invalid("bad fraction"))?;
                value += frac * unit_nanos / 10u128.pow(digits);
            }
            total_nanos = total_nanos
                .checked_add(value)
                .ok_or_else(|| invalid("duration too large"))?;
            rest = next;
        }
        let secs = u64::try_from(total_nanos / 1_000_000_000)
            .map_err(|_| invalid("duration too large"))?;
        let nanos = (total_nanos % 1_000_000_000) as u32;
        Ok(KubeDuration(StdDuration::new(secs, nanos)))
    }
}

impl fmt::Display for KubeDuration {
    /// Go's `Duration.String()` (`0s`, `500ms`, `10s`, `5m0s`, `1h30m0s`),
    /// as kubelet prints a configuration's durations.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::gofmt::duration(self.0))
    }
}

impl Serialize for KubeDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for KubeDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        KubeDuration::parse(&text).map_err(serde::de::Error::custom)
    }
}

impl From<KubeDuration> for StdDuration {
    fn from(d: KubeDuration) -> Self {
        d.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kubernetes_forms() {
        let cases = [
            ("10s", StdDuration::from_secs(10)),
            ("5m", StdDuration::from_secs(300)),
            ("1h30m", StdDuration::from_secs(5400)),
            ("500ms", StdDuration::from_millis(500)),
            ("1.5s", StdDuration::from_millis(1500)),
            ("0", StdDuration::ZERO),
            ("0s", StdDuration::ZERO),
            ("2m0s", StdDuration::from_secs(120)),
            ("100us", StdDuration::from_micros(100)),
            ("+3s", StdDuration::from_secs(3)),
        ];
        for (text, want) in cases {
            assert_eq!(KubeDuration::parse(text), Ok(KubeDuration(want)), "{text}");
        }
    }

    #[test]
    fn refuses_bad_forms() {
        for text in ["", "-5s", "10", "5x", "s", "1..2s", "abc"] {
            assert!(KubeDuration::parse(text).is_err(), "{text:?} must fail");
        }
        assert!(matches!(
            KubeDuration::parse("-1m"),
            Err(DurationError::Negative(_))
        ));
    }

    #[test]
    fn formats_like_go() {
        let cases = [
            (StdDuration::ZERO, "0s"),
            (StdDuration::from_millis(500), "500ms"),
            (StdDuration::from_secs(10), "10s"),
            (StdDuration::from_secs(300), "5m0s"),
            (StdDuration::from_secs(5400), "1h30m0s"),
            (StdDuration::from_millis(1500), "1.5s"),
        ];
        for (d, want) in cases {
            assert_eq!(KubeDuration(d).to_string(), want);
            assert_eq!(
                KubeDuration::parse(want),
                Ok(KubeDuration(d)),
                "round trip {want}"
            );
        }
    }
}

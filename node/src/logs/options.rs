//! The query of `/containerLogs/...`: core/v1 `PodLogOptions` decoded as
//! kubelet decodes it (`getContainerLogs` in `pkg/kubelet/server/server.go`:
//! the legacy `tail` parameter, the v1 parameter codec, then
//! `ValidatePodLogOptions`).

/// What the caller asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogOptions {
    /// `follow`.
    pub follow: bool,
    /// `previous`: the last terminated instance.
    pub previous: bool,
    /// `timestamps`: prefix each line with its RFC3339Nano timestamp.
    pub timestamps: bool,
    /// `tailLines`.
    pub tail_lines: Option<i64>,
    /// `limitBytes`.
    pub limit_bytes: Option<i64>,
    /// `sinceSeconds`.
    pub since_seconds: Option<i64>,
    /// `sinceTime`, nanoseconds since the epoch.
    pub since_time: Option<i128>,
    /// `stream` (`All`, `Stdout`, `Stderr`), if given.
    pub stream: Option<String>,
}

/// A query kubelet refuses: 400 when it does not decode, 422 when invalid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OptionsError {
    /// A parameter does not decode (names it).
    Decode(String),
    /// The options are invalid (`ValidatePodLogOptions`).
    Invalid(String),
}

/// Go's `strconv.ParseBool` (an empty value is false, as the parameter
/// codec converts it).
fn parse_bool(name: &str, v: &str) -> Result<bool, OptionsError> {
    match v {
        "" | "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        _ => Err(OptionsError::Decode(format!(
            "{name}: strconv.ParseBool: parsing {v:?}: invalid syntax"
        ))),
    }
}

fn parse_int(name: &str, v: &str) -> Result<i64, OptionsError> {
    v.parse::<i64>().map_err(|_| {
        OptionsError::Decode(format!(
            "{name}: strconv.ParseInt: parsing {v:?}: invalid syntax"
        ))
    })
}

impl LogOptions {
    /// Decodes and validates `key=value` pairs (already percent-decoded).
    /// As the parameter codec, the first value of a repeated key counts.
    pub fn from_query(pairs: &[(String, String)]) -> Result<LogOptions, OptionsError> {
        let mut o = LogOptions::default();
        let mut seen = std::collections::HashSet::new();
        let mut tail: Option<String> = None;
        for (k, v) in pairs {
            if !seen.insert(k.as_str()) {
                continue;
            }
            match k.as_str() {
                "follow" => o.follow = parse_bool(k, v)?,
                "previous" => o.previous = parse_bool(k, v)?,
                "timestamps" => o.timestamps = parse_bool(k, v)?,
                "insecureSkipTLSVerifyBackend" => {
                    parse_bool(k, v)?;
                }
                "tailLines" if tail.is_none() => o.tail_lines = Some(parse_int(k, v)?),
                // kubelet's backwards compatibility: `tail` wins over
                // `tailLines`, and `tail=all` means all lines.
                "tail" if !v.is_empty() => tail = Some(v.clone()),
                "limitBytes" => o.limit_bytes = Some(parse_int(k, v)?),
                "sinceSeconds" => o.since_seconds = Some(parse_int(k, v)?),
                "sinceTime" => {
                    let t = super::format::parse_timestamp(v).ok_or_else(|| {
                        OptionsError::Decode(format!(
                            "sinceTime: parsing time {v:?} as RFC3339: cannot parse"
                        ))
                    })?;
                    o.since_time = Some(t);
                }
                "stream" => o.stream = Some(v.clone()),
                _ => {}
            }
        }
        if let Some(t) = tail {
            o.tail_lines = if t == "all" {
                None
            } else {
                Some(parse_int("tail", &t)?)
            };
        }
        o.validate()?;
        Ok(o)
    }

    fn validate(&self) -> Result<(), OptionsError> {
        let bad = |field: &str, v: i64, what: &str| {
            Err(OptionsError::Invalid(format!(
                "{field}: Invalid value: {v}: {what}"
            )))
        };
        if let Some(t) = self.tail_lines
            && t < 0
        {
            return bad("tailLines", t, "must be greater than or equal to 0");
        }
        if let Some(b) = self.limit_bytes
            && b < 1
        {
            return bad("limitBytes", b, "must be greater than 0");
        }
        if let Some(s) = self.since_seconds {
            if s < 1 {
                return bad("sinceSeconds", s, "must be greater than 0");
            }
            if self.since_time.is_some() {
                return Err(OptionsError::Invalid(
                    "sinceSeconds: Forbidden: at most one of `sinceTime` or `sinceSeconds` may be specified".into(),
                ));
            }
        }
        if let Some(s) = &self.stream
            && !matches!(s.as_str(), "All" | "Stdout" | "Stderr")
        {
            return Err(OptionsError::Invalid(format!(
                "stream: Unsupported value: {s:?}: supported values: \"All\", \"Stderr\", \"Stdout\""
            )));
        }
        Ok(())
    }

    /// The earliest timestamp shown (ns since the epoch), from
    /// `sinceSeconds` against `now_ns` or `sinceTime`.
    pub fn since(&self, now_ns: i128) -> Option<i128> {
        match (self.since_seconds, self.since_time) {
            (Some(s), _) => Some(now_ns - i128::from(s) * 1_000_000_000),
            (None, Some(t)) => Some(t),
            _ => None,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn decodes_kubectl_queries() {
        let o = LogOptions::from_query(&q(&[
            ("follow", "true"),
            ("tailLines", "10"),
            ("timestamps", "1"),
            ("sinceSeconds", "60"),
        ]))
        .unwrap();
        assert!(o.follow && o.timestamps && !o.previous);
        assert_eq!(o.tail_lines, Some(10));
        assert_eq!(o.since(100_000_000_000), Some(40_000_000_000));
        let legacy = LogOptions::from_query(&q(&[("tailLines", "3"), ("tail", "all")])).unwrap();
        assert_eq!(legacy.tail_lines, None);
        let legacy = LogOptions::from_query(&q(&[("tail", "7")])).unwrap();
        assert_eq!(legacy.tail_lines, Some(7));
        let t = LogOptions::from_query(&q(&[("sinceTime", "2024-01-02T03:04:05Z")])).unwrap();
        assert!(t.since_time.is_some());
    }

    #[test]
    fn refusals_name_the_parameter() {
        match LogOptions::from_query(&q(&[("tailLines", "x")])) {
            Err(OptionsError::Decode(m)) => assert!(m.starts_with("tailLines:"), "{m}"),
            other => panic!("{other:?}"),
        }
        match LogOptions::from_query(&q(&[("follow", "maybe")])) {
            Err(OptionsError::Decode(m)) => assert!(m.starts_with("follow:"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            LogOptions::from_query(&q(&[("tailLines", "-1")])),
            Err(OptionsError::Invalid(_))
        ));
        assert!(matches!(
            LogOptions::from_query(&q(&[("limitBytes", "0")])),
            Err(OptionsError::Invalid(_))
        ));
        assert!(matches!(
            LogOptions::from_query(&q(&[
                ("sinceSeconds", "5"),
                ("sinceTime", "2024-01-02T03:04:05Z")
            ])),
            Err(OptionsError::Invalid(_))
        ));
    }
}

//! A reader of the Prometheus text exposition format (version 0.0.4) for
//! tests that scrape an agent's metrics: samples with their labels, and the
//! `# HELP`/`# TYPE` of each family. Strict: a line it cannot read is an
//! error naming it, so a malformed exposition fails the test.

use std::collections::BTreeMap;

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name.
    pub name: String,
    /// Labels, by name.
    pub labels: BTreeMap<String, String>,
    /// Value.
    pub value: f64,
    /// Timestamp in ms, when the line has one.
    pub timestamp_ms: Option<i64>,
}

impl Sample {
    /// The value of label `k` ("" when absent).
    pub fn label(&self, k: &str) -> &str {
        self.labels.get(k).map(String::as_str).unwrap_or("")
    }
}

/// A parsed exposition.
#[derive(Debug, Clone, Default)]
pub struct Exposition {
    /// Every sample, in order.
    pub samples: Vec<Sample>,
    /// `# HELP` text by family.
    pub help: BTreeMap<String, String>,
    /// `# TYPE` by family.
    pub kind: BTreeMap<String, String>,
}

impl Exposition {
    /// The samples of `name` whose labels include every pair of `with`.
    pub fn find(&self, name: &str, with: &[(&str, &str)]) -> Vec<&Sample> {
        self.samples
            .iter()
            .filter(|s| s.name == name && with.iter().all(|(k, v)| s.label(k) == *v))
            .collect()
    }
}

/// Reads a whole exposition.
pub fn parse(text: &str) -> Result<Exposition, String> {
    let mut out = Exposition::default();
    for (i, line) in text.lines().enumerate() {
        let err = |what: &str| format!("line {}: {what}: {line:?}", i + 1);
        if line.trim().is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            out.help.insert(name.to_string(), help.to_string());
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest
                .split_once(' ')
                .ok_or_else(|| err("TYPE without a type"))?;
            out.kind.insert(name.to_string(), kind.to_string());
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        out.samples.push(sample(line).map_err(|e| err(&e))?);
    }
    Ok(out)
}

fn sample(line: &str) -> Result<Sample, String> {
    let name_end = line.find(['{', ' ']).ok_or("no value")?;
    let name = line[..name_end].to_string();
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(body) = rest.strip_prefix('{') {
        let mut chars = body.char_indices().peekable();
        let end;
        loop {
            // label name
            let start = chars.peek().map(|(i, _)| *i).ok_or("unterminated labels")?;
            if body[start..].starts_with('}') {
                end = start + 1;
                break;
            }
            let eq = body[start..].find('=').ok_or("label without =")? + start;
            let key = body[start..eq].trim_start_matches(',').to_string();
            while chars.peek().is_some_and(|(i, _)| *i <= eq) {
                chars.next();
            }
            if chars.next().map(|(_, c)| c) != Some('"') {
                return Err("label value not quoted".into());
            }
            let mut value = String::new();
            loop {
                match chars.next().ok_or("unterminated label value")?.1 {
                    '\\' => match chars.next().ok_or("dangling escape")?.1 {
                        'n' => value.push('\n'),
                        '\\' => value.push('\\'),
                        '"' => value.push('"'),
                        c => return Err(format!("unknown escape \\{c}")),
                    },
                    '"' => break,
                    c => value.push(c),
                }
            }
            labels.insert(key, value);
            match chars.peek().map(|(_, c)| *c) {
                Some(',') => {
                    chars.next();
                }
                Some('}') => {}
                _ => return Err("expected , or } after a label".into()),
            }
        }
        rest = &body[end..];
    }
    let mut fields = rest.split_whitespace();
    let value = fields.next().ok_or("no value")?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().map_err(|e| format!("value {v:?}: {e}"))?,
    };
    let timestamp_ms = fields
        .next()
        .map(|t| t.parse().map_err(|e| format!("timestamp {t:?}: {e}")))
        .transpose()?;
    Ok(Sample {
        name,
        labels,
        value,
        timestamp_ms,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn reads_labels_escapes_and_timestamps() {
        let e = parse(
            "# HELP a_total Help text.\n# TYPE a_total counter\na_total{x=\"1\",y=\"q\\\"\\n\\\\\"} 2.5 1700000000000\nb 3\n",
        )
        .unwrap();
        assert_eq!(e.kind["a_total"], "counter");
        assert_eq!(e.help["a_total"], "Help text.");
        assert_eq!(e.samples[0].label("y"), "q\"\n\\");
        assert_eq!(e.samples[0].timestamp_ms, Some(1_700_000_000_000));
        assert_eq!(e.samples[1].value, 3.0);
        assert!(parse("a{x=1} 2\n").is_err());
    }
}

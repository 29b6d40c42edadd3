//! Label and field selectors, parsed and matched as kube-apiserver does.

use std::collections::BTreeMap;

/// One label selector requirement.
#[derive(Debug, Clone, PartialEq)]
enum LabelReq {
    Exists(String),
    NotExists(String),
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Gt(String, i64),
    Lt(String, i64),
}

/// A parsed label selector (`a=b,c!=d,e in (x,y),!f,g`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector {
    reqs: Vec<LabelReq>,
}

/// Selector parse error; rendered as a 400 by the caller.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{0}")]
pub struct SelectorError(pub String);

fn split_top_level(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for ch in s.chars() {
        match ch {
            '(' => {
                depth += 1;
                cur.push(ch);
            }
            ')' => {
                depth -= 1;
                cur.push(ch);
            }
            ',' if depth == 0 => out.push(std::mem::take(&mut cur)),
            _ => cur.push(ch),
        }
    }
    out.push(cur);
    out
}

fn valid_label_key(k: &str) -> bool {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if let Some(p) = prefix
        && (p.is_empty()
            || p.len() > 253
            || !p
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.'))
    {
        return false;
    }
    valid_label_value(name) && !name.is_empty()
}

fn valid_label_value(v: &str) -> bool {
    if v.is_empty() {
        return true;
    }
    let b = v.as_bytes();
    v.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
}

fn parse_set(rest: &str, key: &str) -> Result<Vec<String>, SelectorError> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| SelectorError(format!("found '{rest}', expected: '(' for key {key}")))?;
    let vals: Vec<String> = inner.split(',').map(|v| v.trim().to_string()).collect();
    for v in &vals {
        if !valid_label_value(v) {
            return Err(SelectorError(format!("invalid label value: \"{v}\"")));
        }
    }
    Ok(vals)
}

impl LabelSelector {
    /// Parses the `labelSelector` query parameter.
    pub fn parse(s: &str) -> Result<LabelSelector, SelectorError> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(LabelSelector { reqs });
        }
        for part in split_top_level(s) {
            let p = part.trim();
            if p.is_empty() {
                return Err(SelectorError(format!(
                    "found '', expected: identifier in selector \"{s}\""
                )));
            }
            let req = if let Some(k) = p.strip_prefix('!') {
                LabelReq::NotExists(k.trim().to_string())
            } else if let Some((k, v)) = p.split_once("!=") {
                LabelReq::NotEq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = p.split_once("==") {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = p.split_once('=') {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = p.split_once('>') {
                let n = v.trim().parse().map_err(|_| {
                    SelectorError(format!(
                        "for 'Gt', 'Lt' operators, the value must be an integer: {v}"
                    ))
                })?;
                LabelReq::Gt(k.trim().into(), n)
            } else if let Some((k, v)) = p.split_once('<') {
                let n = v.trim().parse().map_err(|_| {
                    SelectorError(format!(
                        "for 'Gt', 'Lt' operators, the value must be an integer: {v}"
                    ))
                })?;
                LabelReq::Lt(k.trim().into(), n)
            } else if let Some(idx) = p.find(" notin ") {
                let key = p[..idx].trim();
                LabelReq::NotIn(key.into(), parse_set(&p[idx + 7..], key)?)
            } else if let Some(idx) = p.find(" in ") {
                let key = p[..idx].trim();
                LabelReq::In(key.into(), parse_set(&p[idx + 4..], key)?)
            } else {
                LabelReq::Exists(p.to_string())
            };
            let (key, vals): (&str, Vec<&str>) = match &req {
                LabelReq::Exists(k)
                | LabelReq::NotExists(k)
                | LabelReq::Gt(k, _)
                | LabelReq::Lt(k, _) => (k, vec![]),
                LabelReq::Eq(k, v) | LabelReq::NotEq(k, v) => (k, vec![v.as_str()]),
                LabelReq::In(k, v) | LabelReq::NotIn(k, v) => {
                    (k, v.iter().map(|s| s.as_str()).collect())
                }
            };
            if !valid_label_key(key) {
                return Err(SelectorError(format!(
                    "invalid label key \"{key}\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
                )));
            }
            for v in vals {
                if !valid_label_value(v) {
                    return Err(SelectorError(format!("invalid label value: \"{v}\"")));
                }
            }
            reqs.push(req);
        }
        Ok(LabelSelector { reqs })
    }

    /// True when the selector selects everything.
    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.reqs.iter().all(|r| match r {
            LabelReq::Exists(k) => labels.contains_key(k),
            LabelReq::NotExists(k) => !labels.contains_key(k),
            LabelReq::Eq(k, v) => labels.get(k) == Some(v),
            LabelReq::NotEq(k, v) => labels.get(k) != Some(v),
            LabelReq::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            LabelReq::NotIn(k, vs) => labels.get(k).is_none_or(|l| !vs.contains(l)),
            LabelReq::Gt(k, n) => labels
                .get(k)
                .and_then(|l| l.parse::<i64>().ok())
                .is_some_and(|l| l > *n),
            LabelReq::Lt(k, n) => labels
                .get(k)
                .and_then(|l| l.parse::<i64>().ok())
                .is_some_and(|l| l < *n),
        })
    }
}

/// One field selector requirement (`label=value` or `label!=value`).
#[derive(Debug, Clone, PartialEq)]
pub struct FieldReq {
    /// Field label, e.g. `spec.nodeName`.
    pub label: String,
    /// Value compared.
    pub value: String,
    /// `!=` rather than `=`.
    pub negated: bool,
}

/// A parsed field selector.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector {
    /// Requirements, all must hold.
    pub reqs: Vec<FieldReq>,
}

fn split_unescaped(s: &str, sep: char) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut escaped = false;
    for ch in s.chars() {
        if escaped {
            cur.push('\\');
            cur.push(ch);
            escaped = false;
        } else if ch == '\\' {
            escaped = true;
        } else if ch == sep {
            out.push(std::mem::take(&mut cur));
        } else {
            cur.push(ch);
        }
    }
    if escaped {
        cur.push('\\');
    }
    out.push(cur);
    out
}

fn unescape(s: &str) -> Result<String, SelectorError> {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some(n @ ('\\' | ',' | '=')) => out.push(n),
                Some(n) => {
                    return Err(SelectorError(format!(
                        "invalid field selector: invalid escape sequence: \\{n}"
                    )));
                }
                None => {
                    return Err(SelectorError(
                        "invalid field selector: unterminated escape".into(),
                    ));
                }
            }
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

/// Finds the first unescaped occurrence of `op` in `s`.
fn find_unescaped(s: &str, op: &str) -> Option<usize> {
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            i += 2;
            continue;
        }
        if s[i..].starts_with(op) {
            return Some(i);
        }
        i += 1;
    }
    None
}

impl FieldSelector {
    /// Parses the `fieldSelector` query parameter.
    pub fn parse(s: &str) -> Result<FieldSelector, SelectorError> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(FieldSelector { reqs });
        }
        for part in split_unescaped(s, ',') {
            let (label, value, negated) = if let Some(i) = find_unescaped(&part, "!=") {
                (&part[..i], &part[i + 2..], true)
            } else if let Some(i) = find_unescaped(&part, "==") {
                (&part[..i], &part[i + 2..], false)
            } else if let Some(i) = find_unescaped(&part, "=") {
                (&part[..i], &part[i + 1..], false)
            } else {
                return Err(SelectorError(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                )));
            };
            reqs.push(FieldReq {
                label: unescape(label.trim())?,
                value: unescape(value)?,
                negated,
            });
        }
        Ok(FieldSelector { reqs })
    }

    /// True when it selects everything.
    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// Whether the object's field values satisfy every requirement.
    /// `fields` maps label → value; a missing label is the empty string.
    pub fn matches(&self, fields: &dyn Fn(&str) -> String) -> bool {
        self.reqs.iter().all(|r| {
            let v = fields(&r.label);
            (v == r.value) != r.negated
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn label_selector_forms() {
        let l = labels(&[("app", "web"), ("tier", "front"), ("n", "5")]);
        let cases = [
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("app in (web,db)", true),
            ("app notin (web,db)", false),
            ("tier,app", true),
            ("!tier", false),
            ("!missing", true),
            ("missing notin (x)", true),
            ("n>4", true),
            ("n<4", false),
            ("app=web,tier in (back)", false),
            ("kubernetes.io/service-name=x", false),
        ];
        for (sel, want) in cases {
            let s = LabelSelector::parse(sel).unwrap_or_else(|e| panic!("{sel}: {e}"));
            assert_eq!(s.matches(&l), want, "{sel}");
        }
        assert!(LabelSelector::parse("a=b c").is_err());
        assert!(LabelSelector::parse("a in b").is_err());
    }

    #[test]
    fn field_selector_forms() {
        let f = FieldSelector::parse("spec.nodeName=n1,status.phase!=Failed").expect("parse");
        let get = |l: &str| match l {
            "spec.nodeName" => "n1".to_string(),
            "status.phase" => "Running".to_string(),
            _ => String::new(),
        };
        assert!(f.matches(&get));
        let e = FieldSelector::parse("spec.nodeName=").expect("empty value");
        assert!(!e.matches(&get));
        let esc = FieldSelector::parse(r"metadata.name=a\,b").expect("escape");
        assert_eq!(esc.reqs[0].value, "a,b");
        assert!(FieldSelector::parse("nonsense").is_err());
    }
}

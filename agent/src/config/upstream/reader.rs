//! Reads an upstream component configuration (KubeletConfiguration,
//! KubeProxyConfiguration) field by field, so that every problem of a file
//! is reported at once: unknown fields, wrong types, values keelson cannot
//! honour. A field is taken out of its object when read; what is left at the
//! end is unknown.
//!
//! Go decodes these files into structs: an absent field and an explicit
//! `null` leave the zero value, and upstream's defaulting then replaces
//! zero values (`0s`, `0`, `""`) of most fields by the default. Pointer
//! fields (`*int32`, `*bool`) keep an explicit zero. The helpers here make
//! that distinction explicit per field.

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::config::FieldError;
use crate::config::duration::KubeDuration;

/// What reading a file found, beside the settings themselves.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Report {
    /// Fields that cannot be used, with the reason.
    pub errors: Vec<FieldError>,
    /// Fields keelson does not implement, present with upstream's default
    /// value (accepted; listed in one warning).
    pub ignored: Vec<String>,
    /// Other things worth one log line each (a default chosen differently
    /// from upstream, a value read from an upstream place).
    pub notes: Vec<String>,
}

impl Report {
    /// Records an error on `path`.
    pub fn error(&mut self, path: impl Into<String>, reason: impl std::fmt::Display) {
        self.errors.push(FieldError::new(path, reason));
    }
}

/// The content types a Kubernetes client may ask for; keelson speaks JSON
/// whatever is configured, so every one of them is accepted.
pub const CONTENT_TYPES: Default<'static> = Default::OneOf(&[
    "application/vnd.kubernetes.protobuf",
    "application/json",
    "",
]);

/// Upstream's default of a field keelson does not implement: the values
/// accepted for it.
#[derive(Debug, Clone, Copy)]
pub enum Default<'a> {
    /// A duration whose zero value is defaulted upstream (`0s` or the default).
    Duration(KubeDuration),
    /// A string whose empty value is defaulted upstream (`""` or the default).
    Str(&'a str),
    /// A string that must be one of these (the first is upstream's default).
    OneOf(&'a [&'a str]),
    /// A bool (plain `bool` fields: the zero value `false` is the default).
    Bool(bool),
    /// An integer whose zero value is defaulted upstream (`0` or the default).
    Int(i64),
    /// An integer pointer: exactly this value.
    IntExact(i64),
    /// A float pointer: exactly this value.
    Float(f64),
    /// Empty (or null) list or map, or an empty string.
    Empty,
    /// A list of exactly these strings.
    List(&'a [&'a str]),
}

impl Default<'_> {
    fn accepts(self, v: &Value) -> bool {
        match self {
            Default::Duration(d) => match v {
                Value::String(s) => KubeDuration::parse(s)
                    .map(|x| x.get().is_zero() || x == d)
                    .unwrap_or(false),
                Value::Number(n) => n.as_i64() == Some(0),
                _ => false,
            },
            Default::Str(d) => v.as_str().is_some_and(|s| s.is_empty() || s == d),
            Default::OneOf(list) => v.as_str().is_some_and(|s| list.contains(&s)),
            Default::Bool(b) => v.as_bool() == Some(b),
            Default::Int(d) => v.as_i64().is_some_and(|i| i == 0 || i == d),
            Default::IntExact(d) => v.as_i64() == Some(d),
            Default::Float(d) => v.as_f64().is_some_and(|f| (f - d).abs() < 1e-9),
            Default::Empty => match v {
                Value::Array(a) => a.is_empty(),
                Value::Object(m) => m.is_empty(),
                Value::String(s) => s.is_empty(),
                _ => false,
            },
            Default::List(want) => v.as_array().is_some_and(|a| {
                a.len() == want.len()
                    && a.iter()
                        .zip(want.iter())
                        .all(|(x, w)| x.as_str() == Some(*w))
            }),
        }
    }

    fn describe(self) -> String {
        match self {
            Default::Duration(d) => format!("{d}"),
            Default::Str("") => "empty".to_string(),
            Default::Str(s) => format!("{s:?}"),
            Default::OneOf(list) => list
                .iter()
                .map(|s| format!("{s:?}"))
                .collect::<Vec<_>>()
                .join(" or "),
            Default::Bool(b) => b.to_string(),
            Default::Int(i) | Default::IntExact(i) => i.to_string(),
            Default::Float(f) => f.to_string(),
            Default::Empty => "empty".to_string(),
            Default::List(l) => format!("{l:?}"),
        }
    }
}

/// One object of the file, fields taken out as they are read.
#[derive(Debug)]
pub struct Object {
    prefix: String,
    map: Map<String, Value>,
}

impl Object {
    /// The document root. A document that is not a mapping is an error.
    pub fn root(doc: Value, report: &mut Report) -> Object {
        Self::from_value(String::new(), doc, report)
    }

    fn from_value(prefix: String, v: Value, report: &mut Report) -> Object {
        let map = match v {
            Value::Object(m) => m,
            Value::Null => Map::new(),
            other => {
                report.error(
                    if prefix.is_empty() { "." } else { &prefix },
                    format!("must be a mapping, got {}", kind(&other)),
                );
                Map::new()
            }
        };
        Object { prefix, map }
    }

    /// The file path of `key` in this object.
    pub fn path(&self, key: &str) -> String {
        if self.prefix.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.prefix)
        }
    }

    /// Takes a field out; an explicit `null` counts as absent (Go leaves the
    /// zero value).
    pub fn take(&mut self, key: &str) -> Option<Value> {
        match self.map.remove(key) {
            None | Some(Value::Null) => None,
            Some(v) => Some(v),
        }
    }

    /// True when the field is present (not null) and not yet taken.
    pub fn has(&self, key: &str) -> bool {
        self.map.get(key).is_some_and(|v| !v.is_null())
    }

    /// Takes a field and decodes it; a wrong type is an error on its path.
    pub fn get<T: DeserializeOwned>(&mut self, key: &str, report: &mut Report) -> Option<T> {
        let v = self.take(key)?;
        match serde_json::from_value::<T>(v) {
            Ok(t) => Some(t),
            Err(e) => {
                report.error(self.path(key), e.to_string());
                None
            }
        }
    }

    /// A string field whose empty value means "default": `None` when absent
    /// or empty.
    pub fn string(&mut self, key: &str, report: &mut Report) -> Option<String> {
        self.get::<String>(key, report).filter(|s| !s.is_empty())
    }

    /// A `metav1.Duration` whose zero value means "default": `None` when
    /// absent or zero.
    pub fn duration(&mut self, key: &str, report: &mut Report) -> Option<KubeDuration> {
        self.duration_ptr(key, report)
            .filter(|d| !d.get().is_zero())
    }

    /// A `*metav1.Duration`: an explicit zero is kept.
    pub fn duration_ptr(&mut self, key: &str, report: &mut Report) -> Option<KubeDuration> {
        let v = self.take(key)?;
        let Value::String(s) = v else {
            report.error(
                self.path(key),
                format!(
                    "must be a duration string such as \"10s\", got {}",
                    kind(&v)
                ),
            );
            return None;
        };
        match KubeDuration::parse(&s) {
            Ok(d) => Some(d),
            Err(e) => {
                report.error(self.path(key), e.to_string());
                None
            }
        }
    }

    /// An integer whose zero value means "default": `None` when absent or 0.
    pub fn int(&mut self, key: &str, report: &mut Report) -> Option<i64> {
        self.get::<i64>(key, report).filter(|i| *i != 0)
    }

    /// A plain `bool` (zero value false): `Some(true)` only when set.
    pub fn flag(&mut self, key: &str, report: &mut Report) -> Option<bool> {
        self.get::<bool>(key, report)
    }

    /// A nested object (absent: empty).
    pub fn object(&mut self, key: &str, report: &mut Report) -> Object {
        let prefix = self.path(key);
        let v = self.map.remove(key).unwrap_or(Value::Null);
        Object::from_value(prefix, v, report)
    }

    /// A field keelson does not implement: accepted (and listed) when its
    /// value is upstream's default, refused otherwise with the reason.
    pub fn unimplemented(
        &mut self,
        key: &str,
        default: Default<'_>,
        why: &str,
        report: &mut Report,
    ) {
        let Some(v) = self.take(key) else { return };
        if default.accepts(&v) {
            report.ignored.push(self.path(key));
        } else {
            report.error(
                self.path(key),
                format!(
                    "keelson does not implement this setting ({why}); only upstream's default ({}) is accepted, got {}",
                    default.describe(),
                    short(&v)
                ),
            );
        }
    }

    /// A field whose value keelson accepts whatever it is, because it does not
    /// change what keelson does (listed with the ignored fields).
    pub fn accept_any(&mut self, key: &str, report: &mut Report) {
        if self.take(key).is_some() {
            report.ignored.push(self.path(key));
        }
    }

    /// Every field not read is unknown.
    pub fn finish(self, report: &mut Report) {
        for (k, _) in self.map {
            let path = if self.prefix.is_empty() {
                k.clone()
            } else {
                format!("{}.{k}", self.prefix)
            };
            report.error(path, "unknown field");
        }
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// A value as it appears in a message, shortened.
pub fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 80 {
        format!("{}…", s.chars().take(77).collect::<String>())
    } else {
        s
    }
}

/// Parses YAML text into a JSON value, as sigs.k8s.io/yaml converts YAML
/// before Go's JSON decoder reads it.
pub fn parse_yaml(text: &str) -> Result<Value, YamlError> {
    if text.trim().is_empty() {
        return Ok(Value::Object(Map::new()));
    }
    let v: serde_yaml::Value = serde_yaml::from_str(text)?;
    Ok(serde_json::to_value(v)?)
}

/// Why a configuration file is not YAML that converts to JSON.
#[derive(Debug, thiserror::Error)]
pub enum YamlError {
    /// Not YAML.
    #[error(transparent)]
    Yaml(#[from] serde_yaml::Error),
    /// YAML with no JSON form (e.g. a non-string map key).
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn absent_null_and_zero_are_told_apart() {
        let mut r = Report::default();
        let mut o = Object::root(
            json!({"a": "0s", "b": null, "c": "5s", "d": 0, "e": 7}),
            &mut r,
        );
        assert_eq!(o.duration("a", &mut r), None);
        assert_eq!(o.duration("b", &mut r), None);
        assert_eq!(o.duration("c", &mut r), Some(KubeDuration::from_secs(5)));
        assert_eq!(o.int("d", &mut r), None);
        assert_eq!(o.get::<i32>("e", &mut r), Some(7));
        o.finish(&mut r);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
    }

    #[test]
    fn every_problem_is_reported() {
        let mut r = Report::default();
        let mut o = Object::root(
            json!({"maxPods": "many", "x": 1, "period": 5, "nested": {"y": true, "known": 1}, "policy": "static"}),
            &mut r,
        );
        assert_eq!(o.get::<i32>("maxPods", &mut r), None);
        assert_eq!(o.duration("period", &mut r), None);
        let mut n = o.object("nested", &mut r);
        let _ = n.get::<i32>("known", &mut r);
        n.finish(&mut r);
        o.unimplemented("policy", Default::Str("none"), "no CPU manager", &mut r);
        o.finish(&mut r);
        let paths: Vec<_> = r.errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["maxPods", "period", "nested.y", "policy", "x"]);
        assert!(
            r.errors[3].reason.contains("\"static\""),
            "{:?}",
            r.errors[3]
        );
    }

    #[test]
    fn defaults_of_unimplemented_fields_are_listed() {
        let mut r = Report::default();
        let mut o = Object::root(
            json!({"a": "0s", "b": "20s", "c": "", "d": true, "e": [], "f": 0.9, "g": 5}),
            &mut r,
        );
        o.unimplemented(
            "a",
            Default::Duration(KubeDuration::from_secs(20)),
            "",
            &mut r,
        );
        o.unimplemented(
            "b",
            Default::Duration(KubeDuration::from_secs(20)),
            "",
            &mut r,
        );
        o.unimplemented("c", Default::Str("x"), "", &mut r);
        o.unimplemented("d", Default::Bool(true), "", &mut r);
        o.unimplemented("e", Default::Empty, "", &mut r);
        o.unimplemented("f", Default::Float(0.9), "", &mut r);
        o.unimplemented("g", Default::IntExact(5), "", &mut r);
        o.unimplemented("absent", Default::Empty, "", &mut r);
        o.finish(&mut r);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(r.ignored, ["a", "b", "c", "d", "e", "f", "g"]);
    }

    #[test]
    fn yaml_becomes_json() {
        let v = parse_yaml("a: 1\nb: [x]\nc: null\n").expect("yaml");
        assert_eq!(v, json!({"a": 1, "b": ["x"], "c": null}));
        assert_eq!(parse_yaml("").expect("empty"), json!({}));
        assert!(parse_yaml("a: [").is_err());
    }
}

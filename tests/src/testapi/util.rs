//! Small shared helpers: timestamps, generated names, query parsing.

use std::collections::HashMap;

use rand::Rng;

/// Now as an RFC 3339 timestamp with second precision (metav1.Time).
pub fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// `seconds` from now as an RFC 3339 timestamp.
pub fn rfc3339_in(seconds: i64) -> String {
    let t = jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::from_secs(seconds))
        .unwrap_or_else(|_| jiff::Timestamp::now());
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Seconds since the epoch of an RFC 3339 timestamp.
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    s.parse::<jiff::Timestamp>().ok().map(|t| t.as_second())
}

/// Unix seconds now.
pub fn unix_now() -> i64 {
    jiff::Timestamp::now().as_second()
}

/// The 5 random characters upstream appends to `generateName`.
pub fn random_suffix(n: usize) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..n)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// A fresh UID.
pub fn new_uid() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Decoded query parameters (last value wins).
pub type Query = HashMap<String, String>;

/// Parses a query string.
pub fn parse_query(q: Option<&str>) -> Query {
    let mut out = HashMap::new();
    let Some(q) = q else { return out };
    for pair in q.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        out.insert(decode(k), decode(v));
    }
    out
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b'%' if i + 2 < bytes.len() => {
                let hex = |c: u8| (c as char).to_digit(16);
                match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 3;
                    }
                    _ => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A boolean query flag (`true`/`1`).
pub fn flag(q: &Query, key: &str) -> Option<bool> {
    q.get(key).map(|v| v == "true" || v == "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_decoding() {
        let q = parse_query(Some(
            "labelSelector=app%3Dweb%2Ctier+in+%28a%29&watch=1&x=%",
        ));
        assert_eq!(
            q.get("labelSelector").map(String::as_str),
            Some("app=web,tier in (a)")
        );
        assert_eq!(flag(&q, "watch"), Some(true));
        assert_eq!(q.get("x").map(String::as_str), Some("%"));
        assert_eq!(random_suffix(5).len(), 5);
        assert!(parse_rfc3339(&now_rfc3339()).is_some());
    }
}

//! The strategic merge patch keelson computes between two objects
//! (common/src/strategic_patch.rs `two_way`), here between two arbitrary
//! JSON documents (the input split at its first NUL), with the merge keys
//! of a pod status' lists.
//! Holds: no panic; an object against itself gives the empty patch; the
//! patch between two objects is an object.
#![no_main]

use keelson_common::strategic_patch::two_way;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fn keys(path: &[&str]) -> Option<&'static str> {
    match path.last().copied() {
        Some("conditions") => Some("type"),
        Some("containerStatuses" | "initContainerStatuses" | "ephemeralContainerStatuses") => {
            Some("name")
        }
        Some("podIPs" | "hostIPs") => Some("ip"),
        _ => None,
    }
}

fuzz_target!(|data: &[u8]| {
    let (a, b) = match data.iter().position(|c| *c == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &b"{}"[..]),
    };
    let (Ok(a), Ok(b)) = (
        serde_json::from_slice::<Value>(a),
        serde_json::from_slice::<Value>(b),
    ) else {
        return;
    };
    let same = two_way(&a, &a, &keys);
    if a.is_object() {
        assert_eq!(
            same,
            Value::Object(Default::default()),
            "{a} against itself"
        );
    }
    let patch = two_way(&a, &b, &keys);
    if a.is_object() && b.is_object() {
        assert!(patch.is_object());
    }
    let _ = two_way(&b, &a, &keys);
});

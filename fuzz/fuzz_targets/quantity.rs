//! Resource quantities (common/src/quantity.rs `Quantity::parse`), as they
//! come in pod specs, node allocatable and eviction thresholds.
//! Holds: no panic; a parsed quantity prints to text that parses back to
//! the same quantity, and its CPU and byte forms parse too.
#![no_main]

use keelson_common::quantity::Quantity;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(q) = Quantity::parse(text) else {
        return;
    };
    let printed = q.to_string();
    assert_eq!(
        Quantity::parse(&printed).ok(),
        Some(q),
        "{text:?} printed as {printed:?}"
    );
    let cpu = q.to_cpu_string();
    assert!(
        Quantity::parse(&cpu).is_ok(),
        "cpu form {cpu:?} of {text:?}"
    );
    let bytes = q.to_bytes_string();
    assert!(
        Quantity::parse(&bytes).is_ok(),
        "bytes form {bytes:?} of {text:?}"
    );
    let _ = (q.value(), q.milli_value(), q.value_u64());
});

//! Go duration text (common/src/duration.rs `KubeDuration::parse`), as in
//! config files (KubeletConfiguration, KubeProxyConfiguration, keelson's).
//! Holds: no panic; a parsed duration prints as Go prints it, and that
//! text parses back to the same duration.
#![no_main]

use keelson_common::duration::KubeDuration;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(d) = KubeDuration::parse(text) else {
        return;
    };
    let printed = d.to_string();
    let back = KubeDuration::parse(&printed)
        .unwrap_or_else(|e| panic!("{text:?} printed as {printed:?}, which does not parse: {e}"));
    assert_eq!(back.get(), d.get(), "{text:?} printed as {printed:?}");
});

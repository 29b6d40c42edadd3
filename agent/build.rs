//! Lays the proxy role's code out together in the release binary.
//!
//! `link/proxy-text-order.txt` lists the functions `run --proxy-only` runs
//! (from a profile: scripts/rss/text-order). LLD places them first in
//! `.text`, so the pages the proxy faults in hold its own code and little
//! else: a fault maps a whole page-cache folio, up to 2 MiB, and without an
//! order the proxy's code is spread over the whole binary (docs/benchmarks.md,
//! "Which text is resident" and "Laying the proxy's code out together").
//!
//! Only for release builds of x86_64-unknown-linux-gnu, whose default
//! linker is LLD (`--symbol-ordering-file` is an LLD option).
//! `KEELSON_TEXT_ORDER=0` builds without it.

use std::env;

fn main() {
    let list = "link/proxy-text-order.txt";
    println!("cargo:rerun-if-changed={list}");
    println!("cargo:rerun-if-env-changed=KEELSON_TEXT_ORDER");
    let release = env::var("PROFILE").is_ok_and(|p| p == "release");
    let gnu = env::var("TARGET").is_ok_and(|t| t == "x86_64-unknown-linux-gnu");
    let off = env::var("KEELSON_TEXT_ORDER").is_ok_and(|v| v == "0");
    if !release || !gnu || off {
        return;
    }
    let Ok(dir) = env::var("CARGO_MANIFEST_DIR") else {
        return;
    };
    let path = std::path::Path::new(&dir).join(list);
    if !path.exists() {
        println!(
            "cargo:warning=no {}: the proxy's text is not ordered",
            path.display()
        );
        return;
    }
    println!(
        "cargo:rustc-link-arg-bin=keelson=-Wl,--symbol-ordering-file={}",
        path.display()
    );
    println!("cargo:rustc-link-arg-bin=keelson=-Wl,--no-warn-symbol-ordering");
}

//! The linker driver behind the release binary's text order
//! (agent/link/cc-text-order, .cargo/config.toml): it resolves an ordering
//! list written in demangled, hash-free names against the binary it links,
//! and LLD (the toolchain's own, as rustc uses it) then places those
//! functions first, in the list's order. Checked on a small C program
//! whose symbols carry a v0-mangled name with a crate hash and a ThinLTO
//! `.llvm.<n>` suffix, as Rust's do.

use keelson_tests::support::repo_root as root;
use std::path::{Path, PathBuf};
use std::process::Command;

const PROGRAM: &str = r#"
__attribute__((noinline)) int cold_one(int x) { return x * 3 + 1; }
__attribute__((noinline)) int cold_two(int x) { return x * 5 + 2; }
__attribute__((noinline)) int hot_rust(int x) __asm__("_RNvCs1a2b3_5hello3hot.llvm.4242");
__attribute__((noinline)) int hot_rust(int x) { return x * 7 + 3; }
__attribute__((noinline)) int hot_c(int x) { return x * 11 + 4; }
int main(int argc, char **argv) {
    (void)argv;
    return cold_one(argc) + cold_two(argc) + hot_rust(argc) + hot_c(argc) > 0 ? 0 : 1;
}
"#;

const HOT_RUST: &str = "_RNvCs1a2b3_5hello3hot.llvm.4242";

/// The directory holding the toolchain's `ld.lld` for `cc -fuse-ld=lld`.
fn gcc_ld_dir() -> PathBuf {
    let out = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
        .args(["--print", "sysroot"])
        .output()
        .expect("rustc --print sysroot");
    assert!(out.status.success(), "rustc --print sysroot failed");
    let sysroot = String::from_utf8_lossy(&out.stdout).trim().to_string();
    PathBuf::from(sysroot).join("lib/rustlib/x86_64-unknown-linux-gnu/bin/gcc-ld")
}

/// Links PROGRAM through the driver, with `extra` arguments; returns the
/// text symbols of the result in address order.
fn link(dir: &Path, name: &str, extra: &[String]) -> Vec<String> {
    let src = dir.join("program.c");
    std::fs::write(&src, PROGRAM).expect("write program");
    let out = dir.join(name);
    let status = Command::new(root().join("agent/link/cc-text-order"))
        .arg(format!("-B{}", gcc_ld_dir().display()))
        .args(["-fuse-ld=lld", "-O0", "-ffunction-sections", "-o"])
        .arg(&out)
        .arg(&src)
        .args(extra)
        .status()
        .expect("run cc-text-order");
    assert!(status.success(), "cc-text-order failed: {status}");
    let nm = Command::new("nm")
        .args(["-n", "--defined-only"])
        .arg(&out)
        .output()
        .expect("nm");
    String::from_utf8_lossy(&nm.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && matches!(f[1], "t" | "T")).then(|| f[2].to_string())
        })
        .filter(|n| [HOT_RUST, "hot_c", "cold_one", "cold_two"].contains(&n.as_str()))
        .collect()
}

#[test]
fn listed_functions_are_placed_first_in_the_lists_order() {
    if cfg!(not(all(
        target_arch = "x86_64",
        target_os = "linux",
        target_env = "gnu"
    ))) {
        eprintln!("skipped: the text order is for x86_64-unknown-linux-gnu only");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");

    // Without a list: source order, the cold functions first.
    let plain = link(dir.path(), "plain", &[]);
    assert_eq!(plain, ["cold_one", "cold_two", HOT_RUST, "hot_c"]);
    assert!(!dir.path().join("plain.text-order").exists());

    // With one: the list names the Rust symbol as it demangles, without
    // its crate hash and ThinLTO suffix, and the C one as it is.
    let list = dir.path().join("order.txt");
    std::fs::write(
        &list,
        "# a comment\n\nhot_c\nhello::hot\nnot_in_the_binary\n",
    )
    .expect("write list");
    let ordered = link(
        dir.path(),
        "ordered",
        &[format!("-Wl,--symbol-ordering-file={}", list.display())],
    );
    assert_eq!(ordered, ["hot_c", HOT_RUST, "cold_one", "cold_two"]);
    let resolved = std::fs::read_to_string(dir.path().join("ordered.text-order"))
        .expect("the resolved list beside the binary");
    assert_eq!(resolved, format!("hot_c\n{HOT_RUST}\n"));
}

//! Builds keelson's eBPF programs (`ebpf/src/*.c`) for the bpf target with
//! clang and leaves the objects in `OUT_DIR`, from where
//! `netplane/src/ebpf/object.rs` embeds them with `include_bytes!`.
//! Built objects are never committed.
//!
//! Needs clang (any version with the bpf target, Debian's clang-14 works)
//! and libbpf's headers (`bpf/bpf_helpers.h`, Debian package libbpf-dev)
//! plus the kernel UAPI headers (linux-libc-dev). `KEELSON_CLANG` overrides
//! the compiler binary.

use std::env;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::Command;

const PROGRAMS: &[&str] = &["sock_lb"];
const HEADERS: &[&str] = &["sock_lb.h"];
const PACKAGES_HINT: &str = "on Debian/Ubuntu: apt-get install clang libbpf-dev linux-libc-dev";

fn main() {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let src_dir = manifest_dir.join("..").join("ebpf").join("src");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").unwrap_or_default());
    let clang = env::var("KEELSON_CLANG").unwrap_or_else(|_| "clang".to_string());
    println!("cargo:rerun-if-env-changed=KEELSON_CLANG");
    for header in HEADERS {
        println!("cargo:rerun-if-changed={}", src_dir.join(header).display());
    }
    let arch_include = multiarch_include();
    for program in PROGRAMS {
        let source = src_dir.join(format!("{program}.c"));
        println!("cargo:rerun-if-changed={}", source.display());
        let object = out_dir.join(format!("{program}.o"));
        compile(&clang, &source, &src_dir, arch_include.as_deref(), &object);
    }
}

/// `/usr/include/<multiarch>` holds `asm/types.h`, which `linux/bpf.h`
/// includes; with `-target bpf` clang does not look there by itself.
fn multiarch_include() -> Option<PathBuf> {
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let triple = match arch.as_str() {
        "x86_64" => "x86_64-linux-gnu",
        "aarch64" => "aarch64-linux-gnu",
        "arm" => "arm-linux-gnueabihf",
        "riscv64" => "riscv64-linux-gnu",
        "powerpc64" => "powerpc64le-linux-gnu",
        "s390x" => "s390x-linux-gnu",
        "loongarch64" => "loongarch64-linux-gnu",
        _ => return None,
    };
    let dir = Path::new("/usr/include").join(triple);
    dir.is_dir().then_some(dir)
}

fn compile(clang: &str, source: &Path, include: &Path, arch_include: Option<&Path>, object: &Path) {
    let mut cmd = Command::new(clang);
    cmd.args(["-O2", "-g", "-Wall", "-Werror", "-target", "bpf"])
        .arg("-I")
        .arg(include);
    if let Some(dir) = arch_include {
        cmd.arg("-I").arg(dir);
    }
    cmd.arg("-c").arg(source).arg("-o").arg(object);
    let output = match cmd.output() {
        Ok(output) => output,
        Err(e) if e.kind() == ErrorKind::NotFound => fail(&format!(
            "`{clang}` was not found. Building keelson's eBPF programs ({}) needs clang with \
             the bpf target and libbpf's headers ({PACKAGES_HINT}); set KEELSON_CLANG to use \
             another clang binary.",
            source.display()
        )),
        Err(e) => fail(&format!("running `{clang}`: {e}")),
    };
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let hint = if stderr.contains("bpf/bpf_helpers.h") {
            format!("\nlibbpf's headers are missing ({PACKAGES_HINT})")
        } else if stderr.contains("asm/types.h") || stderr.contains("linux/bpf.h") {
            format!("\nthe kernel UAPI headers are missing ({PACKAGES_HINT})")
        } else if stderr.contains("No available targets") || stderr.contains("unknown target") {
            format!("\n`{clang}` has no bpf target; install LLVM's clang ({PACKAGES_HINT})")
        } else {
            String::new()
        };
        fail(&format!(
            "compiling the eBPF program {} failed:\n{stderr}{hint}",
            source.display()
        ));
    }
}

/// Stops the build with `message` (no panic backtrace).
fn fail(message: &str) -> ! {
    eprintln!("\nkeelson-netplane: {message}\n");
    std::process::exit(1)
}

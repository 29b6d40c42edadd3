//! Installing what the harness needs from Debian's packages, once per
//! process and only when something is missing (apt-get is idempotent, but
//! slow and needs the network).

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// (Debian package, a file it installs).
const NEEDED: &[(&str, &str)] = &[
    ("containerd", "/usr/bin/containerd"),
    ("containerd", "/usr/bin/ctr"),
    ("runc", "/usr/sbin/runc"),
    ("containernetworking-plugins", "/usr/lib/cni/bridge"),
    ("containernetworking-plugins", "/usr/lib/cni/host-local"),
    ("containernetworking-plugins", "/usr/lib/cni/loopback"),
    ("busybox-static", "/bin/busybox"),
    ("gcc", "/usr/bin/gcc"),
    ("libc6-dev", "/usr/include/stdio.h"),
    ("iproute2", "/usr/sbin/ip"),
    ("util-linux", "/usr/bin/nsenter"),
];

fn apt_get(args: &[&str]) -> Result<(), String> {
    let out = Command::new("apt-get")
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("spawning apt-get: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "apt-get {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn install_missing() -> Result<(), String> {
    let mut missing: Vec<&str> = NEEDED
        .iter()
        .filter(|(_, file)| !Path::new(file).exists())
        .map(|(pkg, _)| *pkg)
        .collect();
    missing.dedup();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("installing Debian packages for the containerd harness: {missing:?}");
    let mut args = vec!["install", "-y", "--no-install-recommends"];
    args.extend(&missing);
    if apt_get(&args).is_err() {
        // The package lists may be absent or stale on a fresh machine.
        apt_get(&["update"])?;
        apt_get(&args)?;
    }
    Ok(())
}

/// Makes sure containerd, runc, the CNI plugins, busybox-static and a C
/// compiler are installed; installs the missing ones with apt-get.
pub fn ensure_installed() -> Result<(), String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(install_missing).clone()
}

//! Container images for system tests, built locally (no registry is ever
//! contacted) and imported into a private containerd.
//!
//! - [`PAUSE_IMAGE`] (`keelson.local/pause:3.10`): our own static pause
//!   process ([`pause.c`](./pause.c), compiled with `gcc -static`), which
//!   reaps children and exits 0 on SIGTERM/SIGINT; the sandbox image.
//! - [`BUSYBOX_IMAGE`] (`keelson.local/busybox:1`): Debian's static busybox
//!   with a symlink for every applet, `/etc/passwd`, `/tmp` and `/www`
//!   (with an `index.html`), `Cmd ["sh"]`; so `httpd -f -p 80 -h /www` and
//!   `sh -c '...'` work.
//!
//! The images of Kubernetes' e2e suite, under their upstream names, are
//! built by [`e2e`] from the same pieces ([`rootfs`] copies Debian binaries
//! with their libraries and Debian packages into a layer).
//!
//! Images are written as OCI image-layout archives by a small builder of
//! ours ([`oci`]) and imported with `ctr images import` into containerd's
//! `k8s.io` namespace (where the CRI plugin looks), see [`import`].

pub mod e2e;
pub mod oci;
pub mod rootfs;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub use oci::{ImageConfig, LayerBuilder, write_archive, write_image};

/// The pause (sandbox) image name.
pub const PAUSE_IMAGE: &str = "keelson.local/pause:3.10";
/// The busybox image name.
pub const BUSYBOX_IMAGE: &str = "keelson.local/busybox:1";
/// Where Debian's busybox-static puts its binary.
pub const HOST_BUSYBOX: &str = "/bin/busybox";

const PAUSE_C: &str = include_str!("pause.c");
const PATH_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// What went wrong building or importing an image.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// A file operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What we were doing.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A tool (gcc, busybox, ctr) failed.
    #[error("`{cmd}` failed: {output}")]
    Command {
        /// The command line.
        cmd: String,
        /// Its stderr (and stdout).
        output: String,
    },
    /// A file an image needs is not on this host.
    #[error("{path} is missing: {hint}")]
    Missing {
        /// The host path looked for.
        path: PathBuf,
        /// Where it comes from (a Debian package, the shared binaries).
        hint: String,
    },
    /// A layer entry could not be added as asked (a path twice, a file
    /// under a non-directory, an unsupported file type).
    #[error("layer: {0}")]
    Layer(String),
    /// A tool's output or an input file was not what was expected.
    #[error("unexpected input: {0}")]
    Input(String),
}

/// An image archive ready to import.
#[derive(Debug, Clone)]
pub struct BuiltImage {
    /// The image name (`keelson.local/...`).
    pub name: String,
    /// The OCI archive.
    pub archive: PathBuf,
    /// Digest of its manifest.
    pub manifest_digest: String,
}

/// Runs `cmd` to completion (stdin closed); its stdout, or
/// [`ImageError::Command`] with its output when it fails.
pub fn run(cmd: &mut Command) -> Result<String, ImageError> {
    let shown = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| ImageError::Io {
            context: format!("spawning {shown}"),
            source,
        })?;
    if !out.status.success() {
        return Err(ImageError::Command {
            cmd: shown,
            output: format!(
                "{} {}",
                String::from_utf8_lossy(&out.stderr).trim(),
                String::from_utf8_lossy(&out.stdout).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Compiles the pause process with `gcc -static` into `dir` and packs the
/// pause image archive there.
pub fn build_pause(dir: &Path) -> Result<BuiltImage, ImageError> {
    let src = dir.join("pause.c");
    let bin = dir.join("pause");
    std::fs::write(&src, PAUSE_C).map_err(|source| ImageError::Io {
        context: format!("writing {}", src.display()),
        source,
    })?;
    run(Command::new("gcc")
        .args(["-static", "-Os", "-Wall", "-Werror", "-o"])
        .arg(&bin)
        .arg(&src))?;
    let mut layer = LayerBuilder::new();
    layer.host_file("pause", 0o755, &bin)?;
    let config = ImageConfig {
        entrypoint: vec!["/pause".into()],
        env: vec![PATH_ENV.into()],
        working_dir: "/".into(),
        user: "65535:65535".into(),
        ..Default::default()
    };
    let archive = dir.join("pause.tar");
    let manifest_digest = write_archive(PAUSE_IMAGE, layer.finish()?, &config, &archive)?;
    Ok(BuiltImage {
        name: PAUSE_IMAGE.into(),
        archive,
        manifest_digest,
    })
}

/// Packs the busybox image archive into `dir` from the host's static busybox.
pub fn build_busybox(dir: &Path) -> Result<BuiltImage, ImageError> {
    let applets = run(Command::new(HOST_BUSYBOX).arg("--list-full"))?;
    let mut layer = LayerBuilder::new();
    for (d, mode) in [
        ("bin", 0o755),
        ("sbin", 0o755),
        ("usr", 0o755),
        ("usr/bin", 0o755),
        ("usr/sbin", 0o755),
        ("etc", 0o755),
        ("dev", 0o755),
        ("proc", 0o555),
        ("sys", 0o555),
        ("run", 0o755),
        ("var", 0o755),
        ("root", 0o700),
        ("home", 0o755),
        ("www", 0o755),
        ("tmp", 0o1777),
    ] {
        layer.dir(d, mode)?;
    }
    layer.host_file("bin/busybox", 0o755, Path::new(HOST_BUSYBOX))?;
    for applet in applets.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if applet == "bin/busybox" {
            continue;
        }
        layer.symlink(applet, "/bin/busybox")?;
    }
    layer.file(
        "etc/passwd",
        0o644,
        b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n",
    )?;
    layer.file("etc/group", 0o644, b"root:x:0:\nnogroup:x:65534:\n")?;
    layer.file("www/index.html", 0o644, b"keelson busybox\n")?;
    let config = ImageConfig {
        cmd: vec!["sh".into()],
        env: vec![PATH_ENV.into()],
        working_dir: "/".into(),
        ..Default::default()
    };
    let archive = dir.join("busybox.tar");
    let manifest_digest = write_archive(BUSYBOX_IMAGE, layer.finish()?, &config, &archive)?;
    Ok(BuiltImage {
        name: BUSYBOX_IMAGE.into(),
        archive,
        manifest_digest,
    })
}

/// Builds every test image into `dir`.
pub fn build_all(dir: &Path) -> Result<Vec<BuiltImage>, ImageError> {
    Ok(vec![build_pause(dir)?, build_busybox(dir)?])
}

/// Imports an OCI archive into the `k8s.io` namespace of the containerd
/// listening on `socket`, unpacked for its default snapshotter, so CRI sees
/// it at once.
///
/// Why `ctr` and not containerd-client: containerd has no import RPC; an
/// import is client-side work (write each blob through the content service
/// under a lease, create the image record, unpack into the snapshotter).
/// `ctr` ships with every containerd package, does exactly that, and is
/// what operators use, so the harness does not carry a second copy of that
/// logic.
pub fn import(archive: &Path, socket: &Path) -> Result<(), ImageError> {
    run(Command::new("ctr")
        .arg("--address")
        .arg(socket)
        .args(["--namespace", "k8s.io", "images", "import"])
        .arg(archive))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busybox_image_has_applets_and_www() {
        if !Path::new(HOST_BUSYBOX).exists() {
            crate::support::skip(
                "busybox_image_has_applets_and_www",
                &format!("{HOST_BUSYBOX} is not installed (Debian package busybox-static)"),
            );
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let img = build_busybox(dir.path()).expect("build");
        let listing = run(Command::new("tar")
            .arg("-xOf")
            .arg(&img.archive)
            .arg("index.json"))
        .expect("index");
        assert!(listing.contains(BUSYBOX_IMAGE), "{listing}");
        assert!(img.manifest_digest.starts_with("sha256:"));
    }
}

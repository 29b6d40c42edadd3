//! Root filesystems assembled from this host's files: a Debian binary with
//! the shared libraries `ldd` finds for it, a whole Debian package (the
//! files `dpkg -L` lists), a static busybox with its applets, all written
//! into one [`LayerBuilder`].
//!
//! Two layouts ([`Layout`]): [`Layout::Split`] keeps each host path as it
//! is (`/bin/ip` stays in `/bin`, libraries in `/lib/x86_64-linux-gnu`), as
//! in an Alpine-based image whose tools come from Debian here;
//! [`Layout::MergedUsr`] makes `/bin`, `/sbin`, `/lib` and `/lib64`
//! symlinks into `/usr` and moves every path there, as a Debian bookworm
//! image is laid out.

use std::collections::{BTreeSet, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{ImageError, LayerBuilder, run};

/// The directories an image's `PATH` searches, most preferred first.
pub const PATH_DIRS: [&str; 6] = [
    "usr/local/sbin",
    "usr/local/bin",
    "usr/sbin",
    "usr/bin",
    "sbin",
    "bin",
];

/// Parts of Debian packages an image never needs (documentation,
/// translations, service units and shell completions).
const SKIPPED_PACKAGE_PATHS: [&str; 16] = [
    "/usr/share/doc",
    "/usr/share/doc-base",
    "/usr/share/man",
    "/usr/share/info",
    "/usr/share/locale",
    "/usr/share/lintian",
    "/usr/share/bash-completion",
    "/usr/share/zsh",
    "/usr/share/fish",
    "/usr/share/bug",
    "/usr/share/menu",
    "/usr/share/apport",
    "/etc/init.d",
    "/etc/ufw",
    "/lib/systemd",
    "/usr/lib/systemd",
];

/// How host paths map into the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Every path as on the host (the image's `/bin` and `/usr/bin` are
    /// separate directories).
    Split,
    /// `/bin`, `/sbin`, `/lib`, `/lib64` are symlinks into `/usr`.
    MergedUsr,
}

/// The top-level directories [`Layout::MergedUsr`] moves into `/usr`.
const MERGED: [&str; 4] = ["bin", "sbin", "lib", "lib64"];

/// A root filesystem being assembled from host files.
pub struct RootFs {
    layer: LayerBuilder,
    layout: Layout,
    /// `ldd` answers per host path.
    libs: HashMap<PathBuf, Vec<PathBuf>>,
}

impl RootFs {
    /// An empty root filesystem; with [`Layout::MergedUsr`] it starts with
    /// the `/bin` → `usr/bin` (etc.) symlinks.
    pub fn new(layout: Layout) -> Result<RootFs, ImageError> {
        let mut layer = LayerBuilder::new();
        if layout == Layout::MergedUsr {
            for d in MERGED {
                layer.dir(&format!("usr/{d}"), 0o755)?;
                layer.symlink(d, &format!("usr/{d}"))?;
            }
        }
        Ok(RootFs {
            layer,
            layout,
            libs: HashMap::new(),
        })
    }

    /// The layer, for entries of the image's own (config files, users).
    pub fn layer(&mut self) -> &mut LayerBuilder {
        &mut self.layer
    }

    /// Where host path `host` goes in the image (relative to `/`).
    pub fn place(&self, host: &str) -> String {
        let rel = host.trim_start_matches('/');
        if self.layout == Layout::MergedUsr {
            for d in MERGED {
                if rel == d || rel.starts_with(&format!("{d}/")) {
                    return format!("usr/{rel}");
                }
            }
        }
        rel.to_string()
    }

    /// Whether a command named `name` is already in one of [`PATH_DIRS`].
    pub fn provides(&self, name: &str) -> bool {
        PATH_DIRS
            .iter()
            .any(|d| self.layer.contains(&self.place(&format!("/{d}/{name}"))))
    }

    /// Copies host executable `source` (symlinks followed) to `dest` in the
    /// image, mode 0755, with the shared libraries it needs.
    pub fn host_binary(&mut self, dest: &str, source: &Path) -> Result<&mut Self, ImageError> {
        let meta = std::fs::metadata(source).map_err(|_| missing(source))?;
        self.layer.host_file(dest, meta.mode() & 0o7777, source)?;
        self.shared_libraries(source)?;
        Ok(self)
    }

    /// Copies each host executable to its own path (placed per the
    /// layout), with its libraries. `(path, Debian package)`: the package
    /// is named when the file is missing.
    pub fn host_binaries(&mut self, binaries: &[(&str, &str)]) -> Result<&mut Self, ImageError> {
        for (path, package) in binaries {
            let source = Path::new(path);
            if !source.exists() {
                return Err(ImageError::Missing {
                    path: source.to_path_buf(),
                    hint: format!("Debian package {package} (scripts/install-deps installs it)"),
                });
            }
            let dest = self.place(path);
            self.host_binary(&dest, source)?;
        }
        Ok(self)
    }

    /// Adds the shared libraries of host file `elf` (none for a static
    /// binary or a non-ELF file), each at the path `ldd` reports, placed
    /// per the layout; the dynamic loader too.
    pub fn shared_libraries(&mut self, elf: &Path) -> Result<&mut Self, ImageError> {
        for lib in self.ldd(elf)? {
            let dest = self.place(&lib.to_string_lossy());
            if !self.layer.contains(&dest) {
                self.layer.host_file(&dest, 0o755, &lib)?;
            }
        }
        Ok(self)
    }

    fn ldd(&mut self, elf: &Path) -> Result<Vec<PathBuf>, ImageError> {
        if let Some(libs) = self.libs.get(elf) {
            return Ok(libs.clone());
        }
        let libs = if is_elf(elf)? {
            shared_objects(elf)?
        } else {
            Vec::new()
        };
        self.libs.insert(elf.to_path_buf(), libs.clone());
        Ok(libs)
    }

    /// Copies the installed Debian package `package`: its directories,
    /// files (with their modes, setuid bits included) and symlinks as
    /// `dpkg -L` lists them, placed per the layout, without documentation
    /// and service files ([`SKIPPED_PACKAGE_PATHS`]), and the libraries of
    /// its ELF files. A link into `/etc/alternatives` points at the
    /// alternative's current choice. Paths already in the image are kept.
    pub fn debian_package(&mut self, package: &str) -> Result<&mut Self, ImageError> {
        let listing = run(Command::new("dpkg-query").args(["-L", package])).map_err(|e| {
            ImageError::Missing {
                path: PathBuf::from(format!("/var/lib/dpkg/info/{package}.list")),
                hint: format!(
                    "Debian package {package} is not installed (scripts/install-deps installs it): {e}"
                ),
            }
        })?;
        for line in listing.lines() {
            // Also "package diverts others to: ..." lines.
            if !line.starts_with('/') || line == "/." {
                continue;
            }
            if SKIPPED_PACKAGE_PATHS
                .iter()
                .any(|p| line == *p || line.starts_with(&format!("{p}/")))
            {
                continue;
            }
            let host = Path::new(line);
            let dest = self.place(line);
            if dest.is_empty() || self.layer.contains(&dest) {
                continue;
            }
            // A conffile the admin removed is not an error.
            let Ok(meta) = std::fs::symlink_metadata(host) else {
                continue;
            };
            // Directories are followed: on a merged-/usr host `/bin` is a
            // link, in the package it is a directory.
            if meta.is_dir() || (meta.file_type().is_symlink() && host.is_dir()) {
                let mode = std::fs::metadata(host).map_or(0o755, |m| m.mode() & 0o7777);
                self.layer.dir(&dest, mode)?;
            } else if meta.file_type().is_symlink() {
                let target = std::fs::read_link(host).map_err(|source| ImageError::Io {
                    context: format!("reading link {line}"),
                    source,
                })?;
                let target = if target.starts_with("/etc/alternatives") {
                    let chosen = std::fs::canonicalize(host).map_err(|_| missing(host))?;
                    format!("/{}", self.place(&chosen.to_string_lossy()))
                } else {
                    target.to_string_lossy().into_owned()
                };
                self.layer.symlink(&dest, &target)?;
            } else if meta.is_file() {
                self.layer.host_file(&dest, meta.mode() & 0o7777, host)?;
                self.shared_libraries(host)?;
            }
        }
        Ok(self)
    }

    /// Installs static busybox `source` as `/bin/busybox` and a symlink to
    /// it for each applet, at the path `busybox --list-full` gives (as
    /// Alpine lays them out) or, with `all_in` (`"/bin"`), all in that
    /// directory (as the official busybox image), placed per the layout;
    /// except where a command of that name is already in the image (so
    /// Debian's `nc`, `ip`, ... are not shadowed by an applet earlier in
    /// `PATH`). Add the other binaries first.
    pub fn busybox(
        &mut self,
        source: &Path,
        all_in: Option<&str>,
    ) -> Result<&mut Self, ImageError> {
        if !source.exists() {
            return Err(missing(source));
        }
        let applets = run(Command::new(source).arg("--list-full"))?;
        let dest = self.place("/bin/busybox");
        self.layer.host_file(&dest, 0o755, source)?;
        for applet in applets.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let name = applet.rsplit('/').next().unwrap_or(applet);
            if name == "busybox" || self.provides(name) {
                continue;
            }
            let path = match all_in {
                Some(dir) => self.place(&format!("{}/{name}", dir.trim_end_matches('/'))),
                None => self.place(&format!("/{applet}")),
            };
            self.layer.symlink(&path, "/bin/busybox")?;
        }
        Ok(self)
    }

    /// The finished layer tar.
    pub fn finish(self) -> Result<Vec<u8>, ImageError> {
        self.layer.finish()
    }
}

fn missing(path: &Path) -> ImageError {
    ImageError::Missing {
        path: path.to_path_buf(),
        hint: "not on this host".into(),
    }
}

fn is_elf(path: &Path) -> Result<bool, ImageError> {
    use std::io::Read;
    let mut magic = [0u8; 4];
    let mut file = std::fs::File::open(path).map_err(|source| ImageError::Io {
        context: format!("opening {}", path.display()),
        source,
    })?;
    Ok(file.read_exact(&mut magic).is_ok() && magic == *b"\x7fELF")
}

/// The shared objects `ldd` lists for ELF file `elf` (the dynamic loader
/// included, the vDSO left out); empty for a static binary.
pub fn shared_objects(elf: &Path) -> Result<Vec<PathBuf>, ImageError> {
    let out = Command::new("ldd")
        .arg(elf)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| ImageError::Io {
            context: "spawning ldd (Debian package libc-bin)".into(),
            source,
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        // glibc's ldd says so for static executables (exit status 1).
        if stdout.contains("not a dynamic executable")
            || stderr.contains("not a dynamic executable")
        {
            return Ok(Vec::new());
        }
        return Err(ImageError::Command {
            cmd: format!("ldd {}", elf.display()),
            output: format!("{} {}", stderr.trim(), stdout.trim()),
        });
    }
    parse_ldd(&stdout).map_err(|line| {
        ImageError::Input(format!(
            "ldd {}: a library is not found: {line}",
            elf.display()
        ))
    })
}

/// The library paths in `ldd` output; `Err(line)` for a library it did
/// not find.
fn parse_ldd(output: &str) -> Result<Vec<PathBuf>, String> {
    let mut libs = BTreeSet::new();
    for line in output.lines().map(str::trim) {
        if line.contains("=> not found") {
            return Err(line.to_string());
        }
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
        // "/lib64/ld-linux-x86-64.so.2 (0x...)"; "linux-vdso.so.1 (0x...)"
        // and "statically linked" have no path.
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.trim(),
            None => line,
        };
        let path = path.split(" (").next().unwrap_or("").trim();
        if path.starts_with('/') {
            libs.insert(PathBuf::from(path));
        }
    }
    Ok(libs.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_is_parsed() {
        let out = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                   \tlibz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x00007f)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        assert_eq!(
            parse_ldd(out).expect("parsed"),
            vec![
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib/x86_64-linux-gnu/libz.so.1"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
        assert!(parse_ldd("\tlibfoo.so.1 => not found\n").is_err());
        assert_eq!(parse_ldd("\tstatically linked\n"), Ok(Vec::new()));
    }

    #[test]
    fn merged_usr_places_paths_under_usr() {
        let fs = RootFs::new(Layout::MergedUsr).expect("rootfs");
        assert_eq!(fs.place("/bin/dash"), "usr/bin/dash");
        assert_eq!(
            fs.place("/lib64/ld-linux-x86-64.so.2"),
            "usr/lib64/ld-linux-x86-64.so.2"
        );
        assert_eq!(fs.place("/usr/bin/dig"), "usr/bin/dig");
        assert_eq!(fs.place("/library/x"), "library/x");
        assert_eq!(fs.place("/etc/passwd"), "etc/passwd");
        let split = RootFs::new(Layout::Split).expect("rootfs");
        assert_eq!(split.place("/bin/dash"), "bin/dash");
    }

    #[test]
    fn a_binary_comes_with_its_libraries() {
        let sh = Path::new("/bin/dash");
        if !sh.exists() {
            crate::support::skip("a_binary_comes_with_its_libraries", "no /bin/dash here");
            return;
        }
        let mut fs = RootFs::new(Layout::MergedUsr).expect("rootfs");
        fs.host_binaries(&[("/bin/dash", "dash")]).expect("dash");
        assert!(fs.provides("dash"));
        assert!(fs.layer().contains("usr/bin/dash"));
        assert!(
            fs.layer().contains("usr/lib/x86_64-linux-gnu/libc.so.6")
                || std::env::consts::ARCH != "x86_64"
        );
        fs.finish().expect("layer");
    }
}

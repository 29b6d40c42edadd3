//! The backup `--apply` writes before it changes anything, and that
//! `--rollback` restores from: a manifest (JSON) with the units' states, the
//! label it set and every file it read or may write, plus a byte-for-byte
//! copy of each file that existed (symbolic links are kept as links).
//! The manifest is written last, atomically: a backup without one is
//! incomplete and is made again.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::host::{Host, UnitState, write_atomically};
use super::{MigrateError, layout};

/// The manifest's file name in the backup directory.
pub const MANIFEST: &str = "manifest.json";

/// What a file was before the migration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Original {
    /// There was no file: a rollback removes what is there.
    Absent,
    /// A regular file, copied to `copy` (relative to the backup directory).
    File {
        /// Permission bits.
        mode: u32,
        /// The copy.
        copy: String,
    },
    /// A symbolic link (kubelet's `-current.pem`).
    Symlink {
        /// Its target, as written in the link.
        target: PathBuf,
    },
}

/// One file of the backup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRecord {
    /// The host path.
    pub path: PathBuf,
    /// What it was.
    pub original: Original,
}

/// The backup's manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// When the backup was made (RFC 3339).
    pub created: String,
    /// The Node's name.
    pub node_name: String,
    /// Units and their states before the migration.
    pub units: BTreeMap<String, UnitState>,
    /// Files and what they were.
    pub files: Vec<FileRecord>,
    /// The node label `--apply` sets (`key=value`), recorded before it is
    /// set; a rollback removes it.
    pub node_label: Option<String>,
}

fn copy_name(path: &Path) -> String {
    format!("files/{}", path.to_string_lossy().trim_start_matches('/'))
}

/// Where the backup lives on `host`.
pub fn dir(host: &Host) -> PathBuf {
    host.path(layout::BACKUP_DIR)
}

/// Whether a complete backup (a manifest) exists.
pub fn exists(host: &Host) -> bool {
    dir(host).join(MANIFEST).exists()
}

/// Records `paths` (copies the existing ones) and writes the manifest.
pub fn write(
    host: &Host,
    node_name: &str,
    units: BTreeMap<String, UnitState>,
    paths: &[&str],
    node_label: Option<String>,
) -> Result<Manifest, MigrateError> {
    let dir = dir(host);
    if dir.join(MANIFEST).exists() {
        return Err(MigrateError::AlreadyApplied(layout::BACKUP_DIR.to_string()));
    }
    // An incomplete earlier attempt (no manifest): start again.
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| MigrateError::io(&dir, e))?;
    }
    std::fs::create_dir_all(&dir).map_err(|e| MigrateError::io(&dir, e))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| MigrateError::io(&dir, e))?;
    let mut files = Vec::new();
    for p in paths {
        let path = PathBuf::from(p);
        let real = host.path(&path);
        let original = match std::fs::symlink_metadata(&real) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Original::Absent,
            Err(e) => return Err(MigrateError::io(&path, e)),
            Ok(md) if md.file_type().is_symlink() => Original::Symlink {
                target: std::fs::read_link(&real).map_err(|e| MigrateError::io(&path, e))?,
            },
            Ok(md) => {
                let copy = copy_name(&path);
                let dst = dir.join(&copy);
                if let Some(d) = dst.parent() {
                    std::fs::create_dir_all(d).map_err(|e| MigrateError::io(d, e))?;
                }
                std::fs::copy(&real, &dst).map_err(|e| MigrateError::io(&path, e))?;
                Original::File {
                    mode: md.permissions().mode() & 0o7777,
                    copy,
                }
            }
        };
        files.push(FileRecord { path, original });
    }
    let manifest = Manifest {
        created: jiff::Timestamp::now().to_string(),
        node_name: node_name.to_string(),
        units,
        files,
        node_label,
    };
    save(host, &manifest)?;
    Ok(manifest)
}

fn save(host: &Host, m: &Manifest) -> Result<(), MigrateError> {
    let path = dir(host).join(MANIFEST);
    let text = serde_json::to_vec_pretty(m)
        .map_err(|e| MigrateError::Backup(format!("encoding the manifest: {e}")))?;
    write_atomically(&path, &text, 0o600).map_err(|e| MigrateError::io(&path, e))
}

/// Reads the manifest.
pub fn load(host: &Host) -> Result<Manifest, MigrateError> {
    let path = dir(host).join(MANIFEST);
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(MigrateError::NoBackup(layout::BACKUP_DIR.to_string()));
        }
        Err(e) => return Err(MigrateError::io(&path, e)),
    };
    serde_json::from_slice(&text)
        .map_err(|e| MigrateError::Backup(format!("{}: {e}", path.display())))
}

/// Puts every recorded file back as it was; returns the paths changed.
pub fn restore_files(host: &Host, m: &Manifest) -> Result<Vec<PathBuf>, MigrateError> {
    let dir = dir(host);
    let mut changed = Vec::new();
    for f in &m.files {
        let real = host.path(&f.path);
        let current = std::fs::symlink_metadata(&real).ok();
        match &f.original {
            Original::Absent => {
                if let Some(md) = current {
                    if md.is_dir() {
                        return Err(MigrateError::Backup(format!(
                            "{} is a directory now; not removing it",
                            f.path.display()
                        )));
                    }
                    std::fs::remove_file(&real).map_err(|e| MigrateError::io(&f.path, e))?;
                    changed.push(f.path.clone());
                }
            }
            Original::Symlink { target } => {
                let same = current
                    .as_ref()
                    .is_some_and(|md| md.file_type().is_symlink())
                    && std::fs::read_link(&real).ok().as_ref() == Some(target);
                if !same {
                    if current.is_some() {
                        std::fs::remove_file(&real).map_err(|e| MigrateError::io(&f.path, e))?;
                    }
                    std::os::unix::fs::symlink(target, &real)
                        .map_err(|e| MigrateError::io(&f.path, e))?;
                    changed.push(f.path.clone());
                }
            }
            Original::File { mode, copy } => {
                let bytes = std::fs::read(dir.join(copy))
                    .map_err(|e| MigrateError::io(&dir.join(copy), e))?;
                let same_kind = current.as_ref().is_some_and(|md| md.file_type().is_file());
                let same = same_kind
                    && std::fs::read(&real).ok().as_deref() == Some(&bytes[..])
                    && current
                        .as_ref()
                        .is_some_and(|md| md.permissions().mode() & 0o7777 == *mode);
                if !same {
                    if current
                        .as_ref()
                        .is_some_and(|md| md.file_type().is_symlink())
                    {
                        std::fs::remove_file(&real).map_err(|e| MigrateError::io(&f.path, e))?;
                    }
                    write_atomically(&real, &bytes, *mode)
                        .map_err(|e| MigrateError::io(&f.path, e))?;
                    changed.push(f.path.clone());
                }
            }
        }
    }
    Ok(changed)
}

/// Moves the backup aside once a rollback is complete, so a new `--apply`
/// may run; returns where it went.
pub fn retire(host: &Host) -> Result<PathBuf, MigrateError> {
    let dir = dir(host);
    let stamp = jiff::Timestamp::now().as_second();
    let to = dir.with_file_name(format!("rolled-back-{stamp}"));
    std::fs::rename(&dir, &to).map_err(|e| MigrateError::io(&dir, e))?;
    Ok(to)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_links_and_absences_come_back_byte_for_byte() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let host = Host::new(tmp.path(), "true");
        host.write(Path::new("/etc/a.conf"), b"original\n", 0o640)
            .expect("write");
        std::fs::create_dir_all(host.path("/pki")).expect("mkdir");
        std::os::unix::fs::symlink("/pki/one.pem", host.path("/pki/current.pem")).expect("link");
        let m = write(
            &host,
            "n1",
            BTreeMap::new(),
            &["/etc/a.conf", "/pki/current.pem", "/etc/new.conf"],
            None,
        )
        .expect("backup");
        assert!(exists(&host));
        assert!(matches!(
            write(&host, "n1", BTreeMap::new(), &[], None),
            Err(MigrateError::AlreadyApplied(_))
        ));

        host.write(Path::new("/etc/a.conf"), b"changed\n", 0o600)
            .expect("write");
        std::fs::remove_file(host.path("/pki/current.pem")).expect("rm");
        std::os::unix::fs::symlink("/pki/two.pem", host.path("/pki/current.pem")).expect("link");
        host.write(Path::new("/etc/new.conf"), b"keelson\n", 0o644)
            .expect("write");

        let loaded = load(&host).expect("manifest");
        assert_eq!(loaded, m);
        let changed = restore_files(&host, &loaded).expect("restore");
        assert_eq!(changed.len(), 3, "{changed:?}");
        assert_eq!(
            std::fs::read(host.path("/etc/a.conf")).expect("read"),
            b"original\n"
        );
        let mode = std::fs::metadata(host.path("/etc/a.conf"))
            .expect("md")
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o640);
        assert_eq!(
            std::fs::read_link(host.path("/pki/current.pem")).expect("link"),
            PathBuf::from("/pki/one.pem")
        );
        assert!(!host.path("/etc/new.conf").exists());
        // Restoring again changes nothing.
        assert!(restore_files(&host, &loaded).expect("restore").is_empty());
        let retired = retire(&host).expect("retire");
        assert!(retired.join(MANIFEST).exists());
        assert!(!exists(&host));
    }
}

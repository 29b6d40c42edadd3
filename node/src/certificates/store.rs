//! Where certificates live on disk, as client-go's file store
//! (`staging/src/k8s.io/client-go/util/certificate/certificate_store.go`):
//! each new pair is written to `<dir>/<prefix>-<YYYY-MM-DD-HH-MM-SS>.pem`
//! (chain, then key, mode 0600), and `<prefix>-current.pem` is a symlink to
//! the newest, replaced atomically through `<prefix>-updated.pem` + rename
//! so a crash leaves the old link or the new one. Reading prefers the
//! current link, then the given cert/key files (e.g. those a kubeconfig
//! names), then `<prefix>.crt` + `<prefix>.key`.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, symlink};
use std::path::{Path, PathBuf};

use super::CertError;
use super::pair::CertPair;

/// A pair store in one directory.
#[derive(Debug, Clone)]
pub struct FileStore {
    dir: PathBuf,
    prefix: String,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
}

fn io(path: &Path, what: &str, e: std::io::Error) -> CertError {
    CertError::Store(format!("{what} {}: {e}", path.display()))
}

impl FileStore {
    /// A store in `dir` with pair files named `<prefix>-...pem`; `cert_file`
    /// and `key_file` are read when there is no current pair. Finishes an
    /// update interrupted by a crash (an `-updated` link without `-current`).
    pub fn new(
        dir: &Path,
        prefix: &str,
        cert_file: Option<PathBuf>,
        key_file: Option<PathBuf>,
    ) -> Result<FileStore, CertError> {
        let s = FileStore {
            dir: dir.to_path_buf(),
            prefix: prefix.to_string(),
            cert_file,
            key_file,
        };
        s.recover()?;
        Ok(s)
    }

    fn file(&self, qualifier: &str) -> PathBuf {
        self.dir.join(format!("{}-{qualifier}.pem", self.prefix))
    }

    /// `<dir>/<prefix>-current.pem`.
    pub fn current_path(&self) -> PathBuf {
        self.file("current")
    }

    fn recover(&self) -> Result<(), CertError> {
        let current = self.current_path();
        if current.exists() {
            return Ok(());
        }
        let updated = self.file("updated");
        match std::fs::symlink_metadata(&updated) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io(&updated, "reading", e)),
            Ok(m) if !m.file_type().is_symlink() => Err(CertError::Store(format!(
                "expected {} to be a symlink but it is a file",
                updated.display()
            ))),
            Ok(_) => std::fs::rename(&updated, &current).map_err(|e| io(&updated, "renaming", e)),
        }
    }

    /// The current pair, or `None` when the store and the given files hold none.
    pub fn current(&self) -> Result<Option<CertPair>, CertError> {
        let current = self.current_path();
        if current.exists() {
            let text = std::fs::read_to_string(&current).map_err(|e| io(&current, "reading", e))?;
            return CertPair::from_pem(&text, &text)
                .map(Some)
                .map_err(|e| CertError::Store(format!("{}: {e}", current.display())));
        }
        let fallback = [
            (self.cert_file.clone(), self.key_file.clone()),
            (
                Some(self.dir.join(format!("{}.crt", self.prefix))),
                Some(self.dir.join(format!("{}.key", self.prefix))),
            ),
        ];
        for (c, k) in fallback {
            let (Some(c), Some(k)) = (c, k) else { continue };
            if c.exists() && k.exists() {
                let ct = std::fs::read_to_string(&c).map_err(|e| io(&c, "reading", e))?;
                let kt = std::fs::read_to_string(&k).map_err(|e| io(&k, "reading", e))?;
                return CertPair::from_pem(&ct, &kt).map(Some).map_err(|e| {
                    CertError::Store(format!("{} / {}: {e}", c.display(), k.display()))
                });
            }
        }
        Ok(None)
    }

    /// Writes a new pair to a dated file and points the current link at it.
    pub fn update(&self, pair: &CertPair) -> Result<PathBuf, CertError> {
        std::fs::create_dir_all(&self.dir).map_err(|e| io(&self.dir, "creating", e))?;
        let stamp = jiff::Zoned::now().strftime("%Y-%m-%d-%H-%M-%S").to_string();
        let mut path = self.file(&stamp);
        // Two updates in one second (a test, a fast re-issue): keep both.
        let mut n = 1;
        while path.exists() {
            path = self.file(&format!("{stamp}-{n}"));
            n += 1;
        }
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| io(&path, "creating", e))?;
        f.write_all(pair.combined_pem().as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(|e| io(&path, "writing", e))?;
        drop(f);
        self.point_current_at(&path)?;
        Ok(path)
    }

    fn point_current_at(&self, target: &Path) -> Result<(), CertError> {
        let current = self.current_path();
        if let Ok(m) = std::fs::symlink_metadata(&current)
            && !m.file_type().is_symlink()
        {
            return Err(CertError::Store(format!(
                "expected {} to be a symlink but it is a file",
                current.display()
            )));
        }
        let updated = self.file("updated");
        match std::fs::remove_file(&updated) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&updated, "removing", e)),
        }
        let target = std::path::absolute(target).map_err(|e| io(target, "resolving", e))?;
        symlink(&target, &updated).map_err(|e| io(&updated, "linking", e))?;
        std::fs::rename(&updated, &current).map_err(|e| io(&updated, "renaming", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certificates::pair::tests::self_signed;

    #[test]
    fn update_writes_a_dated_file_and_moves_the_link() {
        let dir = tempfile::tempdir().expect("dir");
        let store = FileStore::new(dir.path(), "keelson-client", None, None).expect("store");
        assert!(store.current().expect("read").is_none());
        let (c, k) = self_signed("system:node:a", "system:nodes", 1);
        let first = CertPair::from_pem(&c, &k).expect("pair");
        let p1 = store.update(&first).expect("update");
        let name = p1
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        assert!(
            name.starts_with("keelson-client-20") && name.ends_with(".pem"),
            "{name}"
        );
        let (c2, k2) = self_signed("system:node:b", "system:nodes", 1);
        let p2 = store
            .update(&CertPair::from_pem(&c2, &k2).expect("pair"))
            .expect("update");
        assert_ne!(p1, p2);
        let link = std::fs::read_link(store.current_path()).expect("symlink");
        assert_eq!(link, p2);
        assert_eq!(
            store
                .current()
                .expect("read")
                .expect("pair")
                .leaf
                .common_name,
            "system:node:b"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&p2).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn falls_back_to_given_files_and_recovers_an_interrupted_update() {
        let dir = tempfile::tempdir().expect("dir");
        let (c, k) = self_signed("system:node:a", "system:nodes", 1);
        let cf = dir.path().join("client.crt");
        let kf = dir.path().join("client.key");
        std::fs::write(&cf, &c).expect("w");
        std::fs::write(&kf, &k).expect("w");
        let store =
            FileStore::new(dir.path(), "keelson-client", Some(cf), Some(kf)).expect("store");
        assert_eq!(
            store
                .current()
                .expect("read")
                .expect("pair")
                .leaf
                .common_name,
            "system:node:a"
        );
        // A crash between linking -updated and the rename: the next start finishes it.
        let dated = dir.path().join("keelson-client-2020-01-01-00-00-00.pem");
        std::fs::write(&dated, format!("{c}{k}")).expect("w");
        symlink(&dated, dir.path().join("keelson-client-updated.pem")).expect("link");
        let store = FileStore::new(dir.path(), "keelson-client", None, None).expect("store");
        assert_eq!(
            std::fs::read_link(store.current_path()).expect("link"),
            dated
        );
    }
}

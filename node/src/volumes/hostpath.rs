//! hostPath volumes: nothing is mounted by keelson (the runtime binds the
//! host path into the container); setup checks `type` as kubelet does,
//! creating the directory (0755) or empty file (0644) for the `…OrCreate`
//! types.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Component, Path};

/// Checks (and for `…OrCreate`, creates) `path` for hostPath `type`.
/// Errors are kubelet's texts.
pub fn check_type(path: &str, path_type: Option<&str>) -> Result<(), String> {
    if Path::new(path)
        .components()
        .any(|c| matches!(c, Component::ParentDir))
    {
        return Err(format!("invalid HostPath `{path}`: must not contain '..'"));
    }
    let p = Path::new(path);
    let kind = || std::fs::metadata(p).ok().map(|m| m.file_type());
    match path_type.unwrap_or("") {
        "" => Ok(()),
        "DirectoryOrCreate" if kind().is_none() => {
            std::fs::create_dir_all(p).map_err(|e| e.to_string())?;
            set_mode(p, 0o755)
        }
        "DirectoryOrCreate" | "Directory" => match kind() {
            Some(k) if k.is_dir() => Ok(()),
            _ => Err(format!(
                "hostPath type check failed: {path} is not a directory"
            )),
        },
        "FileOrCreate" if kind().is_none() => match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(p)
        {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(e.to_string()),
        },
        "FileOrCreate" | "File" => match kind() {
            Some(k) if k.is_file() => Ok(()),
            _ => Err(format!("hostPath type check failed: {path} is not a file")),
        },
        "Socket" => match kind() {
            Some(k) if k.is_socket() => Ok(()),
            _ => Err(format!(
                "hostPath type check failed: {path} is not a socket file"
            )),
        },
        "CharDevice" => match kind() {
            Some(k) if k.is_char_device() => Ok(()),
            _ => Err(format!(
                "hostPath type check failed: {path} is not a character device"
            )),
        },
        "BlockDevice" => match kind() {
            Some(k) if k.is_block_device() => Ok(()),
            _ => Err(format!(
                "hostPath type check failed: {path} is not a block device"
            )),
        },
        other => Err(format!("{other} is an invalid volume type")),
    }
}

fn set_mode(p: &Path, mode: u32) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).map_err(|e| e.to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn every_type() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let s = |p: &Path| p.to_str().unwrap().to_string();
        std::fs::write(d.join("f"), "x").unwrap();
        let sock = std::os::unix::net::UnixListener::bind(d.join("sock")).unwrap();

        assert!(check_type(&s(d), Some("Directory")).is_ok());
        assert!(check_type(&s(&d.join("f")), Some("File")).is_ok());
        assert!(check_type(&s(&d.join("sock")), Some("Socket")).is_ok());
        assert!(check_type("/dev/null", Some("CharDevice")).is_ok());
        assert!(check_type(&s(&d.join("nothing")), None).is_ok());

        let f = s(&d.join("f"));
        assert_eq!(
            check_type(&f, Some("Directory")).unwrap_err(),
            format!("hostPath type check failed: {f} is not a directory")
        );
        assert_eq!(
            check_type(&s(d), Some("File")).unwrap_err(),
            format!("hostPath type check failed: {} is not a file", s(d))
        );
        assert_eq!(
            check_type(&f, Some("Socket")).unwrap_err(),
            format!("hostPath type check failed: {f} is not a socket file")
        );
        assert_eq!(
            check_type(&f, Some("CharDevice")).unwrap_err(),
            format!("hostPath type check failed: {f} is not a character device")
        );
        assert_eq!(
            check_type("/dev/null", Some("BlockDevice")).unwrap_err(),
            "hostPath type check failed: /dev/null is not a block device"
        );
        assert_eq!(
            check_type(&f, Some("Weird")).unwrap_err(),
            "Weird is an invalid volume type"
        );
        assert!(
            check_type("/a/../b", None)
                .unwrap_err()
                .contains("must not contain '..'")
        );

        let nd = d.join("new/dir");
        check_type(&s(&nd), Some("DirectoryOrCreate")).unwrap();
        assert_eq!(std::fs::metadata(&nd).unwrap().mode() & 0o777, 0o755);
        let nf = d.join("newfile");
        check_type(&s(&nf), Some("FileOrCreate")).unwrap();
        assert!(std::fs::metadata(&nf).unwrap().is_file());
        // FileOrCreate does not create the parent.
        assert!(check_type(&s(&d.join("no/parent")), Some("FileOrCreate")).is_err());
        drop(sock);
    }
}

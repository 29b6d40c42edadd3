//! A minimal OCI image builder: uncompressed layers, an image config, a
//! manifest and an index, packed as an OCI image-layout tar archive that
//! `ctr images import` (and any OCI tool) accepts.
//!
//! A [`LayerBuilder`] records every path it holds: each path goes in once
//! (a second file or link at the same path is an error, a second directory
//! is a no-op) and missing parent directories are added (root, 0755), so
//! the layer is what a `tar -x` of it gives, in any extractor.

use std::collections::BTreeSet;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use serde_json::json;

use super::ImageError;

const MEDIA_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";
const MEDIA_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const MEDIA_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const MEDIA_INDEX: &str = "application/vnd.oci.image.index.v1+json";

/// The runtime settings of an image (the `config` object of an OCI image
/// config).
#[derive(Debug, Clone, Default)]
pub struct ImageConfig {
    /// `Entrypoint`.
    pub entrypoint: Vec<String>,
    /// `Cmd`.
    pub cmd: Vec<String>,
    /// `Env` (`KEY=value`).
    pub env: Vec<String>,
    /// `WorkingDir`.
    pub working_dir: String,
    /// `User` (`uid[:gid]` or a name), empty for root.
    pub user: String,
    /// `ExposedPorts` (`80/tcp`, ...).
    pub exposed_ports: Vec<String>,
    /// `StopSignal` (`SIGQUIT`, ...), empty for the runtime's default
    /// (SIGTERM).
    pub stop_signal: String,
}

/// A root filesystem layer being assembled (a tar stream in memory).
pub struct LayerBuilder {
    tar: tar::Builder<Vec<u8>>,
    /// Every path in the layer (relative, no trailing slash) and whether it
    /// is a directory.
    paths: BTreeSet<String>,
    dirs: BTreeSet<String>,
}

impl Default for LayerBuilder {
    fn default() -> Self {
        Self::new()
    }
}

fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    owned_header(kind, mode, size, 0, 0)
}

fn owned_header(kind: tar::EntryType, mode: u32, size: u64, uid: u32, gid: u32) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(uid.into());
    h.set_gid(gid.into());
    h.set_mtime(0);
    h.set_size(size);
    h
}

/// `path` relative to `/`, without `.`/empty components or a trailing `/`.
fn normalize(path: &str) -> String {
    path.split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect::<Vec<_>>()
        .join("/")
}

fn io_err(context: String) -> impl FnOnce(std::io::Error) -> ImageError {
    move |source| ImageError::Io { context, source }
}

impl LayerBuilder {
    /// An empty layer.
    pub fn new() -> Self {
        let mut tar = tar::Builder::new(Vec::new());
        tar.mode(tar::HeaderMode::Deterministic);
        LayerBuilder {
            tar,
            paths: BTreeSet::new(),
            dirs: BTreeSet::new(),
        }
    }

    /// Whether the layer already holds `path` (any kind).
    pub fn contains(&self, path: &str) -> bool {
        self.paths.contains(&normalize(path))
    }

    /// Adds the missing parent directories of `path` (root, 0755) and
    /// checks that `path` itself is new; returns its normalized form.
    fn claim(&mut self, path: &str) -> Result<String, ImageError> {
        let path = normalize(path);
        if path.is_empty() {
            return Err(ImageError::Layer(format!(
                "an entry needs a path below /, not {path:?}"
            )));
        }
        if self.paths.contains(&path) {
            return Err(ImageError::Layer(format!("{path} is already in the layer")));
        }
        let mut parent = String::new();
        let components: Vec<&str> = path.split('/').collect();
        for c in &components[..components.len() - 1] {
            if !parent.is_empty() {
                parent.push('/');
            }
            parent.push_str(c);
            if self.dirs.contains(&parent) {
                continue;
            }
            if self.paths.contains(&parent) {
                return Err(ImageError::Layer(format!(
                    "{parent} (a parent of {path}) is not a directory in the layer"
                )));
            }
            self.append_dir(&parent, 0o755, 0, 0)?;
        }
        Ok(path)
    }

    fn append_dir(&mut self, path: &str, mode: u32, uid: u32, gid: u32) -> Result<(), ImageError> {
        let mut h = owned_header(tar::EntryType::Directory, mode, 0, uid, gid);
        self.tar
            .append_data(&mut h, format!("{path}/"), std::io::empty())
            .map_err(io_err(format!("adding dir {path}")))?;
        self.paths.insert(path.to_string());
        self.dirs.insert(path.to_string());
        Ok(())
    }

    /// Adds a directory (path relative to `/`, no leading slash); a
    /// directory already there is left as it is.
    pub fn dir(&mut self, path: &str, mode: u32) -> Result<&mut Self, ImageError> {
        self.dir_owned(path, mode, 0, 0)
    }

    /// Adds a directory owned by `uid:gid`; a directory already there is
    /// left as it is.
    pub fn dir_owned(
        &mut self,
        path: &str,
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> Result<&mut Self, ImageError> {
        if self.dirs.contains(&normalize(path)) {
            return Ok(self);
        }
        let path = self.claim(path)?;
        self.append_dir(&path, mode, uid, gid)?;
        Ok(self)
    }

    /// Adds a regular file with `content` (`mode` may carry the setuid,
    /// setgid and sticky bits).
    pub fn file(&mut self, path: &str, mode: u32, content: &[u8]) -> Result<&mut Self, ImageError> {
        let path = self.claim(path)?;
        let mut h = header(tar::EntryType::Regular, mode, content.len() as u64);
        self.tar
            .append_data(&mut h, &path, content)
            .map_err(io_err(format!("adding file {path}")))?;
        self.paths.insert(path);
        Ok(self)
    }

    /// Adds a file copied from the host (symlinks followed).
    pub fn host_file(
        &mut self,
        path: &str,
        mode: u32,
        source: &Path,
    ) -> Result<&mut Self, ImageError> {
        let content =
            std::fs::read(source).map_err(io_err(format!("reading {}", source.display())))?;
        self.file(path, mode, &content)
    }

    /// Copies the host directory `source` to `path`, recursively: its
    /// directories, regular files and symlinks (as links) with their
    /// permission bits, owned by root. Other file types are an error.
    pub fn host_dir(&mut self, path: &str, source: &Path) -> Result<&mut Self, ImageError> {
        let meta =
            std::fs::metadata(source).map_err(io_err(format!("reading {}", source.display())))?;
        self.dir(path, meta.mode() & 0o7777)?;
        let mut entries: Vec<std::fs::DirEntry> = std::fs::read_dir(source)
            .map_err(io_err(format!("listing {}", source.display())))?
            .collect::<Result<_, _>>()
            .map_err(io_err(format!("listing {}", source.display())))?;
        entries.sort_by_key(std::fs::DirEntry::file_name);
        for entry in entries {
            let src = entry.path();
            let name = entry.file_name();
            let dest = format!("{}/{}", normalize(path), name.to_string_lossy());
            let meta = std::fs::symlink_metadata(&src)
                .map_err(io_err(format!("reading {}", src.display())))?;
            let kind = meta.file_type();
            if kind.is_dir() {
                self.host_dir(&dest, &src)?;
            } else if kind.is_symlink() {
                let target = std::fs::read_link(&src)
                    .map_err(io_err(format!("reading link {}", src.display())))?;
                self.symlink(&dest, &target.to_string_lossy())?;
            } else if kind.is_file() {
                self.host_file(&dest, meta.mode() & 0o7777, &src)?;
            } else {
                let what = if kind.is_socket() {
                    "a socket"
                } else if kind.is_fifo() {
                    "a fifo"
                } else {
                    "a device"
                };
                return Err(ImageError::Layer(format!(
                    "{} is {what}, which an image layer does not carry here",
                    src.display()
                )));
            }
        }
        Ok(self)
    }

    /// Adds a symlink `path` → `target`.
    pub fn symlink(&mut self, path: &str, target: &str) -> Result<&mut Self, ImageError> {
        let path = self.claim(path)?;
        let mut h = header(tar::EntryType::Symlink, 0o777, 0);
        self.tar
            .append_link(&mut h, &path, target)
            .map_err(io_err(format!("adding symlink {path}")))?;
        self.paths.insert(path);
        Ok(self)
    }

    /// The finished layer tar.
    pub fn finish(self) -> Result<Vec<u8>, ImageError> {
        self.tar
            .into_inner()
            .map_err(io_err("finishing layer tar".to_string()))
    }
}

/// A blob of the image layout: its bytes and `sha256:<hex>` digest.
struct Blob<'a> {
    digest: String,
    bytes: std::borrow::Cow<'a, [u8]>,
}

impl<'a> Blob<'a> {
    fn new(bytes: impl Into<std::borrow::Cow<'a, [u8]>>) -> Blob<'a> {
        let bytes = bytes.into();
        // ring's assembly, not sha2: the e2e images' layers are hundreds
        // of MB, which sha2 hashes some 50 times slower in a debug build.
        let digest = format!(
            "sha256:{}",
            hex::encode(ring::digest::digest(&ring::digest::SHA256, &bytes))
        );
        Blob { digest, bytes }
    }

    fn hex(&self) -> &str {
        self.digest.trim_start_matches("sha256:")
    }
}

/// The OCI architecture name of this machine.
pub fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// Writes an OCI image-layout archive for image `name` (e.g.
/// `keelson.local/busybox:1`) with one `layer` and `config` to `out`.
/// Returns the manifest digest.
pub fn write_archive(
    name: &str,
    layer: Vec<u8>,
    config: &ImageConfig,
    out: &Path,
) -> Result<String, ImageError> {
    write_image(&[name], &[&layer], config, out)
}

/// Writes an OCI image-layout archive of one image with `layers` (bottom
/// first) and `config` to `out`, named by each of `names` (one index entry
/// per name, all for the same manifest: `ctr images import` creates every
/// name). Returns the manifest digest.
pub fn write_image(
    names: &[&str],
    layers: &[&[u8]],
    config: &ImageConfig,
    out: &Path,
) -> Result<String, ImageError> {
    let layers: Vec<Blob<'_>> = layers.iter().map(|l| Blob::new(*l)).collect();
    let mut cfg = serde_json::Map::new();
    if !config.entrypoint.is_empty() {
        cfg.insert("Entrypoint".into(), json!(config.entrypoint));
    }
    if !config.cmd.is_empty() {
        cfg.insert("Cmd".into(), json!(config.cmd));
    }
    if !config.env.is_empty() {
        cfg.insert("Env".into(), json!(config.env));
    }
    if !config.working_dir.is_empty() {
        cfg.insert("WorkingDir".into(), json!(config.working_dir));
    }
    if !config.user.is_empty() {
        cfg.insert("User".into(), json!(config.user));
    }
    if !config.exposed_ports.is_empty() {
        let ports: serde_json::Map<String, serde_json::Value> = config
            .exposed_ports
            .iter()
            .map(|p| (p.clone(), json!({})))
            .collect();
        cfg.insert("ExposedPorts".into(), serde_json::Value::Object(ports));
    }
    if !config.stop_signal.is_empty() {
        cfg.insert("StopSignal".into(), json!(config.stop_signal));
    }
    let history: Vec<serde_json::Value> = layers
        .iter()
        .map(|_| json!({ "created": "1970-01-01T00:00:00Z", "created_by": "keelson test image builder" }))
        .collect();
    let image_config = json!({
        "created": "1970-01-01T00:00:00Z",
        "architecture": oci_arch(),
        "os": "linux",
        "config": cfg,
        "rootfs": { "type": "layers", "diff_ids": layers.iter().map(|l| l.digest.clone()).collect::<Vec<_>>() },
        "history": history,
    });
    let config_blob = Blob::new(image_config.to_string().into_bytes());
    let layer_descriptors: Vec<serde_json::Value> = layers
        .iter()
        .map(|l| json!({ "mediaType": MEDIA_LAYER, "digest": l.digest, "size": l.bytes.len() }))
        .collect();
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": { "mediaType": MEDIA_CONFIG, "digest": config_blob.digest, "size": config_blob.bytes.len() },
        "layers": layer_descriptors,
    });
    let manifest_blob = Blob::new(manifest.to_string().into_bytes());
    let entries: Vec<serde_json::Value> = names
        .iter()
        .map(|name| {
            json!({
                "mediaType": MEDIA_MANIFEST,
                "digest": manifest_blob.digest,
                "size": manifest_blob.bytes.len(),
                "platform": { "architecture": oci_arch(), "os": "linux" },
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": name,
                },
            })
        })
        .collect();
    let index = json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": entries,
    });

    let file = std::fs::File::create(out).map_err(io_err(format!("creating {}", out.display())))?;
    let mut tar = tar::Builder::new(std::io::BufWriter::new(file));
    let mut written = BTreeSet::new();
    let mut add = |path: String, bytes: &[u8]| -> Result<(), ImageError> {
        // Layers may repeat (the same content twice in one image).
        if !written.insert(path.clone()) {
            return Ok(());
        }
        let mut h = header(tar::EntryType::Regular, 0o644, bytes.len() as u64);
        tar.append_data(&mut h, &path, bytes)
            .map_err(io_err(format!("writing {path} into {}", out.display())))
    };
    add("oci-layout".into(), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    add("index.json".into(), index.to_string().as_bytes())?;
    for blob in layers.iter().chain([&config_blob, &manifest_blob]) {
        add(format!("blobs/sha256/{}", blob.hex()), blob.bytes.as_ref())?;
    }
    tar.into_inner()
        .and_then(|w| w.into_inner().map_err(std::io::IntoInnerError::into_error))
        .and_then(|f| f.sync_all())
        .map_err(io_err(format!("finishing {}", out.display())))?;
    Ok(manifest_blob.digest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};
    use std::io::Read;

    #[test]
    fn archive_is_a_consistent_oci_layout() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut layer = LayerBuilder::new();
        layer.dir("bin", 0o755).expect("dir");
        layer
            .file("bin/hello", 0o755, b"#!/bin/sh\n")
            .expect("file");
        layer.symlink("bin/hi", "hello").expect("link");
        let out = dir.path().join("img.tar");
        let config = ImageConfig {
            cmd: vec!["/bin/hello".into()],
            ..Default::default()
        };
        let digest = write_archive(
            "keelson.local/t:1",
            layer.finish().expect("layer"),
            &config,
            &out,
        )
        .expect("archive");

        let mut files = std::collections::HashMap::new();
        let mut archive = tar::Archive::new(std::fs::File::open(&out).expect("open"));
        for entry in archive.entries().expect("entries") {
            let mut entry = entry.expect("entry");
            let path = entry.path().expect("path").to_string_lossy().into_owned();
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes).expect("read");
            files.insert(path, bytes);
        }
        // Every blob's name is the sha256 of its content.
        for (path, bytes) in &files {
            if let Some(hex_name) = path.strip_prefix("blobs/sha256/") {
                assert_eq!(hex::encode(Sha256::digest(bytes)), hex_name);
            }
        }
        let index: serde_json::Value =
            serde_json::from_slice(&files["index.json"]).expect("index json");
        assert_eq!(index["manifests"][0]["digest"], digest.as_str());
        assert_eq!(
            index["manifests"][0]["annotations"]["io.containerd.image.name"],
            "keelson.local/t:1"
        );
        let manifest: serde_json::Value = serde_json::from_slice(
            &files[&format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"))],
        )
        .expect("manifest");
        let config_digest = manifest["config"]["digest"]
            .as_str()
            .expect("config digest");
        let config: serde_json::Value = serde_json::from_slice(
            &files[&format!(
                "blobs/sha256/{}",
                config_digest.trim_start_matches("sha256:")
            )],
        )
        .expect("config");
        assert_eq!(config["config"]["Cmd"][0], "/bin/hello");
        assert_eq!(
            config["rootfs"]["diff_ids"][0],
            manifest["layers"][0]["digest"]
        );
    }

    fn entries(tar_bytes: &[u8]) -> Vec<(String, u32, tar::EntryType)> {
        let mut archive = tar::Archive::new(tar_bytes);
        archive
            .entries()
            .expect("entries")
            .map(|e| {
                let e = e.expect("entry");
                let h = e.header();
                (
                    e.path().expect("path").to_string_lossy().into_owned(),
                    h.mode().expect("mode"),
                    h.entry_type(),
                )
            })
            .collect()
    }

    #[test]
    fn a_path_goes_in_once_and_its_parents_first() {
        let mut layer = LayerBuilder::new();
        layer.file("usr/local/bin/nnp", 0o6755, b"x").expect("file");
        assert!(layer.contains("usr") && layer.contains("/usr/local/bin/"));
        layer
            .dir("usr/local", 0o700)
            .expect("an existing dir is fine");
        assert!(layer.file("usr/local/bin/nnp", 0o644, b"y").is_err());
        assert!(layer.symlink("usr/local/bin/nnp/x", "y").is_err());
        assert!(layer.dir("usr/local/bin/nnp", 0o755).is_err());
        let got = entries(&layer.finish().expect("layer"));
        assert_eq!(
            got,
            vec![
                ("usr/".to_string(), 0o755, tar::EntryType::Directory),
                ("usr/local/".to_string(), 0o755, tar::EntryType::Directory),
                (
                    "usr/local/bin/".to_string(),
                    0o755,
                    tar::EntryType::Directory
                ),
                (
                    "usr/local/bin/nnp".to_string(),
                    0o6755,
                    tar::EntryType::Regular
                ),
            ]
        );
    }

    #[test]
    fn an_image_has_its_layers_in_order_and_every_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut base = LayerBuilder::new();
        base.file("a", 0o644, b"a").expect("file");
        let mut top = LayerBuilder::new();
        top.file("b", 0o644, b"b").expect("file");
        let (base, top) = (base.finish().expect("base"), top.finish().expect("top"));
        let out = dir.path().join("img.tar");
        let config = ImageConfig {
            exposed_ports: vec!["80/tcp".into()],
            stop_signal: "SIGQUIT".into(),
            ..Default::default()
        };
        let digest = write_image(
            &["x.local/a:1", "x.local/a:2"],
            &[&base, &top],
            &config,
            &out,
        )
        .expect("archive");
        let mut files = std::collections::HashMap::new();
        let mut archive = tar::Archive::new(std::fs::File::open(&out).expect("open"));
        for entry in archive.entries().expect("entries") {
            let mut entry = entry.expect("entry");
            let path = entry.path().expect("path").to_string_lossy().into_owned();
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes).expect("read");
            files.insert(path, bytes);
        }
        let blob = |d: &str| &files[&format!("blobs/sha256/{}", d.trim_start_matches("sha256:"))];
        let index: serde_json::Value = serde_json::from_slice(&files["index.json"]).expect("index");
        let names: Vec<&str> = index["manifests"]
            .as_array()
            .expect("manifests")
            .iter()
            .map(|m| {
                assert_eq!(m["digest"], digest.as_str());
                m["annotations"]["io.containerd.image.name"]
                    .as_str()
                    .expect("name")
            })
            .collect();
        assert_eq!(names, ["x.local/a:1", "x.local/a:2"]);
        let manifest: serde_json::Value = serde_json::from_slice(blob(&digest)).expect("manifest");
        let layer_digests: Vec<&str> = manifest["layers"]
            .as_array()
            .expect("layers")
            .iter()
            .map(|l| l["digest"].as_str().expect("digest"))
            .collect();
        assert_eq!(blob(layer_digests[0]), &base);
        assert_eq!(blob(layer_digests[1]), &top);
        let config: serde_json::Value =
            serde_json::from_slice(blob(manifest["config"]["digest"].as_str().expect("config")))
                .expect("config");
        assert_eq!(
            config["config"]["ExposedPorts"]["80/tcp"],
            serde_json::json!({})
        );
        assert_eq!(config["config"]["StopSignal"], "SIGQUIT");
        assert_eq!(
            config["rootfs"]["diff_ids"].as_array().map(Vec::len),
            Some(2)
        );
    }

    #[test]
    fn a_host_directory_is_copied_with_modes_and_links() {
        use std::os::unix::fs::PermissionsExt;
        let src = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(src.path().join("sub")).expect("sub");
        std::fs::write(src.path().join("sub/page.html"), b"hi").expect("page");
        std::fs::set_permissions(
            src.path().join("sub/page.html"),
            std::fs::Permissions::from_mode(0o640),
        )
        .expect("chmod");
        std::os::unix::fs::symlink("sub/page.html", src.path().join("index.html")).expect("link");
        let mut layer = LayerBuilder::new();
        layer.host_dir("srv/www", src.path()).expect("copy");
        let got = entries(&layer.finish().expect("layer"));
        let kinds: Vec<(&str, u32, tar::EntryType)> =
            got.iter().map(|(p, m, k)| (p.as_str(), *m, *k)).collect();
        assert_eq!(kinds[0], ("srv/", 0o755, tar::EntryType::Directory));
        assert_eq!(kinds[1].0, "srv/www/");
        assert!(kinds.contains(&("srv/www/index.html", 0o777, tar::EntryType::Symlink)));
        assert!(kinds.contains(&("srv/www/sub/page.html", 0o640, tar::EntryType::Regular)));
    }
}

//! A minimal OCI image builder: one uncompressed layer, an image config, a
//! manifest and an index, packed as an OCI image-layout tar archive that
//! `ctr images import` (and any OCI tool) accepts.

use std::path::Path;

use serde_json::json;
use sha2::{Digest, Sha256};

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
}

/// A root filesystem layer being assembled (a tar stream in memory).
pub struct LayerBuilder {
    tar: tar::Builder<Vec<u8>>,
}

impl Default for LayerBuilder {
    fn default() -> Self {
        Self::new()
    }
}

fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_size(size);
    h
}

fn io_err(context: String) -> impl FnOnce(std::io::Error) -> ImageError {
    move |source| ImageError::Io { context, source }
}

impl LayerBuilder {
    /// An empty layer.
    pub fn new() -> Self {
        let mut tar = tar::Builder::new(Vec::new());
        tar.mode(tar::HeaderMode::Deterministic);
        LayerBuilder { tar }
    }

    /// Adds a directory (path relative to `/`, no leading slash).
    pub fn dir(&mut self, path: &str, mode: u32) -> Result<&mut Self, ImageError> {
        let mut h = header(tar::EntryType::Directory, mode, 0);
        self.tar
            .append_data(
                &mut h,
                format!("{}/", path.trim_end_matches('/')),
                std::io::empty(),
            )
            .map_err(io_err(format!("adding dir {path}")))?;
        Ok(self)
    }

    /// Adds a regular file with `content`.
    pub fn file(&mut self, path: &str, mode: u32, content: &[u8]) -> Result<&mut Self, ImageError> {
        let mut h = header(tar::EntryType::Regular, mode, content.len() as u64);
        self.tar
            .append_data(&mut h, path, content)
            .map_err(io_err(format!("adding file {path}")))?;
        Ok(self)
    }

    /// Adds a file copied from the host.
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

    /// Adds a symlink `path` → `target`.
    pub fn symlink(&mut self, path: &str, target: &str) -> Result<&mut Self, ImageError> {
        let mut h = header(tar::EntryType::Symlink, 0o777, 0);
        self.tar
            .append_link(&mut h, path, target)
            .map_err(io_err(format!("adding symlink {path}")))?;
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
struct Blob {
    digest: String,
    bytes: Vec<u8>,
}

impl Blob {
    fn new(bytes: Vec<u8>) -> Blob {
        let digest = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
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
    let layer = Blob::new(layer);
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
    let image_config = json!({
        "created": "1970-01-01T00:00:00Z",
        "architecture": oci_arch(),
        "os": "linux",
        "config": cfg,
        "rootfs": { "type": "layers", "diff_ids": [layer.digest] },
        "history": [{ "created": "1970-01-01T00:00:00Z", "created_by": "keelson test image builder" }],
    });
    let config_blob = Blob::new(image_config.to_string().into_bytes());
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": { "mediaType": MEDIA_CONFIG, "digest": config_blob.digest, "size": config_blob.bytes.len() },
        "layers": [{ "mediaType": MEDIA_LAYER, "digest": layer.digest, "size": layer.bytes.len() }],
    });
    let manifest_blob = Blob::new(manifest.to_string().into_bytes());
    let index = json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [{
            "mediaType": MEDIA_MANIFEST,
            "digest": manifest_blob.digest,
            "size": manifest_blob.bytes.len(),
            "platform": { "architecture": oci_arch(), "os": "linux" },
            "annotations": {
                "io.containerd.image.name": name,
                "org.opencontainers.image.ref.name": name,
            },
        }],
    });

    let file = std::fs::File::create(out).map_err(io_err(format!("creating {}", out.display())))?;
    let mut tar = tar::Builder::new(file);
    let mut add = |path: String, bytes: &[u8]| -> Result<(), ImageError> {
        let mut h = header(tar::EntryType::Regular, 0o644, bytes.len() as u64);
        tar.append_data(&mut h, &path, bytes)
            .map_err(io_err(format!("writing {path} into {}", out.display())))
    };
    add("oci-layout".into(), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    add("index.json".into(), index.to_string().as_bytes())?;
    for blob in [&layer, &config_blob, &manifest_blob] {
        add(format!("blobs/sha256/{}", blob.hex()), &blob.bytes)?;
    }
    tar.into_inner()
        .and_then(|f| f.sync_all())
        .map_err(io_err(format!("finishing {}", out.display())))?;
    Ok(manifest_blob.digest)
}

#[cfg(test)]
mod tests {
    use super::*;
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
}

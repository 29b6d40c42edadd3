//! The device plugin Registration service (v1beta1) kubelet serves on
//! `<root>/device-plugins/kubelet.sock` (`plugin/v1beta1/server.go`): a
//! plugin sends its API version, its socket's name in the same directory
//! and its resource name; keelson connects to it before answering.
//! At start the directory's sockets are removed (`CleanupPluginDirectory`:
//! not the checkpoint, not other files), so plugins watching for a new
//! `kubelet.sock` register again.

use std::path::PathBuf;

use keelson_cri::kubelet_api::deviceplugin::registration_server::{
    Registration, RegistrationServer,
};
use keelson_cri::kubelet_api::deviceplugin::{Empty, RegisterRequest, SUPPORTED_VERSIONS};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;

use super::connection;
use super::manager::DeviceManager;
use crate::pod::resources::is_extended_resource;

/// The socket's name in the device plugin directory.
pub(crate) const SOCKET_NAME: &str = "kubelet.sock";

/// Why the Registration service could not start.
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    /// The directory could not be made or cleaned, or the socket bound.
    #[error("device plugin registration socket {path}: {source}")]
    Io {
        /// The path involved.
        path: String,
        /// The failure.
        source: std::io::Error,
    },
}

/// `errUnsupportedVersion`.
pub(crate) fn unsupported_version(v: &str) -> String {
    format!(
        "requested API version {v:?} is not supported by kubelet. Supported version is {:?}",
        SUPPORTED_VERSIONS
    )
}

/// `errInvalidResourceName`.
pub(crate) fn invalid_resource_name(r: &str) -> String {
    format!("the ResourceName {r:?} is invalid")
}

struct Service {
    manager: DeviceManager,
    stop: CancellationToken,
}

#[tonic::async_trait]
impl Registration for Service {
    async fn register(
        &self,
        req: tonic::Request<RegisterRequest>,
    ) -> Result<tonic::Response<Empty>, tonic::Status> {
        let r = req.into_inner();
        tracing::info!(resource = %r.resource_name, "got registration request from device plugin with resource");
        if !SUPPORTED_VERSIONS.contains(&r.version.as_str()) {
            let e = unsupported_version(&r.version);
            tracing::error!(resource = %r.resource_name, error = %e, "bad registration request from device plugin");
            return Err(tonic::Status::unknown(e));
        }
        if !is_extended_resource(&r.resource_name) {
            let e = invalid_resource_name(&r.resource_name);
            tracing::error!(error = %e, "bad registration request from device plugin");
            return Err(tonic::Status::unknown(e));
        }
        let socket = self.manager.dir().join(&r.endpoint);
        connection::connect(
            &self.manager,
            &r.resource_name,
            &socket,
            self.stop.child_token(),
        )
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "error connecting to device plugin client");
            tonic::Status::unknown(e.to_string())
        })?;
        Ok(tonic::Response::new(Empty {}))
    }
}

/// Removes the sockets in `dir` (not directories, not other files).
fn cleanup_plugin_directory(dir: &std::path::Path) -> Result<(), std::io::Error> {
    use std::os::unix::fs::FileTypeExt;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        match std::fs::metadata(&path) {
            Ok(m) if m.file_type().is_socket() => {
                if let Err(e) = std::fs::remove_file(&path) {
                    tracing::error!(path = %path.display(), error = %e, "failed to remove file");
                }
            }
            Ok(_) => {}
            Err(e) => tracing::error!(path = %path.display(), error = %e, "failed to stat file"),
        }
    }
    Ok(())
}

/// Starts the Registration service; it serves until `stop`.
pub(crate) fn start(
    manager: &DeviceManager,
    stop: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, RegistrationError> {
    let dir: PathBuf = manager.dir().to_path_buf();
    let io = |path: &std::path::Path, source| RegistrationError::Io {
        path: path.display().to_string(),
        source,
    };
    std::fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750));
    }
    cleanup_plugin_directory(&dir).map_err(|e| io(&dir, e))?;
    let path = dir.join(SOCKET_NAME);
    let listener = UnixListener::bind(&path).map_err(|e| io(&path, e))?;
    let service = Service {
        manager: manager.clone(),
        stop: stop.clone(),
    };
    tracing::info!(socket = %path.display(), "device plugin registration server listening");
    Ok(tokio::spawn(async move {
        let served = tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(service))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop.cancelled())
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "error while serving device plugin registration grpc server");
        }
    }))
}

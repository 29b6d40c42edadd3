//! kubelet's plugin gRPC APIs, generated from `proto/kubelet/` (the
//! Kubernetes v1.36.2 definitions, wire-compatible):
//!
//! - [`deviceplugin`]: `v1beta1` (`k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1`),
//!   the `Registration` service kubelet serves on
//!   `<root>/device-plugins/kubelet.sock` and the `DevicePlugin` service a
//!   plugin serves;
//! - [`pluginregistration`]: `pluginregistration` (v1), the `Registration`
//!   service a plugin serves on its socket under `<root>/plugins_registry`;
//! - [`podresources`]: `v1` (`k8s.io/kubelet/pkg/apis/podresources/v1`),
//!   the `PodResourcesLister` kubelet serves on
//!   `<root>/pod-resources/kubelet.sock`;
//! - [`csi`]: the Container Storage Interface v1 (`csi.v1`, spec v1.9.0 as
//!   kubelet v1.36 vendors it), whose `Identity` and `Node` services a CSI
//!   driver serves on the socket it registers.
//!
//! [`unix_channel`] dials a unix socket for any of their clients.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// Device plugins, `v1beta1` (`pkg/apis/deviceplugin/v1beta1/api.proto`).
#[allow(missing_docs, rust_2018_idioms, clippy::all, clippy::pedantic)]
pub mod deviceplugin {
    tonic::include_proto!("v1beta1");

    /// The API version kubelet v1.36 speaks (`constants.go` `Version`).
    pub const VERSION: &str = "v1beta1";
    /// Every version kubelet v1.36 accepts (`SupportedVersions`).
    pub const SUPPORTED_VERSIONS: &[&str] = &["v1beta1"];
    /// A healthy device (`constants.go` `Healthy`).
    pub const HEALTHY: &str = "Healthy";
    /// An unhealthy device (`constants.go` `Unhealthy`).
    pub const UNHEALTHY: &str = "Unhealthy";
    /// The socket kubelet serves `Registration` on, under its root dir.
    pub const KUBELET_SOCKET: &str = "device-plugins/kubelet.sock";
}

/// Plugin registration, v1 (`pkg/apis/pluginregistration/v1/api.proto`;
/// its protobuf package is `pluginregistration`).
#[allow(missing_docs, rust_2018_idioms, clippy::all, clippy::pedantic)]
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");

    /// `PluginInfo.type` of a CSI driver (`constants.go` `CSIPlugin`).
    pub const CSI_PLUGIN: &str = "CSIPlugin";
    /// `PluginInfo.type` of a device plugin (`constants.go` `DevicePlugin`).
    pub const DEVICE_PLUGIN: &str = "DevicePlugin";
    /// `PluginInfo.type` of a DRA driver (`constants.go` `DRAPlugin`).
    pub const DRA_PLUGIN: &str = "DRAPlugin";
}

/// Pod resources, v1 (`pkg/apis/podresources/v1/api.proto`).
#[allow(missing_docs, rust_2018_idioms, clippy::all, clippy::pedantic)]
pub mod podresources {
    tonic::include_proto!("v1");

    /// The socket kubelet serves `PodResourcesLister` on, under its root dir.
    pub const KUBELET_SOCKET: &str = "pod-resources/kubelet.sock";
}

/// The Container Storage Interface, `csi.v1` (`csi.proto` of spec v1.9.0).
#[allow(missing_docs, rust_2018_idioms, clippy::all, clippy::pedantic)]
pub mod csi {
    tonic::include_proto!("csi.v1");
}

/// A channel to the gRPC server on the unix socket `path`, connected once
/// (`connect_timeout` bounds the dial), as kubelet's `grpc.DialContext`
/// with `WithBlock`.
pub async fn unix_channel(
    path: impl Into<PathBuf>,
    connect_timeout: Duration,
) -> Result<Channel, tonic::transport::Error> {
    let path = Arc::new(path.into());
    // The authority is never used on a unix socket; kubelet's device plugin
    // client sends `localhost` (`grpc.WithAuthority("localhost")`).
    Endpoint::from_static("http://localhost")
        .connect_timeout(connect_timeout)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = Arc::clone(&path);
            async move {
                let stream = UnixStream::connect(path.as_path()).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
}

//! Generates kubelet's plugin gRPC APIs (`proto/kubelet/*.proto`: device
//! plugins v1beta1, plugin registration v1, pod resources v1) and the CSI
//! v1 API (`proto/csi/csi.proto`, spec v1.9.0 as kubelet v1.36 vendors it)
//! with tonic, clients and servers both. Needs `protoc` (as k8s-cri's CRI
//! bindings); the well-known types CSI imports are in `proto/google/`.

fn main() {
    let protos = [
        "proto/kubelet/deviceplugin_v1beta1.proto",
        "proto/kubelet/pluginregistration_v1.proto",
        "proto/kubelet/podresources_v1.proto",
        "proto/csi/csi.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    if let Err(e) = tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_protos(&protos, &["proto/kubelet", "proto"])
    {
        panic!("generating kubelet's plugin APIs failed (is protoc installed?): {e}");
    }
}

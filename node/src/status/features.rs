//! The node features keelson declares in Node status
//! (`status.declaredFeatures`); admission refuses pods that need others.

/// Features keelson declares (`discoverNodeDeclaredFeatures`), in
/// upstream's registry order.
pub const DECLARED: &[&str] = &[
    "RestartAllContainersOnContainerExits",
    "InPlacePodLevelResourcesVerticalScaling",
    // The node API translates WebSocket exec/attach and tunnels WebSocket
    // port-forward itself (`node/server/ws_translator.rs`, `ws_tunnel.rs`),
    // so kube-apiserver proxies those requests here unchanged.
    "ExtendWebSocketsToKubelet",
];

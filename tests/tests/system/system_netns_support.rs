//! System test of the netns helpers every other system test stands on:
//! namespaces, a veth pair between them, sockets created inside them, and
//! removal on drop.

use std::net::SocketAddr;
use std::time::Duration;

use keelson_tests::netns::{NetNs, veth_pair};
use keelson_tests::support::require_root;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn veth_traffic_between_namespaces_and_cleanup() {
    if !require_root("veth_traffic_between_namespaces_and_cleanup") {
        return;
    }
    let a = NetNs::create("kt-a").expect("create ns a");
    let b = NetNs::create("kt-b").expect("create ns b");
    veth_pair(
        &a,
        "va",
        Some("10.250.0.1/30"),
        &b,
        "vb",
        Some("10.250.0.2/30"),
    )
    .expect("veth");

    let listen: SocketAddr = "10.250.0.2:8080".parse().expect("addr");
    let listener = b.tcp_listener(listen).expect("listen in b");
    let server = tokio::spawn(async move {
        let (mut s, peer) = listener.accept().await.expect("accept");
        s.write_all(peer.ip().to_string().as_bytes())
            .await
            .expect("write");
    });
    let mut c = a
        .tcp_connect(listen, Duration::from_secs(5))
        .expect("connect from a");
    let mut got = String::new();
    c.read_to_string(&mut got).await.expect("read");
    server.await.expect("server task");
    assert_eq!(got, "10.250.0.1", "server saw the client's veth address");

    // The namespaces are not reachable from the host namespace.
    let names = (a.name().to_string(), b.name().to_string());
    drop(a);
    drop(b);
    let list = keelson_tests::netns::ip(&["netns", "list"]).expect("ip netns list");
    assert!(
        !list.contains(&names.0) && !list.contains(&names.1),
        "namespaces removed: {list}"
    );
}

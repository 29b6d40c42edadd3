//! The `tcpSocket` handler on loopback.

mod support;

use std::time::{Duration, Instant};

use keelson_probes::ProbeResult;
use keelson_probes::handlers::tcp::probe_tcp;
use tokio::net::{TcpSocket, TcpStream};

#[tokio::test]
async fn an_accepting_port_is_success() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    let accept = tokio::spawn(async move { listener.accept().await.is_ok() });
    assert_eq!(
        probe_tcp("127.0.0.1", port, Duration::from_secs(1)).await,
        ProbeResult::Success
    );
    assert!(
        accept.await.unwrap_or(false),
        "the connection reached the listener"
    );
}

#[tokio::test]
async fn a_closed_port_is_refused() {
    let port = support::closed_port().await;
    assert_eq!(
        probe_tcp("127.0.0.1", port, Duration::from_secs(1)).await,
        ProbeResult::Failure(format!(
            "dial tcp 127.0.0.1:{port}: connect: connection refused"
        ))
    );
}

#[tokio::test]
async fn a_connect_that_does_not_complete_times_out() {
    // A listener that never accepts, with its accept queue filled: the
    // kernel drops further SYNs, so the next connect hangs.
    let socket = TcpSocket::new_v4().unwrap_or_else(|e| panic!("socket: {e}"));
    socket
        .bind("127.0.0.1:0".parse().unwrap_or_else(|e| panic!("{e}")))
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let addr = socket.local_addr().unwrap_or_else(|e| panic!("addr: {e}"));
    let _listener = socket.listen(0).unwrap_or_else(|e| panic!("listen: {e}"));
    let mut held = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => held.push(stream),
            Ok(Err(e)) => panic!("filling the backlog: {e}"),
            Err(_) => break,
        }
        assert!(held.len() < 64, "backlog never filled");
    }
    let started = Instant::now();
    assert_eq!(
        probe_tcp("127.0.0.1", addr.port(), Duration::from_secs(1)).await,
        ProbeResult::Failure(format!("dial tcp 127.0.0.1:{}: i/o timeout", addr.port()))
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(2),
        "took {took:?}"
    );
}

#[tokio::test]
async fn a_host_name_is_resolved() {
    // `localhost` resolves from /etc/hosts: no traffic leaves the machine.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    let accept = tokio::spawn(async move { listener.accept().await.is_ok() });
    assert_eq!(
        probe_tcp("localhost", port, Duration::from_secs(1)).await,
        ProbeResult::Success
    );
    assert!(accept.await.unwrap_or(false));
}

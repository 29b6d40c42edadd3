//! Reaching an outside API server from inside a node namespace: a TCP
//! relay listening on the namespace's loopback and connecting out from the
//! benchmark's own namespace (bytes only, so TLS stays end to end), and
//! the kubeconfig rewrite that points a client at it.

use std::net::SocketAddr;
use std::path::Path;

use serde_yaml::Value;
use tokio::task::JoinHandle;

use super::error::{BenchError, Result};
use crate::netns::NetNs;

/// Starts relaying `127.0.0.1:<port>` in `ns` to `upstream`; returns the
/// port and the accept task (abort it to stop).
pub fn start(ns: &NetNs, upstream: SocketAddr) -> Result<(u16, JoinHandle<()>)> {
    let listener = ns.tcp_listener(SocketAddr::from(([127, 0, 0, 1], 0)))?;
    let port = listener
        .local_addr()
        .map_err(|e| BenchError::io("relay address", e))?
        .port();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut inbound, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                match tokio::net::TcpStream::connect(upstream).await {
                    Ok(mut outbound) => {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                    Err(e) => {
                        tracing::warn!(%upstream, error = %e, "relay: cannot reach the API server")
                    }
                }
            });
        }
    });
    Ok((port, task))
}

/// The API server of a kubeconfig's current context: (server URL, host,
/// port).
pub fn current_server(kubeconfig: &Value) -> Result<(String, String, u16)> {
    let cluster = current_cluster(kubeconfig)?;
    let server = cluster["server"]
        .as_str()
        .ok_or_else(|| BenchError::Invalid("kubeconfig cluster has no server".into()))?
        .to_string();
    let (host, port) = host_port(&server)?;
    Ok((server, host, port))
}

fn current_cluster(kubeconfig: &Value) -> Result<&Value> {
    let ctx_name = kubeconfig["current-context"]
        .as_str()
        .ok_or_else(|| BenchError::Invalid("kubeconfig has no current-context".into()))?;
    let ctx = named(kubeconfig, "contexts", ctx_name)?;
    let cluster_name = ctx["context"]["cluster"]
        .as_str()
        .ok_or_else(|| BenchError::Invalid(format!("context {ctx_name} names no cluster")))?;
    Ok(&named(kubeconfig, "clusters", cluster_name)?["cluster"])
}

fn named<'a>(doc: &'a Value, list: &str, name: &str) -> Result<&'a Value> {
    doc[list]
        .as_sequence()
        .and_then(|s| s.iter().find(|e| e["name"].as_str() == Some(name)))
        .ok_or_else(|| BenchError::Invalid(format!("kubeconfig has no {list} entry {name:?}")))
}

/// Host and port of an `https://host[:port][/path]` URL (port 443 if
/// absent; IPv6 hosts in brackets).
pub fn host_port(url: &str) -> Result<(String, u16)> {
    let bad = || BenchError::Invalid(format!("unsupported API server URL {url:?}"));
    let (scheme, rest) = url.split_once("://").ok_or_else(bad)?;
    let default_port = match scheme {
        "https" => 443,
        "http" => 80,
        _ => return Err(bad()),
    };
    let authority = rest.split('/').next().unwrap_or_default();
    if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or_else(bad)?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().map_err(|_| bad())?,
            None => default_port,
        };
        return Ok((host.to_string(), port));
    }
    match authority.rsplit_once(':') {
        Some((h, p)) => Ok((h.to_string(), p.parse().map_err(|_| bad())?)),
        None if !authority.is_empty() => Ok((authority.to_string(), default_port)),
        None => Err(bad()),
    }
}

/// Rewrites `kubeconfig` (read from `dir`) so its current cluster is
/// reached at `https://127.0.0.1:<port>` (the relay) while the server
/// certificate is still checked against the original host name, and
/// relative file paths keep pointing at the original files.
pub fn rewrite_for_relay(kubeconfig: &Value, dir: &Path, port: u16) -> Result<Value> {
    let (server, host, _) = current_server(kubeconfig)?;
    let scheme = server.split("://").next().unwrap_or("https");
    let mut doc = kubeconfig.clone();
    let ctx_name = doc["current-context"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let cluster_name = named(&doc, "contexts", &ctx_name)?["context"]["cluster"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if let Some(clusters) = doc["clusters"].as_sequence_mut() {
        for c in clusters {
            if c["name"].as_str() != Some(cluster_name.as_str()) {
                continue;
            }
            if let Some(m) = c["cluster"].as_mapping_mut() {
                m.insert(
                    "server".into(),
                    format!("{scheme}://127.0.0.1:{port}").into(),
                );
                if !m.contains_key("tls-server-name") && scheme == "https" {
                    m.insert("tls-server-name".into(), host.clone().into());
                }
                absolutize(m, &["certificate-authority"], dir);
            }
        }
    }
    if let Some(users) = doc["users"].as_sequence_mut() {
        for u in users {
            if let Some(m) = u["user"].as_mapping_mut() {
                absolutize(m, &["client-certificate", "client-key", "tokenFile"], dir);
            }
        }
    }
    Ok(doc)
}

fn absolutize(m: &mut serde_yaml::Mapping, keys: &[&str], dir: &Path) {
    for k in keys {
        if let Some(Value::String(p)) = m.get_mut(*k)
            && Path::new(p.as_str()).is_relative()
        {
            *p = dir.join(&*p).display().to_string();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KC: &str = r#"
apiVersion: v1
kind: Config
current-context: prod
contexts:
- name: other
  context: {cluster: c2, user: u}
- name: prod
  context: {cluster: c1, user: u}
clusters:
- name: c1
  cluster: {server: "https://api.example.test:6443", certificate-authority: ca.crt}
- name: c2
  cluster: {server: "https://10.0.0.1"}
users:
- name: u
  user: {client-certificate: certs/u.crt, client-key: /abs/u.key}
"#;

    #[test]
    fn urls() {
        assert_eq!(
            host_port("https://api.example.test:6443/x").expect("url"),
            ("api.example.test".into(), 6443)
        );
        assert_eq!(
            host_port("https://10.0.0.1").expect("url"),
            ("10.0.0.1".into(), 443)
        );
        assert_eq!(
            host_port("https://[fd00::1]:8443").expect("url"),
            ("fd00::1".into(), 8443)
        );
        assert_eq!(host_port("http://h").expect("url"), ("h".into(), 80));
        assert!(host_port("ftp://h").is_err());
        assert!(host_port("https://").is_err());
        assert!(host_port("https://h:port").is_err());
    }

    #[test]
    fn rewrites_the_current_cluster_only() {
        let doc: Value = serde_yaml::from_str(KC).expect("yaml");
        assert_eq!(
            current_server(&doc).expect("server"),
            (
                "https://api.example.test:6443".into(),
                "api.example.test".into(),
                6443
            )
        );
        let out = rewrite_for_relay(&doc, Path::new("/home/me/.kube"), 4000).expect("rewrite");
        let c1 = &out["clusters"][0]["cluster"];
        assert_eq!(c1["server"].as_str(), Some("https://127.0.0.1:4000"));
        assert_eq!(c1["tls-server-name"].as_str(), Some("api.example.test"));
        assert_eq!(
            c1["certificate-authority"].as_str(),
            Some("/home/me/.kube/ca.crt")
        );
        assert_eq!(
            out["clusters"][1]["cluster"]["server"].as_str(),
            Some("https://10.0.0.1")
        );
        let u = &out["users"][0]["user"];
        assert_eq!(
            u["client-certificate"].as_str(),
            Some("/home/me/.kube/certs/u.crt")
        );
        assert_eq!(u["client-key"].as_str(), Some("/abs/u.key"));
        let text = serde_yaml::to_string(&out).expect("yaml");
        kube::config::Kubeconfig::from_yaml(&text).expect("still a kubeconfig");
    }

    #[test]
    fn missing_context_is_an_error() {
        let doc: Value =
            serde_yaml::from_str("current-context: nope\ncontexts: []\n").expect("yaml");
        assert!(current_server(&doc).is_err());
    }
}

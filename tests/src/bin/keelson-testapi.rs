//! `keelson-testapi`: runs the keelson test API server alone (for the
//! demo, the benchmark and manual work with kubectl), or measures it with
//! `--bench`. It is a stand-in for kube-apiserver in tests, never a
//! control plane for real use.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use keelson_tests::testapi::{StaticToken, TestApiOptions, TestApiServer};
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

#[derive(Parser, Debug)]
#[command(
    name = "keelson-testapi",
    about = "Test API server with kube-apiserver semantics (for tests, benchmarks and the demo; not a control plane)"
)]
struct Cli {
    /// Plain HTTP listen address.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// TLS (HTTP/1.1 + h2) listen address.
    #[arg(long, default_value = "127.0.0.1:6443")]
    tls_listen: SocketAddr,
    /// Where to write the kubeconfig (HTTPS, CA embedded).
    #[arg(long)]
    kubeconfig_out: Option<PathBuf>,
    /// Require bearer tokens: TOKEN or TOKEN=USER (repeatable; the first
    /// goes into the kubeconfig). Without any, requests are anonymous.
    #[arg(long = "token")]
    tokens: Vec<String>,
    /// Service ClusterIP range.
    #[arg(long, default_value = "10.96.0.0/12")]
    service_cidr: String,
    /// Changes kept per resource for watch resumption.
    #[arg(long, default_value_t = 10_000)]
    watch_history: usize,
    /// Seconds between watch bookmarks.
    #[arg(long, default_value_t = 60)]
    bookmark_interval_seconds: u64,
    /// Extra DNS names or IPs for the serving certificate (repeatable).
    #[arg(long = "extra-san")]
    extra_sans: Vec<String>,
    /// Do not emulate controllers/admission (kubernetes Service, default
    /// ServiceAccounts, kube-root-ca.crt, pod admission).
    #[arg(long)]
    no_controllers: bool,
    /// Measure: load objects, time full lists and watch fan-out, print
    /// figures and exit.
    #[arg(long)]
    bench: bool,
    /// --bench: EndpointSlices to load.
    #[arg(long, default_value_t = 30_000)]
    bench_slices: usize,
    /// --bench: other objects (ConfigMaps) to load beside them.
    #[arg(long, default_value_t = 20_000)]
    bench_others: usize,
    /// --bench: concurrent watchers for the fan-out figure.
    #[arg(long, default_value_t = 300)]
    bench_watchers: usize,
}

fn options(cli: &Cli) -> Result<TestApiOptions> {
    let mut tokens = Vec::new();
    for t in &cli.tokens {
        let (token, user) = match t.split_once('=') {
            Some((t, u)) => (t.to_string(), u.to_string()),
            None => (t.clone(), "admin".to_string()),
        };
        if token.is_empty() {
            bail!("--token: empty token in {t:?}");
        }
        tokens.push(StaticToken { token, user });
    }
    Ok(TestApiOptions {
        http_listen: cli.listen,
        https_listen: cli.tls_listen,
        tokens,
        watch_history: cli.watch_history,
        bookmark_interval: Duration::from_secs(cli.bookmark_interval_seconds.max(1)),
        emulate_controllers: !cli.no_controllers,
        service_cidr: cli.service_cidr.clone(),
        kubeconfig_path: cli.kubeconfig_out.clone(),
        extra_sans: cli.extra_sans.clone(),
        ..TestApiOptions::default()
    })
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let mut opts = options(&cli)?;
    if cli.bench {
        opts.http_listen = SocketAddr::from(([127, 0, 0, 1], 0));
        opts.https_listen = SocketAddr::from(([127, 0, 0, 1], 0));
        return bench(&cli, opts).await;
    }
    let server = TestApiServer::start(opts)
        .await
        .context("starting the test API server")?;
    println!("keelson-testapi (test stand-in for kube-apiserver, not for real use)");
    println!("http:       {}", server.http_url());
    println!("https:      {}", server.https_url());
    println!("kubeconfig: {}", server.kubeconfig_path().display());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("stopping");
    server.stop();
    Ok(())
}

fn slice(i: usize) -> EndpointSlice {
    let svc = format!("svc-{}", i / 2);
    serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": format!("{svc}-{}", i % 2), "namespace": "default",
                      "labels": {"kubernetes.io/service-name": svc, "endpointslice.kubernetes.io/managed-by": "bench"}},
        "addressType": "IPv4",
        "endpoints": (0..4).map(|e| json!({
            "addresses": [format!("10.{}.{}.{}", (i >> 8) & 255, i & 255, e + 1)],
            "conditions": {"ready": true, "serving": true, "terminating": false},
            "nodeName": format!("node-{}", e), "zone": "zone-a",
            "targetRef": {"kind": "Pod", "namespace": "default", "name": format!("pod-{i}-{e}")}
        })).collect::<Vec<_>>(),
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
    }))
    .unwrap_or_default()
}

async fn bench(cli: &Cli, opts: TestApiOptions) -> Result<()> {
    let server = TestApiServer::start(opts).await?;
    let client = server.try_client().await?;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), "default");
    let t0 = Instant::now();
    futures::stream::iter(0..cli.bench_slices)
        .map(|i| {
            let slices = slices.clone();
            async move {
                slices
                    .create(&PostParams::default(), &slice(i))
                    .await
                    .map(|_| ())
            }
        })
        .buffer_unordered(64)
        .try_collect::<Vec<_>>()
        .await
        .context("creating EndpointSlices")?;
    futures::stream::iter(0..cli.bench_others)
        .map(|i| {
            let cms = cms.clone();
            async move {
                let cm = serde_json::from_value(json!({"metadata": {"name": format!("cm-{i}")}, "data": {"k": "v".repeat(200)}}))
                    .unwrap_or_default();
                cms.create(&PostParams::default(), &cm).await.map(|_| ())
            }
        })
        .buffer_unordered(64)
        .try_collect::<Vec<_>>()
        .await
        .context("creating ConfigMaps")?;
    let load = t0.elapsed();
    println!(
        "loaded {} objects ({} EndpointSlices + {} ConfigMaps + seed) in {:.1}s ({:.0} creates/s over HTTPS)",
        server.object_count(),
        cli.bench_slices,
        cli.bench_others,
        load.as_secs_f64(),
        (cli.bench_slices + cli.bench_others) as f64 / load.as_secs_f64()
    );

    // Full list, raw bytes over plain HTTP/1.1 (server + transfer).
    let url = format!(
        "{}/apis/discovery.k8s.io/v1/endpointslices",
        server.http_url()
    );
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let mut raw = Vec::new();
    let mut size = 0;
    for _ in 0..5 {
        let t = Instant::now();
        let resp = http
            .get(url.parse().context("url")?)
            .await
            .context("GET list")?;
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .context("body")?
            .to_bytes();
        raw.push(t.elapsed());
        size = body.len();
    }
    // Full list with kube (HTTPS + JSON decoding into typed objects).
    let mut typed = Vec::new();
    let mut n = 0;
    for _ in 0..3 {
        let t = Instant::now();
        let l = slices
            .list(&ListParams::default())
            .await
            .context("kube list")?;
        typed.push(t.elapsed());
        n = l.items.len();
    }
    let best = |v: &[Duration]| v.iter().min().copied().unwrap_or_default();
    println!(
        "full list of {} EndpointSlices ({:.1} MB): raw HTTP best {:.0} ms (all: {:?}); kube typed list best {:.0} ms",
        n,
        size as f64 / 1e6,
        best(&raw).as_secs_f64() * 1e3,
        raw.iter().map(|d| d.as_millis()).collect::<Vec<_>>(),
        best(&typed).as_secs_f64() * 1e3
    );

    // Watch fan-out: N watchers on endpointslices, 1000 updates.
    let watchers = cli.bench_watchers;
    let updates = 1000usize;
    let rv = slices
        .list_metadata(&ListParams::default().limit(1))
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let done = Arc::new(tokio::sync::Barrier::new(watchers + 1));
    let mut handles = Vec::new();
    for _ in 0..watchers {
        let slices = slices.clone();
        let rv = rv.clone();
        let done = done.clone();
        handles.push(tokio::spawn(async move {
            let mut seen = 0usize;
            let mut stream = match slices
                .watch(&WatchParams::default().timeout(120), &rv)
                .await
            {
                Ok(s) => s.boxed(),
                Err(_) => return seen,
            };
            done.wait().await;
            while let Some(ev) = stream.next().await {
                if let Ok(WatchEvent::Modified(_)) = ev {
                    seen += 1;
                    if seen == updates {
                        break;
                    }
                }
            }
            seen
        }));
    }
    done.wait().await;
    let t = Instant::now();
    for i in 0..updates {
        let mut s = slice(i);
        s.metadata
            .labels
            .get_or_insert_default()
            .insert("bench".into(), "1".into());
        slices
            .replace(
                s.metadata.name.as_deref().unwrap_or_default(),
                &PostParams::default(),
                &s,
            )
            .await?;
    }
    let write = t.elapsed();
    let mut total = 0;
    for h in handles {
        total += h.await.unwrap_or(0);
    }
    let all = t.elapsed();
    println!(
        "watch fan-out: {watchers} watchers x {updates} updates = {total} events delivered (expected {}); writes took {:.0} ms, all delivered after {:.0} ms",
        watchers * updates,
        write.as_secs_f64() * 1e3,
        all.as_secs_f64() * 1e3
    );
    Ok(())
}

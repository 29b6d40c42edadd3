//! The fake runtime's listener: a hand-rolled accept loop (rather than
//! tonic's `Server`) so that "the runtime went away" can be simulated
//! exactly: every connection and every in-flight call is dropped at once
//! and the socket disappears, as when containerd is killed.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::UnixListener;
use tokio::task::AbortHandle;
use tonic::service::Routes;

use super::lock;

/// Spawns tasks and can abort all of them; also hyper's executor, so the
/// per-stream tasks of HTTP/2 connections are tracked too.
#[derive(Clone, Default)]
struct Tracker(Arc<Mutex<Vec<AbortHandle>>>);

impl Tracker {
    fn spawn<F>(&self, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let handle = tokio::spawn(fut).abort_handle();
        let mut handles = lock(&self.0);
        handles.retain(|h| !h.is_finished());
        handles.push(handle);
    }

    fn abort_all(&self) {
        for handle in lock(&self.0).drain(..) {
            handle.abort();
        }
    }
}

impl<F> hyper::rt::Executor<F> for Tracker
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        self.spawn(async move {
            fut.await;
        });
    }
}

/// A running listener; dropping it closes every connection and removes the
/// socket file.
pub(crate) struct Serving {
    tracker: Tracker,
    path: PathBuf,
}

impl Serving {
    /// Binds `path` (replacing a stale socket file) and serves `routes`.
    pub(crate) fn start(path: &Path, routes: Routes) -> std::io::Result<Serving> {
        if path.exists() {
            std::fs::remove_file(path)?;
        }
        let listener = UnixListener::bind(path)?;
        let tracker = Tracker::default();
        let conns = tracker.clone();
        tracker.spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        let service = TowerToHyperService::new(routes.clone());
                        let executor = conns.clone();
                        conns.spawn(async move {
                            let builder = auto::Builder::new(executor).http2_only();
                            if let Err(error) = builder
                                .serve_connection(TokioIo::new(stream), service)
                                .await
                            {
                                tracing::debug!(%error, "fake CRI connection ended");
                            }
                        });
                    }
                    Err(error) => {
                        tracing::warn!(%error, "fake CRI accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
        });
        Ok(Serving {
            tracker,
            path: path.to_path_buf(),
        })
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.tracker.abort_all();
        if let Err(error) = std::fs::remove_file(&self.path)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.path.display(), %error, "removing fake CRI socket");
        }
    }
}

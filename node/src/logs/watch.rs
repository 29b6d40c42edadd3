//! One inotify instance for every `logs -f` follower: followers subscribe
//! to their log's directory and are woken when anything in it changes
//! (kubelet gives each follower its own fsnotify watcher; the kernel's
//! default limit of 128 inotify instances per user would then cap the
//! followers, so keelson shares one). Without inotify, followers poll
//! every second (kubelet's `logForceCheckPeriod` is the fallback in both).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use tokio::sync::watch;

struct Entry {
    wd: WatchDescriptor,
    tx: watch::Sender<u64>,
    users: usize,
}

struct Inner {
    fd: Option<Arc<Inotify>>,
    dirs: Mutex<(HashMap<PathBuf, Entry>, HashMap<WatchDescriptor, PathBuf>)>,
}

/// The shared watcher; cheap to clone.
#[derive(Clone)]
pub struct DirWatcher {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for DirWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirWatcher")
            .field("inotify", &self.inner.fd.is_some())
            .finish()
    }
}

/// A follower's subscription; dropping it removes the watch when it was
/// the directory's last.
pub struct Subscription {
    watcher: DirWatcher,
    dir: PathBuf,
    rx: Option<watch::Receiver<u64>>,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("dir", &self.dir)
            .finish()
    }
}

impl Subscription {
    /// Waits for a change in the directory or `timeout`, whichever first.
    pub async fn wait(&mut self, timeout: std::time::Duration) {
        match &mut self.rx {
            Some(rx) => {
                let _ = tokio::time::timeout(timeout, rx.changed()).await;
            }
            None => tokio::time::sleep(timeout).await,
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if self.rx.is_none() {
            return;
        }
        let mut dirs = self
            .watcher
            .inner
            .dirs
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let remove = match dirs.0.get_mut(&self.dir) {
            Some(e) => {
                e.users = e.users.saturating_sub(1);
                e.users == 0
            }
            None => false,
        };
        if remove && let Some(e) = dirs.0.remove(&self.dir) {
            dirs.1.remove(&e.wd);
            if let Some(fd) = &self.watcher.inner.fd {
                let _ = fd.rm_watch(e.wd);
            }
        }
    }
}

impl DirWatcher {
    /// Starts the watcher (one thread reads the events).
    pub fn start() -> DirWatcher {
        let fd = Inotify::init(InitFlags::IN_CLOEXEC)
            .map_err(|e| tracing::warn!(error = %e, "inotify unavailable; log followers poll every second"))
            .ok()
            .map(Arc::new);
        let w = DirWatcher {
            inner: Arc::new(Inner {
                fd,
                dirs: Mutex::new((HashMap::new(), HashMap::new())),
            }),
        };
        if let Some(fd) = w.inner.fd.clone() {
            // One plain thread blocks on the inotify fd for every follower
            // (tokio's AsyncFd constructors are deprecated or unsafe).
            let weak = Arc::downgrade(&w.inner);
            let spawned = std::thread::Builder::new()
                .name("log-inotify".into())
                .spawn(move || {
                    loop {
                        let events = match fd.read_events() {
                            Ok(ev) => ev,
                            Err(nix::errno::Errno::EINTR) => continue,
                            Err(e) => {
                                tracing::warn!(error = %e, "reading inotify events; followers fall back to polling");
                                return;
                            }
                        };
                        let Some(inner) = weak.upgrade() else { return };
                        let dirs = inner.dirs.lock().unwrap_or_else(|p| p.into_inner());
                        for ev in events {
                            if let Some(dir) = dirs.1.get(&ev.wd)
                                && let Some(e) = dirs.0.get(dir)
                            {
                                e.tx.send_modify(|v| *v = v.wrapping_add(1));
                            }
                        }
                    }
                });
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "cannot start the inotify thread; log followers poll every second");
            }
        }
        w
    }

    /// Subscribes to changes in `dir`.
    pub fn subscribe(&self, dir: &Path) -> Subscription {
        let mut sub = Subscription {
            watcher: self.clone(),
            dir: dir.to_path_buf(),
            rx: None,
        };
        let Some(fd) = &self.inner.fd else {
            return sub;
        };
        let mut dirs = self.inner.dirs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = dirs.0.get_mut(dir) {
            e.users += 1;
            sub.rx = Some(e.tx.subscribe());
            return sub;
        }
        let flags = AddWatchFlags::IN_MODIFY
            | AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_ATTRIB;
        match fd.add_watch(dir, flags) {
            Ok(wd) => {
                let (tx, rx) = watch::channel(0);
                dirs.1.insert(wd, dir.to_path_buf());
                dirs.0.insert(dir.to_path_buf(), Entry { wd, tx, users: 1 });
                sub.rx = Some(rx);
            }
            Err(e) => {
                tracing::debug!(dir = %dir.display(), error = %e, "cannot watch log directory; polling");
            }
        }
        sub
    }
}

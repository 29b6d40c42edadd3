//! The plugin directory watcher (`pluginwatcher/plugin_watcher.go`):
//! inotify on `plugins_registry` and every subdirectory; sockets created
//! there enter the desired state, removed ones leave it. The non-blocking
//! inotify queue is drained every 200 ms (tokio offers no safe way left to
//! register a raw fd): well within the reconciler's 1 s period, so a
//! plugin registers as soon as with kubelet's fsnotify.

use std::collections::BTreeMap;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use tokio_util::sync::CancellationToken;

use super::registry::DesiredState;

/// How often the inotify queue is drained.
const POLL: std::time::Duration = std::time::Duration::from_millis(200);

fn io_err(e: nix::Error) -> std::io::Error {
    std::io::Error::from_raw_os_error(e as i32)
}

struct Watcher {
    fd: Inotify,
    dirs: BTreeMap<WatchDescriptor, PathBuf>,
    desired: DesiredState,
}

impl Watcher {
    fn watch_dir(&mut self, dir: &Path) -> Result<(), std::io::Error> {
        let wd = self
            .fd
            .add_watch(
                dir,
                AddWatchFlags::IN_CREATE
                    | AddWatchFlags::IN_DELETE
                    | AddWatchFlags::IN_MOVED_FROM
                    | AddWatchFlags::IN_MOVED_TO,
            )
            .map_err(io_err)?;
        self.dirs.insert(wd, dir.to_path_buf());
        Ok(())
    }

    /// `traversePluginDir`: watch `dir` and its subdirectories, register
    /// the sockets found.
    fn traverse(&mut self, dir: &Path) -> Result<(), std::io::Error> {
        self.watch_dir(dir)?;
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(path = %dir.display(), error = %e, "error accessing path");
                return Ok(());
            }
        };
        for entry in entries.flatten() {
            self.handle_create(&entry.path());
        }
        Ok(())
    }

    /// `handleCreateEvent`.
    fn handle_create(&mut self, path: &Path) {
        let Ok(meta) = std::fs::metadata(path) else {
            return;
        };
        if path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with('.'))
        {
            return;
        }
        if meta.is_dir() {
            if let Err(e) = self.traverse(path) {
                tracing::error!(path = %path.display(), error = %e, "failed to watch plugin directory");
            }
        } else if meta.file_type().is_socket() {
            tracing::info!(path = %path.display(), "adding socket path or updating timestamp to desired state cache");
            self.desired.add_or_update(path);
        }
    }

    async fn run(mut self, stop: CancellationToken) {
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let events = match self.fd.read_events() {
                Ok(ev) => ev,
                Err(nix::Error::EAGAIN) => continue,
                Err(e) => {
                    tracing::error!(error = %e, "plugin watcher: reading inotify events failed");
                    return;
                }
            };
            for ev in events {
                let (Some(dir), Some(name)) = (self.dirs.get(&ev.wd).cloned(), ev.name) else {
                    continue;
                };
                let path = dir.join(name);
                if ev
                    .mask
                    .intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO)
                {
                    self.handle_create(&path);
                } else if ev
                    .mask
                    .intersects(AddWatchFlags::IN_DELETE | AddWatchFlags::IN_MOVED_FROM)
                {
                    tracing::info!(path = %path.display(), "removing socket path from desired state cache");
                    self.desired.remove(&path);
                }
            }
        }
    }
}

/// Creates `dir` (0755), walks it and watches it until `stop`.
pub(crate) fn start(
    dir: &Path,
    desired: DesiredState,
    stop: CancellationToken,
) -> Result<(), std::io::Error> {
    std::fs::create_dir_all(dir)?;
    let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).map_err(io_err)?;
    let mut w = Watcher {
        fd: inotify,
        dirs: BTreeMap::new(),
        desired,
    };
    w.traverse(dir)?;
    tokio::spawn(w.run(stop));
    Ok(())
}

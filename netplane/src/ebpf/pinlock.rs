//! Exclusive use of a pin directory.
//!
//! The socket LB's state lives in bpffs, not in keelson's memory or in a
//! network namespace: a second keelson given the same `bpffsPath` (a
//! restart that overlaps the running instance, two instances on one host)
//! would adopt the same pinned maps and write them with its own service
//! ids and slot generations. Each overwrites the other's slot tables:
//! backends go missing from a service, removed ones stay, and the programs
//! attached by the last one to start translate with the mixture. So a
//! keelson holds an exclusive lock on its pin directory while it runs, and
//! a second one waits for it.

use std::fs::File;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use super::error::EbpfError;

/// How long a starting socket LB waits for the pins held by another
/// keelson (the previous instance finishing its shutdown) before it gives
/// up.
pub const PIN_LOCK_WAIT: Duration = Duration::from_secs(60);

/// The lock on a pin directory; released when dropped.
#[derive(Debug)]
pub struct PinLock {
    _lock: Flock<File>,
}

fn open_dir(dir: &Path) -> Result<File, EbpfError> {
    File::open(dir).map_err(|e| EbpfError::io("opening the pin directory", dir, e))
}

/// Tries once: `Ok(None)` when another process holds the lock.
pub fn try_lock(dir: &Path) -> Result<Option<PinLock>, EbpfError> {
    match Flock::lock(open_dir(dir)?, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(Some(PinLock { _lock: lock })),
        Err((_, Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, e)) => Err(EbpfError::io(
            "locking the pin directory",
            dir,
            std::io::Error::from(e),
        )),
    }
}

/// Locks `dir`, waiting up to `wait` for another keelson to release it.
pub fn lock(dir: &Path, wait: Duration) -> Result<PinLock, EbpfError> {
    let start = Instant::now();
    let mut warned_at: Option<Instant> = None;
    loop {
        if let Some(lock) = try_lock(dir)? {
            if warned_at.is_some() {
                tracing::info!(pins = %dir.display(), waited = ?start.elapsed(), "pin directory released; continuing");
            }
            return Ok(lock);
        }
        if start.elapsed() >= wait {
            return Err(EbpfError::io(
                "another keelson holds the pin directory (each instance needs its own proxy.ebpf.bpffsPath)",
                dir,
                std::io::Error::from(std::io::ErrorKind::WouldBlock),
            ));
        }
        if warned_at.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
            tracing::warn!(pins = %dir.display(), "another keelson holds the pin directory; waiting for it to stop");
            warned_at = Some(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether the lock is held by someone else (for `cleanup`: a running
/// keelson must be stopped first).
pub fn held_elsewhere(dir: &Path) -> Result<bool, EbpfError> {
    if !dir.exists() {
        return Ok(false);
    }
    Ok(try_lock(dir)?.is_none())
}

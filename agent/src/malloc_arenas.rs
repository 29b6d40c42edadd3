//! glibc malloc arenas: at most two for the whole process.
//!
//! glibc gives threads that contend for the allocator arenas of their own,
//! up to eight per core. Each arena keeps its own free lists, so memory
//! freed by one thread is not reused by the next one that allocates on
//! another arena, and the process's resident memory stays near the sum of
//! the arenas' peaks. keelson's allocations are bursts on a handful of
//! threads (the async workers, blocking-pool threads, the netlink writer):
//! with two arenas the proxy role's peak RSS at 1,000 Services × 10
//! endpoints went from 38.6 to 33.6 MiB (`keelson-bench`, docs/benchmarks.md);
//! its sync and programming latencies stayed within the run-to-run noise,
//! and so did pod startup at 100 pods (`pod-startup-bench`).
//!
//! An operator's own `MALLOC_ARENA_MAX` (read by glibc at start) wins:
//! nothing is changed when it is set. Other C libraries (musl) have no
//! arenas, and there this does nothing.

/// The arena limit keelson sets when the environment does not set one.
pub const MAX_ARENAS: i32 = 2;

/// Limits glibc's malloc arenas to [`MAX_ARENAS`], unless `MALLOC_ARENA_MAX`
/// is set. Call it first in `main`, before any thread is started. Returns
/// whether the limit was applied.
pub fn limit() -> bool {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return false;
    }
    apply(MAX_ARENAS)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)] // one FFI call into glibc, nothing else
fn apply(arenas: i32) -> bool {
    // SAFETY: mallopt takes two integers and only changes the allocator's
    // tunables; M_ARENA_MAX is a valid parameter of glibc's mallopt (since
    // 2.10), and no pointer is passed or returned.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, arenas) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn apply(_arenas: i32) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glibc_accepts_the_limit() {
        // mallopt answers 1 when it takes the value; later allocations
        // keep working.
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        assert!(apply(MAX_ARENAS));
        let v: Vec<u8> = vec![1; 1 << 20];
        assert_eq!(v.iter().map(|&b| b as usize).sum::<usize>(), 1 << 20);
    }
}

//! Why a garbage collection did not finish, worded as kubelet words it
//! (`pkg/kubelet/images/image_gc_manager.go`,
//! `pkg/kubelet/kuberuntime/kuberuntime_gc.go`): the eviction manager logs
//! these when its node-level reclaim fails, and image GC's last two are
//! also Warning events on the Node.

use std::fmt;
use std::time::Duration;

use keelson_cri::CriError;

/// A failed collection.
#[derive(Debug, thiserror::Error)]
pub enum GcError {
    /// A runtime call failed.
    #[error(transparent)]
    Runtime(#[from] CriError),
    /// CRI ImageFsInfo names no image filesystem.
    #[error("the runtime reports no image filesystem")]
    NoImageFs,
    /// The image filesystem could not be measured.
    #[error("statvfs {mount}: {error}")]
    Statvfs {
        /// Its mount point.
        mount: String,
        /// The system's error.
        error: nix::errno::Errno,
    },
    /// The image filesystem reports no capacity.
    #[error("invalid capacity 0 on image filesystem")]
    ZeroCapacity,
    /// The pod log directory could not be listed.
    #[error("failed to read podLogsDirectory {path:?}: {error}")]
    PodLogsDirectory {
        /// The directory.
        path: String,
        /// The system's error.
        error: std::io::Error,
    },
    /// Some images could not be removed while freeing space.
    #[error(
        "wanted to free {wanted} bytes, but freed {freed} bytes space with errors in image deletion: {errors}"
    )]
    FreeSpace {
        /// Bytes asked for.
        wanted: u64,
        /// Bytes freed.
        freed: u64,
        /// The removals that failed.
        errors: Errors,
    },
    /// Some images past `imageMaximumGCAge` could not be removed.
    #[error(
        "wanted to free images older than {max_age:?}, encountered errors in image deletion: {errors}"
    )]
    FreeOldImages {
        /// `imageMaximumGCAge`.
        max_age: Duration,
        /// The removals that failed.
        errors: Errors,
    },
    /// Not enough unused images to reach the low threshold.
    #[error(
        "Failed to garbage collect required amount of images. Attempted to free {wanted} bytes, but only found {freed} bytes eligible to free."
    )]
    NotEnoughFreed {
        /// Bytes asked for.
        wanted: u64,
        /// Bytes freed.
        freed: u64,
    },
    /// Several steps of one collection failed.
    #[error("{0}")]
    Several(Errors),
}

/// Several errors, printed as apimachinery's aggregate (`[a, b]`, one
/// alone as itself, repeats once).
#[derive(Debug)]
pub struct Errors(pub Vec<GcError>);

impl fmt::Display for Errors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let texts: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&crate::status::conditions::aggregate(&texts).unwrap_or_default())
    }
}

impl GcError {
    /// `errors` as one error: none, itself alone, or [`GcError::Several`].
    pub fn aggregate(mut errors: Vec<GcError>) -> Result<(), GcError> {
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(GcError::Several(Errors(errors))),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn aggregates_like_apimachinery() {
        assert!(GcError::aggregate(Vec::new()).is_ok());
        let one = GcError::aggregate(vec![GcError::NoImageFs]).unwrap_err();
        assert_eq!(one.to_string(), "the runtime reports no image filesystem");
        let two = GcError::aggregate(vec![GcError::NoImageFs, GcError::ZeroCapacity]).unwrap_err();
        assert_eq!(
            two.to_string(),
            "[the runtime reports no image filesystem, invalid capacity 0 on image filesystem]"
        );
        let same = GcError::aggregate(vec![GcError::NoImageFs, GcError::NoImageFs]).unwrap_err();
        assert_eq!(same.to_string(), "the runtime reports no image filesystem");
    }
}

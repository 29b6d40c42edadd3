//! Volume ownership for `securityContext.fsGroup` (kubelet's
//! `SetVolumeOwnership`): every entry of the volume gets the group, files
//! gain group read (and write, unless the volume is read-only) and
//! directories also gain setgid and search, so the pod's group can use what
//! the volume holds. Symlinks change group but never mode.
//!
//! Also: which user owns projected files (`FsUserFrom`).

use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use k8s_openapi::api::core::v1::{Container, Pod};

const RW_MASK: u32 = 0o660;
const RO_MASK: u32 = 0o440;
const EXEC_MASK: u32 = 0o110;
const SETGID: u32 = 0o2000;

/// Applies `fs_group` to everything under `dir` (included). Failures on
/// single entries are logged and skipped, as kubelet does; only a failure
/// to walk the tree is an error.
pub fn set_volume_ownership(dir: &Path, fs_group: Option<u32>, read_only: bool) -> io::Result<()> {
    let Some(gid) = fs_group else {
        return Ok(());
    };
    walk(dir, &mut |path, meta| {
        change_permission(path, meta, gid, read_only)
    })
}

/// `fsGroupChangePolicy: OnRootMismatch`: the recursive change is skipped
/// when the volume's root already has the group, the permissions and the
/// setgid bit it would get (pkg/volume/volume_linux.go,
/// `skipPermissionChange`, `requiresPermissionChange`). Any other policy
/// (`Always`, unset) always walks the volume.
pub fn skip_permission_change(
    dir: &Path,
    gid: u32,
    read_only: bool,
    change_policy: Option<&str>,
) -> bool {
    if change_policy != Some("OnRootMismatch") {
        return false;
    }
    let Ok(meta) = std::fs::metadata(dir) else {
        return false;
    };
    if meta.gid() != gid || !meta.is_dir() {
        return false;
    }
    let wanted = if read_only { RO_MASK } else { RW_MASK } | EXEC_MASK;
    let perm = meta.mode() & 0o777;
    perm & wanted == wanted && meta.mode() & SETGID != 0
}

/// The pod's `securityContext.fsGroupChangePolicy`.
pub fn fs_group_change_policy_from(pod: &Pod) -> Option<String> {
    pod.spec
        .as_ref()?
        .security_context
        .as_ref()?
        .fs_group_change_policy
        .clone()
}

fn walk(path: &Path, f: &mut dyn FnMut(&Path, &std::fs::Metadata)) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    f(path, &meta);
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            walk(&entry?.path(), f)?;
        }
    }
    Ok(())
}

fn change_permission(path: &Path, meta: &std::fs::Metadata, gid: u32, read_only: bool) {
    if let Err(e) = std::os::unix::fs::lchown(path, None, Some(gid)) {
        tracing::error!(path = %path.display(), error = %e, "lchown failed");
    }
    if meta.file_type().is_symlink() {
        return;
    }
    let mut mask = if read_only { RO_MASK } else { RW_MASK };
    if meta.is_dir() {
        mask |= SETGID | EXEC_MASK;
    }
    let mode = (meta.mode() & 0o7777) | mask;
    if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)) {
        tracing::error!(path = %path.display(), error = %e, "chmod failed");
    }
}

/// The user every container of the pod (init and regular) runs as, when
/// they all agree and each sets one (container `runAsUser` over the pod's);
/// projected files are then owned by that user.
pub fn fs_user_from(pod: &Pod) -> Option<u32> {
    let spec = pod.spec.as_ref()?;
    let pod_user = spec.security_context.as_ref().and_then(|s| s.run_as_user);
    let effective = |c: &Container| {
        c.security_context
            .as_ref()
            .and_then(|s| s.run_as_user)
            .or(pod_user)
    };
    let mut user: Option<i64> = None;
    for c in spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
    {
        let u = effective(c)?;
        match user {
            Some(prev) if prev != u => return None,
            _ => user = Some(u),
        }
    }
    user.and_then(|u| u32::try_from(u).ok())
}

/// The pod's `securityContext.fsGroup`.
pub fn fs_group_from(pod: &Pod) -> Option<u32> {
    pod.spec
        .as_ref()?
        .security_context
        .as_ref()?
        .fs_group
        .and_then(|g| u32::try_from(g).ok())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSecurityContext, PodSpec, SecurityContext};

    #[test]
    fn masks_files_dirs_and_skips_symlink_modes() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("v");
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(d.join("f"), "x").unwrap();
        std::fs::set_permissions(d.join("f"), std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink("f", d.join("l")).unwrap();

        set_volume_ownership(&d, Some(1234), true).unwrap();
        let m = |p: &str| std::fs::symlink_metadata(d.join(p)).unwrap();
        assert_eq!(m("").mode() & 0o7777, 0o2755);
        assert_eq!(m("f").mode() & 0o7777, 0o640);
        assert_eq!(m("f").gid(), 1234);
        assert_eq!(m("l").gid(), 1234);

        set_volume_ownership(&d, Some(1234), false).unwrap();
        assert_eq!(m("f").mode() & 0o7777, 0o660);
        assert_eq!(m("").mode() & 0o7777, 0o2775);
    }

    #[test]
    fn on_root_mismatch_skips_only_a_root_already_right() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("v");
        std::fs::create_dir(&d).unwrap();
        let gid = std::fs::metadata(&d).unwrap().gid();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        // Mode lacks group write and setgid.
        assert!(!skip_permission_change(
            &d,
            gid,
            false,
            Some("OnRootMismatch")
        ));
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o2770)).unwrap();
        assert!(skip_permission_change(
            &d,
            gid,
            false,
            Some("OnRootMismatch")
        ));
        assert!(!skip_permission_change(&d, gid, false, Some("Always")));
        assert!(!skip_permission_change(&d, gid, false, None));
        assert!(!skip_permission_change(
            &d,
            gid + 1,
            false,
            Some("OnRootMismatch")
        ));
    }

    #[test]
    fn fs_user_needs_agreement() {
        let c = |u: Option<i64>| Container {
            name: "c".into(),
            security_context: u.map(|u| SecurityContext {
                run_as_user: Some(u),
                ..Default::default()
            }),
            ..Default::default()
        };
        let pod = |pod_user: Option<i64>, cs: Vec<Container>| Pod {
            spec: Some(PodSpec {
                security_context: Some(PodSecurityContext {
                    run_as_user: pod_user,
                    fs_group: Some(2000),
                    ..Default::default()
                }),
                containers: cs,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            fs_user_from(&pod(Some(1000), vec![c(None), c(Some(1000))])),
            Some(1000)
        );
        assert_eq!(
            fs_user_from(&pod(Some(1000), vec![c(None), c(Some(1001))])),
            None
        );
        assert_eq!(fs_user_from(&pod(None, vec![c(None)])), None);
        assert_eq!(fs_group_from(&pod(None, vec![])), Some(2000));
    }
}

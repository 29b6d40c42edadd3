//! `packaging/install.sh` against a temporary root (`DESTDIR`), never the
//! real /etc or systemd of this machine: systemctl is a recorder script.
//! Installing twice changes nothing the second time and keeps a locally
//! changed configuration; an upgrade replaces the binary by a rename; a
//! broken configuration stops the install with keelson's own message;
//! `--now` refuses while kubelet runs; uninstall (twice) removes what
//! install added and keeps /etc/keelson unless `--purge`, which refuses
//! while volumes are mounted below the root dir. The unit passes
//! `systemd-analyze verify`.

use keelson_tests::support::repo_root as repo;
use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A temporary root plus a systemctl that records its calls.
struct Root {
    dir: tempfile::TempDir,
    systemctl: PathBuf,
    calls: PathBuf,
}

impl Root {
    fn new() -> Root {
        let dir = tempfile::tempdir().expect("tempdir");
        let tools = dir.path().join("tools");
        std::fs::create_dir_all(&tools).expect("mkdir");
        let calls = tools.join("systemctl.calls");
        let systemctl = tools.join("systemctl");
        // `is-active` answers from $FAKE_ACTIVE (space separated units).
        std::fs::write(
            &systemctl,
            format!(
                "#!/bin/sh\necho \"$*\" >> '{}'\nif [ \"$1\" = is-active ]; then\n  for u in $FAKE_ACTIVE; do [ \"$u\" = \"$3\" ] && exit 0; done\n  exit 3\nfi\nif [ \"$1\" = is-enabled ]; then\n  for u in $FAKE_ENABLED; do [ \"$u\" = \"$3\" ] && exit 0; done\n  exit 1\nfi\nexit 0\n",
                calls.display()
            ),
        )
        .expect("write fake systemctl");
        std::fs::set_permissions(&systemctl, std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let root = Root {
            dir,
            systemctl,
            calls,
        };
        std::fs::create_dir_all(root.dest()).expect("mkdir dest");
        root
    }

    fn dest(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dest().join(p.trim_start_matches('/'))
    }

    fn run(&self, args: &[&str], active: &str) -> Output {
        self.run_with(args, active, "")
    }

    /// Runs install.sh with `active` and `enabled` units (space separated)
    /// as the fake systemctl reports them.
    fn run_with(&self, args: &[&str], active: &str, enabled: &str) -> Output {
        Command::new(repo().join("packaging/install.sh"))
            .args(args)
            .env("DESTDIR", self.dest())
            .env("SYSTEMCTL", &self.systemctl)
            .env("FAKE_ACTIVE", active)
            .env("FAKE_ENABLED", enabled)
            .stdin(Stdio::null())
            .output()
            .expect("install.sh runs")
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args, "");
        assert!(
            out.status.success(),
            "install.sh {args:?} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// systemctl calls since the last look.
    fn take_calls(&self) -> Vec<String> {
        let text = std::fs::read_to_string(&self.calls).unwrap_or_default();
        let _ = std::fs::remove_file(&self.calls);
        text.lines().map(str::to_string).collect()
    }

    /// Every file below the root with its mode and content digest.
    fn snapshot(&self) -> BTreeMap<String, (u32, u64, Vec<u8>)> {
        let mut out = BTreeMap::new();
        let mut stack = vec![self.dest()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
                let p = e.path();
                let md = std::fs::symlink_metadata(&p).expect("metadata");
                let rel = p
                    .strip_prefix(self.dest())
                    .expect("below")
                    .display()
                    .to_string();
                if md.is_dir() {
                    out.insert(rel, (md.mode(), 0, Vec::new()));
                    stack.push(p);
                } else {
                    out.insert(rel, (md.mode(), md.ino(), std::fs::read(&p).expect("read")));
                }
            }
        }
        out
    }
}

/// The built `keelson` binary: `$KEELSON_BIN`, else the target directory
/// this test binary was built into (`cargo build --workspace` puts it there).
fn keelson_bin() -> Result<PathBuf, String> {
    if let Ok(p) = std::env::var("KEELSON_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    exe.ancestors()
        .skip(1)
        .take(3)
        .map(|d| d.join("keelson"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            "keelson binary not found: cargo build -p keelson, or set KEELSON_BIN".to_string()
        })
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o7777
}

fn binary() -> String {
    keelson_bin()
        .expect("keelson binary built")
        .display()
        .to_string()
}

fn kubeconfig(dir: &Path, name: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, format!("# {name}\napiVersion: v1\nkind: Config\n")).expect("write");
    p.display().to_string()
}

#[test]
fn install_twice_keeps_local_config_and_uninstall_twice_leaves_config() {
    let r = Root::new();
    let bin = binary();
    let node_kc = kubeconfig(r.dir.path(), "node.kc");
    let proxy_kc = kubeconfig(r.dir.path(), "proxy.kc");
    let args = [
        "install",
        "--binary",
        &bin,
        "--node-kubeconfig",
        &node_kc,
        "--proxy-kubeconfig",
        &proxy_kc,
    ];
    let first = r.ok(&args);
    assert!(
        first.contains("installed /usr/local/bin/keelson"),
        "{first}"
    );
    assert_eq!(r.take_calls(), vec!["daemon-reload"]);

    let installed = r.path("/usr/local/bin/keelson");
    assert_eq!(
        std::fs::read(&installed).expect("binary"),
        std::fs::read(&bin).expect("built")
    );
    assert_eq!(mode(&installed), 0o755);
    assert_eq!(mode(&r.path("/etc/keelson/node.kubeconfig")), 0o600);
    assert_eq!(mode(&r.path("/etc/keelson/proxy.kubeconfig")), 0o600);
    assert_eq!(mode(&r.path("/var/lib/keelson")), 0o700);
    assert!(r.path("/var/log/pods").is_dir());
    let shipped = std::fs::read_to_string(repo().join("packaging/config.yaml")).expect("config");
    assert_eq!(
        std::fs::read_to_string(r.path("/etc/keelson/config.yaml")).expect("config"),
        shipped
    );
    assert_eq!(
        std::fs::read_to_string(r.path("/etc/systemd/system/keelson.service")).expect("unit"),
        std::fs::read_to_string(repo().join("packaging/keelson.service")).expect("unit"),
        "default prefix: the unit as shipped"
    );

    // Second run: nothing installed again, nothing changed (same inodes).
    let before = r.snapshot();
    let second = r.ok(&args);
    assert!(!second.contains("installed "), "{second}");
    assert_eq!(r.snapshot(), before);
    assert_eq!(r.take_calls(), vec!["daemon-reload"]);

    // A locally changed configuration survives a reinstall.
    let local = format!("{shipped}# changed on this node\n");
    std::fs::write(r.path("/etc/keelson/config.yaml"), &local).expect("edit");
    let third = r.ok(&args);
    assert!(third.contains("kept /etc/keelson/config.yaml"), "{third}");
    assert_eq!(
        std::fs::read_to_string(r.path("/etc/keelson/config.yaml")).expect("config"),
        local
    );
    assert_eq!(
        std::fs::read_to_string(r.path("/usr/local/share/keelson/config.yaml")).expect("default"),
        shipped
    );
    r.take_calls();

    // Uninstall: the unit is stopped and disabled, install's files go,
    // configuration and state stay; a second uninstall is a no-op.
    r.ok(&["uninstall"]);
    assert_eq!(
        r.take_calls(),
        vec!["disable --now keelson.service", "daemon-reload"]
    );
    for gone in [
        "/usr/local/bin/keelson",
        "/etc/systemd/system/keelson.service",
        "/usr/local/share/keelson",
        "/usr/local/share/doc/keelson",
    ] {
        assert!(!r.path(gone).exists(), "{gone} removed");
    }
    for kept in [
        "/etc/keelson/config.yaml",
        "/etc/keelson/node.kubeconfig",
        "/var/lib/keelson",
    ] {
        assert!(r.path(kept).exists(), "{kept} kept");
    }
    let again = r.ok(&["uninstall"]);
    assert!(!again.contains("removed"), "{again}");
    assert_eq!(
        r.take_calls(),
        vec!["daemon-reload"],
        "no unit left to disable"
    );

    r.ok(&["uninstall", "--purge"]);
    assert!(!r.path("/etc/keelson").exists());
    assert!(!r.path("/var/lib/keelson").exists());
    r.ok(&["uninstall", "--purge"]);
}

#[test]
fn prefix_upgrade_and_start() {
    let r = Root::new();
    let bin = binary();
    r.ok(&["--prefix", "/opt/keelson", "--binary", &bin, "--now"]);
    assert_eq!(
        r.take_calls(),
        vec![
            "is-active --quiet kubelet.service",
            "is-active --quiet kube-proxy.service",
            "is-enabled --quiet kubelet.service",
            "is-enabled --quiet kube-proxy.service",
            "daemon-reload",
            "enable keelson.service",
            "is-active --quiet keelson.service",
            "start keelson.service",
        ]
    );
    let unit =
        std::fs::read_to_string(r.path("/etc/systemd/system/keelson.service")).expect("unit");
    assert!(
        unit.lines().any(
            |l| l == "ExecStart=/opt/keelson/bin/keelson run --config /etc/keelson/config.yaml"
        ),
        "{unit}"
    );
    assert!(unit.contains("file:///opt/keelson/share/doc/keelson/install.md"));
    assert!(!unit.contains("/usr/local"), "{unit}");
    let target = r.path("/opt/keelson/bin/keelson");
    let old_inode = std::fs::metadata(&target).expect("installed").ino();

    // A new build replaces the binary through a rename (a running keelson
    // keeps its old inode) and a running unit is restarted.
    let newer = r.dir.path().join("keelson-newer");
    let mut bytes = std::fs::read(&bin).expect("binary");
    bytes.extend_from_slice(b"\0newer build\0");
    std::fs::write(&newer, &bytes).expect("write");
    std::fs::set_permissions(&newer, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let out = r.run(
        &[
            "--prefix",
            "/opt/keelson",
            "--binary",
            &newer.display().to_string(),
            "--now",
        ],
        "keelson.service",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(&target).expect("installed"), bytes);
    assert_ne!(
        std::fs::metadata(&target).expect("installed").ino(),
        old_inode
    );
    let calls = r.take_calls();
    assert_eq!(
        calls.last().map(String::as_str),
        Some("restart keelson.service"),
        "{calls:?}"
    );
    let leftovers: Vec<_> = std::fs::read_dir(r.path("/opt/keelson/bin"))
        .expect("bin dir")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(
        leftovers,
        vec![std::ffi::OsString::from("keelson")],
        "no temp files left"
    );
}

#[test]
fn now_refuses_while_kubelet_runs_and_installs_nothing() {
    let r = Root::new();
    let out = r.run(&["--binary", &binary(), "--now"], "kubelet.service");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("kubelet.service is active"), "{err}");
    assert!(!r.path("/usr/local/bin/keelson").exists());
    assert!(
        !r.take_calls()
            .iter()
            .any(|c| c.starts_with("start") || c.starts_with("enable"))
    );
}

#[test]
fn enable_refuses_while_kubelet_is_enabled_and_the_unit_conflicts_with_it() {
    let r = Root::new();
    let out = r.run_with(&["--binary", &binary(), "--enable"], "", "kubelet.service");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("kubelet.service is enabled"), "{err}");
    assert!(!r.path("/usr/local/bin/keelson").exists());
    assert!(!r.take_calls().iter().any(|c| c.starts_with("enable")));
    // Without --enable the files are installed (enabling is the operator's step).
    let out = r.run_with(&["--binary", &binary()], "", "kubelet.service");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let unit =
        std::fs::read_to_string(r.path("/etc/systemd/system/keelson.service")).expect("unit");
    assert!(
        unit.lines()
            .any(|l| l == "Conflicts=kubelet.service kube-proxy.service"),
        "{unit}"
    );
}

#[test]
fn invalid_config_stops_the_install_with_the_field_named() {
    let r = Root::new();
    std::fs::create_dir_all(r.path("/etc/keelson")).expect("mkdir");
    std::fs::write(
        r.path("/etc/keelson/config.yaml"),
        "apiVersion: keelson.dev/v1alpha1\nkind: KeelsonConfiguration\nnode:\n  maxPods: 0\n",
    )
    .expect("write");
    let out = r.run(&["--binary", &binary(), "--enable"], "");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("node.maxPods: must be greater than 0"),
        "{err}"
    );
    assert!(
        err.contains("/etc/keelson/config.yaml is not valid"),
        "{err}"
    );
    let calls = r.take_calls();
    assert!(
        calls.iter().all(|c| c.starts_with("is-")),
        "no systemctl action after a failed check (queries only): {calls:?}"
    );
}

#[test]
fn bad_arguments_are_refused() {
    let r = Root::new();
    for (args, msg) in [
        (vec!["--frobnicate"], "unknown argument: --frobnicate"),
        (
            vec!["--prefix", "relative"],
            "--prefix must be an absolute path",
        ),
        (vec!["--purge"], "--purge is an uninstall option"),
        (
            vec!["uninstall", "--now"],
            "uninstall takes only --prefix and --purge",
        ),
        (
            vec!["--binary", "/nonexistent/keelson"],
            "--binary /nonexistent/keelson: no such file",
        ),
    ] {
        let out = r.run(&args, "");
        assert!(!out.status.success(), "{args:?} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(msg), "{args:?}: {err}");
    }
    assert!(!r.path("/usr/local").exists());
    let help = Command::new(repo().join("packaging/install.sh"))
        .arg("--help")
        .output()
        .expect("runs");
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("uninstall [--prefix DIR] [--purge]"));
}

/// `--purge` must not `rm -rf` through a volume still mounted below the
/// root dir (a hostPath bind would take host data with it). The mount is
/// made in a private mount namespace, so the host never sees it.
#[test]
fn purge_refuses_while_volumes_are_mounted() {
    if !keelson_tests::support::require_root("purge_refuses_while_volumes_are_mounted") {
        return;
    }
    let r = Root::new();
    r.ok(&["--binary", &binary()]);
    let vol = r.path("/var/lib/keelson/pods/uid-1/volumes/kubernetes.io~empty-dir/cache");
    std::fs::create_dir_all(&vol).expect("mkdir");
    let script = format!(
        "mount -t tmpfs keelson-test '{vol}' && echo data > '{vol}/file' && '{sh}' uninstall --purge; rc=$?; test -f '{vol}/file' || rc=99; exit $rc",
        vol = vol.display(),
        sh = repo().join("packaging/install.sh").display()
    );
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .env("DESTDIR", r.dest())
        .env("SYSTEMCTL", &r.systemctl)
        .stdin(Stdio::null())
        .output()
        .expect("unshare runs");
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("volumes are still mounted below it"), "{err}");
    assert!(
        r.path("/etc/keelson/config.yaml").exists(),
        "nothing purged"
    );
    // Without the mount (the namespace is gone) the purge goes through.
    r.ok(&["uninstall", "--purge"]);
    assert!(!r.path("/var/lib/keelson").exists());
}

#[test]
fn unit_passes_systemd_analyze_verify() {
    let Ok(version) = Command::new("systemd-analyze").arg("--version").output() else {
        keelson_tests::support::skip(
            "unit_passes_systemd_analyze_verify",
            "systemd-analyze is not installed (Debian package systemd)",
        );
        return;
    };
    assert!(version.status.success());
    // The unit as installed for the built binary's location (verify checks
    // that ExecStart's program exists).
    let r = Root::new();
    let bin = keelson_bin().expect("keelson binary");
    let unit = std::fs::read_to_string(repo().join("packaging/keelson.service"))
        .expect("unit")
        .replace("/usr/local/bin/keelson", &bin.display().to_string());
    let path = r.dir.path().join("keelson.service");
    std::fs::write(&path, unit).expect("write");
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .expect("systemd-analyze runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let complaints: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("keelson.service"))
        .collect();
    assert!(complaints.is_empty(), "systemd-analyze: {complaints:?}");
}

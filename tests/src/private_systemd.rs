//! A real systemd (the distribution's, Debian 12's v252) as PID 1 of
//! private PID, mount, cgroup, network, IPC and UTS namespaces, with its
//! own D-Bus system bus, so that the `systemd` cgroup driver is tested
//! against the real unit manager: keelson's slices, containerd's
//! `SystemdCgroup = true` scopes, real cgroup files.
//!
//! It must not touch the host. A first try without the isolation below
//! let systemd pull in `sysinit.target`, whose `systemd-tmpfiles --boot
//! --remove` emptied the host's `/tmp` and whose journal and utmp
//! services wrote under `/var/log`. So:
//!
//! - **Units**: `SYSTEMD_UNIT_PATH` names a test directory holding only
//!   three units of ours: the target it boots (no default dependencies)
//!   and `dbus.socket`/`dbus.service`. None of the host's units (sysinit,
//!   tmpfiles, journald, sysctl, udev, getty) can even be loaded.
//! - **cgroups**: a test-owned subtree `keelson-systemd-<suffix>` in every
//!   hierarchy; systemd's cgroup namespace is rooted there and its mount
//!   namespace mounts the hierarchies afresh, so the root slice systemd
//!   manages is that subtree. It is removed on drop.
//! - **Mounts**: a mount namespace with private propagation, a fresh
//!   tmpfs on `/run` and `/proc` for the new PID namespace. The
//!   container marker (`container=keelson-test`) makes systemd skip what
//!   it skips in containers (module loading, clock, firmware).
//! - **Network, IPC, UTS**: its own (loopback only).
//! - **Bus**: `dbus-daemon --systemd-activation` started by systemd from
//!   our `dbus.socket`, listening on a socket in the test directory (on
//!   the shared file system, so the test reaches it from outside), with a
//!   bus configuration that lets root own and call anything.
//!
//! Processes that work with it (containerd, keelson) run inside its PID,
//! mount and cgroup namespaces ([`SystemdEntry::command`]): runc hands
//! systemd the PIDs to put into a scope, which systemd reads in its own
//! PID namespace, and both read the cgroup mounts systemd sees. Dropping
//! the handle sends SIGKILL to systemd (by its PID), which ends every
//! process of its PID namespace, then removes the cgroup subtree and the
//! directory.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::wait_for;

/// The systemd binary of Debian's `systemd` package.
pub const SYSTEMD: &str = "/lib/systemd/systemd";

/// The target the private systemd boots.
const TARGET: &str = "keelson-test.target";

/// A cgroup file system mounted directly under `/sys/fs/cgroup`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMount {
    /// The directory under `/sys/fs/cgroup` (`memory`, `unified`, ...).
    pub name: String,
    /// `cgroup` or `cgroup2`.
    pub fstype: String,
    /// The mount's super options without `rw`/`ro` (`cpu`,
    /// `none,name=systemd`); empty for cgroup2.
    pub options: String,
}

/// The cgroup layout of `/sys/fs/cgroup` read from a mountinfo text:
/// `Ok(None)` when `/sys/fs/cgroup` itself is the cgroup2 mount (unified
/// hierarchy only), `Ok(Some(mounts))` for v1 and hybrid hosts.
pub fn cgroup_layout(mountinfo: &str) -> Result<Option<Vec<CgroupMount>>, String> {
    let mut mounts = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let point = left.split_whitespace().nth(4).unwrap_or_default();
        let mut r = right.split_whitespace();
        let fstype = r.next().unwrap_or_default();
        let _source = r.next();
        let superopts = r.next().unwrap_or_default();
        if fstype != "cgroup" && fstype != "cgroup2" {
            continue;
        }
        if point == "/sys/fs/cgroup" && fstype == "cgroup2" {
            return Ok(None);
        }
        let Some(name) = point.strip_prefix("/sys/fs/cgroup/") else {
            continue;
        };
        if name.contains('/') {
            continue;
        }
        let opts: Vec<&str> = superopts
            .split(',')
            .filter(|o| *o != "rw" && *o != "ro")
            .collect();
        let options = if fstype == "cgroup2" {
            String::new()
        } else if opts.iter().all(|o| o.starts_with("name=")) {
            format!("none,{}", opts.join(","))
        } else {
            opts.join(",")
        };
        mounts.push(CgroupMount {
            name: name.to_string(),
            fstype: fstype.to_string(),
            options,
        });
    }
    if mounts.is_empty() {
        return Err("no cgroup file system is mounted under /sys/fs/cgroup".into());
    }
    Ok(Some(mounts))
}

/// Why the private systemd cannot run here (`None`: it can).
pub fn unavailable() -> Option<String> {
    if !nix::unistd::Uid::effective().is_root() {
        return Some("needs root".into());
    }
    for bin in [
        SYSTEMD,
        "/usr/bin/dbus-daemon",
        "/usr/bin/unshare",
        "/usr/bin/nsenter",
    ] {
        if !Path::new(bin).is_file() {
            return Some(format!("{bin} is not installed"));
        }
    }
    None
}

/// How to run a program inside the private systemd's PID, mount and
/// cgroup namespaces (cheap to clone; the systemd handle owns them).
#[derive(Debug, Clone)]
pub struct SystemdEntry {
    pid: i32,
    bus: String,
}

impl SystemdEntry {
    /// `nsenter` into systemd's PID, mount and cgroup namespaces and the
    /// network namespace at `netns` (opened before entering the others),
    /// running `program` with `DBUS_SYSTEM_BUS_ADDRESS` set to the private
    /// bus. `nsenter` forks for the PID namespace: the spawned child is
    /// `nsenter`, the program is its only child ([`child_pid`]).
    pub fn command(&self, netns: &Path, program: &str) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--target={}", self.pid))
            .args(["--pid", "--mount", "--cgroup"])
            .arg(format!("--net={}", netns.display()))
            .arg("--")
            .arg(program)
            .env("DBUS_SYSTEM_BUS_ADDRESS", &self.bus);
        cmd
    }

    /// The private system bus address (`unix:path=...`).
    pub fn bus_address(&self) -> &str {
        &self.bus
    }
}

/// The only child of `pid` (the program an `nsenter --pid` runs), from
/// `/proc/<pid>/task/<pid>/children`.
pub fn child_pid(pid: u32) -> Option<i32> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// A running private systemd; see the module documentation.
pub struct PrivateSystemd {
    dir: tempfile::TempDir,
    cgroup_name: String,
    layout: Option<Vec<CgroupMount>>,
    unshare: Option<Child>,
    entry: SystemdEntry,
}

impl std::fmt::Debug for PrivateSystemd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrivateSystemd")
            .field("pid", &self.entry.pid)
            .field("cgroup", &self.cgroup_name)
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

fn bus_config() -> String {
    // A system bus whose socket comes from systemd (`dbus.socket`).
    format!(
        r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>systemd:</listen>
  <auth>EXTERNAL</auth>
{}
</busconfig>
"#,
        crate::systemd_double::BUS_POLICY
    )
}

/// The three units of the private systemd: `(file name, text)`.
pub fn units(dir: &Path) -> Vec<(&'static str, String)> {
    let d = dir.display();
    vec![
        (
            TARGET,
            "[Unit]\nDescription=keelson system test\nDefaultDependencies=no\n\
             Wants=dbus.socket dbus.service\n"
                .to_string(),
        ),
        (
            "dbus.socket",
            format!(
                "[Unit]\nDescription=private system bus socket\nDefaultDependencies=no\n\n\
                 [Socket]\nListenStream={d}/system_bus_socket\n"
            ),
        ),
        (
            "dbus.service",
            format!(
                "[Unit]\nDescription=private system bus\nDefaultDependencies=no\n\
                 Requires=dbus.socket\n\n[Service]\n\
                 ExecStart=/usr/bin/dbus-daemon --config-file={d}/bus.conf --nofork \
                 --nopidfile --systemd-activation\n"
            ),
        ),
    ]
}

/// The script run as PID 1 of the new namespaces before it becomes
/// systemd: mounts, then `exec systemd`.
pub fn init_script(dir: &Path, layout: Option<&[CgroupMount]>) -> String {
    let d = dir.display();
    let mut s = String::from(
        "#!/bin/sh\nset -e\nmount --make-rprivate /\nmount -t tmpfs -o mode=755 tmpfs /run\n",
    );
    match layout {
        None => s.push_str("mount -t cgroup2 cgroup2 /sys/fs/cgroup\n"),
        Some(mounts) => {
            s.push_str("mount -t tmpfs -o mode=755 tmpfs /sys/fs/cgroup\n");
            for m in mounts {
                s.push_str(&format!("mkdir -p /sys/fs/cgroup/{}\n", m.name));
                if m.fstype == "cgroup2" {
                    s.push_str(&format!(
                        "mount -t cgroup2 cgroup2 /sys/fs/cgroup/{}\n",
                        m.name
                    ));
                } else {
                    s.push_str(&format!(
                        "mount -t cgroup -o {} cgroup /sys/fs/cgroup/{}\n",
                        m.options, m.name
                    ));
                }
            }
        }
    }
    s.push_str("mount -t proc proc /proc\n");
    s.push_str(&format!(
        "exec env container=keelson-test SYSTEMD_UNIT_PATH={d}/units \
         DBUS_SYSTEM_BUS_ADDRESS=unix:path={d}/system_bus_socket \
         {SYSTEMD} --system --unit={TARGET} --log-target=console --log-level=info\n"
    ));
    s
}

impl PrivateSystemd {
    /// Starts systemd and waits until it answers on its bus.
    pub async fn start() -> Result<PrivateSystemd, String> {
        if let Some(why) = unavailable() {
            return Err(why);
        }
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| format!("reading mountinfo: {e}"))?;
        let layout = cgroup_layout(&mountinfo)?;
        let dir = tempfile::Builder::new()
            .prefix("keelson-systemd-")
            .tempdir_in("/var/tmp")
            .map_err(|e| format!("temp dir: {e}"))?;
        let cgroup_name = format!("keelson-systemd-{}", crate::netns::unique_suffix());
        let mut me = PrivateSystemd {
            entry: SystemdEntry {
                pid: 0,
                bus: format!("unix:path={}/system_bus_socket", dir.path().display()),
            },
            dir,
            cgroup_name,
            layout,
            unshare: None,
        };
        // From here on, an error drops `me`, which cleans up.
        me.write_files()?;
        let leaves = me.make_cgroups()?;
        me.spawn(&leaves)?;
        let pid = wait_for(
            "systemd to start",
            Duration::from_secs(20),
            Duration::from_millis(50),
            || {
                let unshare = me.unshare.as_mut().map(|c| (c.id(), c.try_wait()));
                async move {
                    match unshare {
                        Some((_, Ok(Some(status)))) => Err(format!("unshare exited: {status}")),
                        Some((id, _)) => child_pid(id)
                            .filter(|p| {
                                std::fs::read_to_string(format!("/proc/{p}/comm"))
                                    .is_ok_and(|c| c.trim() == "systemd")
                            })
                            .ok_or_else(|| "systemd not running yet".to_string()),
                        None => Err("not spawned".into()),
                    }
                }
            },
        )
        .await
        .map_err(|e| e.to_string())?;
        me.entry.pid = pid;
        let bus = me.entry.bus.clone();
        wait_for(
            "systemd on its private bus",
            Duration::from_secs(30),
            Duration::from_millis(100),
            || {
                let bus = bus.clone();
                async move {
                    tokio::time::timeout(Duration::from_secs(5), manager_version(&bus))
                        .await
                        .map_err(|_| "no answer within 5 s".to_string())?
                }
            },
        )
        .await
        .map_err(|e| format!("{e}\n{}", me.units_state()))?;
        Ok(me)
    }

    fn write_files(&self) -> Result<(), String> {
        let d = self.dir.path();
        let w = |p: PathBuf, text: &str| {
            std::fs::write(&p, text).map_err(|e| format!("writing {}: {e}", p.display()))
        };
        std::fs::create_dir_all(d.join("units")).map_err(|e| format!("units dir: {e}"))?;
        for (name, text) in units(d) {
            w(d.join("units").join(name), &text)?;
        }
        w(d.join("bus.conf"), &bus_config())?;
        w(d.join("init.sh"), &init_script(d, self.layout.as_deref()))?;
        Ok(())
    }

    /// The subtree in every hierarchy (host view); returns the
    /// `cgroup.procs` files to join.
    fn make_cgroups(&self) -> Result<Vec<PathBuf>, String> {
        let mut procs = Vec::new();
        for dir in self.host_cgroup_roots() {
            std::fs::create_dir_all(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
            // cpuset v1: a child has no CPUs or memory nodes until given some.
            for f in ["cpuset.cpus", "cpuset.mems"] {
                let mine = dir.join(f);
                if mine.exists()
                    && std::fs::read_to_string(&mine).is_ok_and(|v| v.trim().is_empty())
                    && let Some(parent) = dir.parent()
                    && let Ok(v) = std::fs::read_to_string(parent.join(f))
                {
                    std::fs::write(&mine, v.trim())
                        .map_err(|e| format!("writing {}: {e}", mine.display()))?;
                }
            }
            procs.push(dir.join("cgroup.procs"));
        }
        Ok(procs)
    }

    /// The subtree's directory in every hierarchy (host view).
    pub fn host_cgroup_roots(&self) -> Vec<PathBuf> {
        let base = Path::new("/sys/fs/cgroup");
        match &self.layout {
            None => vec![base.join(&self.cgroup_name)],
            Some(mounts) => mounts
                .iter()
                .map(|m| base.join(&m.name).join(&self.cgroup_name))
                .collect(),
        }
    }

    /// Where `rel` (a path inside systemd's hierarchy, e.g.
    /// `kubepods.slice/kubepods-burstable.slice`) lives on the host in
    /// hierarchy `name` (`memory`, `cpu`, `unified`; ignored on a
    /// unified-only host).
    pub fn host_cgroup_dir(&self, name: &str, rel: &str) -> PathBuf {
        let base = Path::new("/sys/fs/cgroup");
        let rel = rel.trim_start_matches('/');
        match &self.layout {
            None => base.join(&self.cgroup_name).join(rel),
            Some(_) => base.join(name).join(&self.cgroup_name).join(rel),
        }
    }

    fn spawn(&mut self, procs: &[PathBuf]) -> Result<(), String> {
        let log = std::fs::File::create(self.dir.path().join("systemd.log"))
            .map_err(|e| format!("log: {e}"))?;
        let log2 = log.try_clone().map_err(|e| format!("log: {e}"))?;
        // The shell joins the subtree, then becomes `unshare`, whose
        // forked child (PID 1 of the new namespaces) runs init.sh.
        let mut join = String::new();
        for p in procs {
            join.push_str(&format!("echo $$ > {}; ", p.display()));
        }
        let script = format!(
            "{join}exec unshare --pid --mount --cgroup --net --ipc --uts --fork {}/init.sh",
            self.dir.path().display()
        );
        let init = self.dir.path().join("init.sh");
        std::fs::set_permissions(&init, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .map_err(|e| format!("chmod init.sh: {e}"))?;
        let child = Command::new("/bin/sh")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| format!("spawning unshare: {e}"))?;
        self.unshare = Some(child);
        Ok(())
    }

    /// How to run programs inside its namespaces.
    pub fn entry(&self) -> SystemdEntry {
        self.entry.clone()
    }

    /// systemd's PID (host view).
    pub fn pid(&self) -> i32 {
        self.entry.pid
    }

    /// Runs `systemctl` inside its namespaces; stdout, or the error with
    /// stderr.
    pub fn systemctl(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new("nsenter")
            .arg(format!("--target={}", self.entry.pid))
            .args(["--mount", "--pid", "--", "systemctl", "--no-pager"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("running systemctl: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "systemctl {args:?}: {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `systemctl show -p <props> <unit>` as a map.
    pub fn unit_properties(
        &self,
        unit: &str,
        props: &[&str],
    ) -> Result<std::collections::BTreeMap<String, String>, String> {
        let out = self.systemctl(&["show", "-p", &props.join(","), unit])?;
        Ok(out
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect())
    }

    fn units_state(&self) -> String {
        let listed = self
            .systemctl(&["list-units", "--all"])
            .unwrap_or_else(|e| e);
        let log = std::fs::read_to_string(self.dir.path().join("systemd.log")).unwrap_or_default();
        format!("--- units ---\n{listed}\n--- systemd output ---\n{log}")
    }
}

/// The `Version` property of systemd's manager on `bus`.
async fn manager_version(bus: &str) -> Result<String, String> {
    let conn = zbus::connection::Builder::address(bus)
        .build()
        .await
        .map_err(|e| format!("connecting to {bus}: {e}"))?;
    let proxy = zbus::Proxy::new(
        &conn,
        "org.freedesktop.systemd1",
        "/org/freedesktop/systemd1",
        "org.freedesktop.systemd1.Manager",
    )
    .await
    .map_err(|e| e.to_string())?;
    proxy
        .get_property::<String>("Version")
        .await
        .map_err(|e| format!("systemd's Version: {e}"))
}

/// Removes `dir` and every cgroup below it, deepest first.
fn remove_cgroup_tree(dir: &Path) -> Result<(), String> {
    if !dir.exists() {
        return Ok(());
    }
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup_tree(&e.path())?;
        }
    }
    std::fs::remove_dir(dir).map_err(|e| format!("rmdir {}: {e}", dir.display()))
}

impl Drop for PrivateSystemd {
    fn drop(&mut self) {
        // SIGKILL to PID 1 of the namespace ends all of its processes.
        if self.entry.pid > 0 {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.entry.pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        if let Some(mut c) = self.unshare.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Dying processes leave their cgroups a moment later.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        for root in self.host_cgroup_roots() {
            loop {
                match remove_cgroup_tree(&root) {
                    Ok(()) => break,
                    Err(e) if std::time::Instant::now() > deadline => {
                        tracing::warn!(error = %e, "cannot remove the private systemd's cgroups");
                        break;
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
30 24 0:26 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
32 30 0:28 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
33 30 0:29 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
34 30 0:30 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 24 0:31 / /sys/fs/cgroup/memory/x rw - cgroup cgroup rw,memory
";

    #[test]
    fn hybrid_layout_is_read_with_mount_options() {
        let l = cgroup_layout(HYBRID)
            .unwrap_or_default()
            .unwrap_or_default();
        let got: Vec<(&str, &str, &str)> = l
            .iter()
            .map(|m| (m.name.as_str(), m.fstype.as_str(), m.options.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("cpu", "cgroup", "cpu"),
                ("systemd", "cgroup", "none,name=systemd"),
                ("unified", "cgroup2", ""),
                ("cpu,cpuacct", "cgroup", "cpu,cpuacct"),
            ]
        );
    }

    #[test]
    fn unified_only_layout_is_none() {
        let text = "30 24 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(cgroup_layout(text), Ok(None));
        assert!(cgroup_layout("1 0 0:1 / / rw - ext4 /dev/vda rw\n").is_err());
    }

    #[test]
    fn only_our_units_and_no_host_unit_path() {
        let dir = Path::new("/var/tmp/keelson-systemd-x");
        let script = init_script(dir, None);
        assert!(script.contains("SYSTEMD_UNIT_PATH=/var/tmp/keelson-systemd-x/units "));
        assert!(script.contains("container=keelson-test"));
        assert!(script.contains("mount -t tmpfs -o mode=755 tmpfs /run"));
        let names: Vec<&str> = units(dir).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, vec![TARGET, "dbus.socket", "dbus.service"]);
        let target = &units(dir)[0].1;
        assert!(target.contains("DefaultDependencies=no"));
    }
}

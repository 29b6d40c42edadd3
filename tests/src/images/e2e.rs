//! The container images Kubernetes' v1.36.2 e2e suite runs, built here
//! (no registry is reachable) and named as upstream names them, so a
//! containerd that imported them ([`super::import`]) never pulls.
//!
//! [`build_e2e_images`] writes one OCI archive per image into a directory.
//! Each image holds what its upstream Dockerfile puts in (the Dockerfiles
//! are in `e2e-image-files.tar.xz` of `../shared/k8s`), from three
//! sources: the shared binaries (`KEELSON_UPSTREAM_BIN`: `agnhost`, the
//! static `busybox` 1.37, `nnp`), the small files of that tarball
//! (porter's certificate and key, the kitten/nautilus pages, `pause.c`),
//! and this Debian host's binaries with their shared libraries
//! ([`super::rootfs`]). Upstream's Alpine-based images become a static
//! busybox 1.37 (never Debian's busybox 1.35, whose `sh` drops environment
//! variables whose names are not identifiers) plus Debian's builds of the
//! tools upstream adds with `apk`.
//!
//! | image | contents |
//! |---|---|
//! | [`AGNHOST`] (also tagged [`AGNHOST_PREV`], the same image) | `/agnhost` and `/agnhost-2` → `agnhost`; entrypoint `/agnhost`, command `pause`; busybox 1.37 applets as the shell and coreutils; from Debian: `curl`, OpenBSD `nc`, `dig`/`nslookup`/`host`/`delv`, iproute2 (`ip`, `ss`, `tc`, `bridge`), `iperf` (+ `/usr/local/bin/iperf`), `bash`, `getent`, `ipcs`/`ipcmk`/`ipcrm`/`lsipc`; `/localhost.crt` and `/localhost.key` (porter), `/uploads` (netexec); Alpine's users and groups plus `user-defined-in-image` (1000) in `group-defined-in-image` (50000); CA bundle; exposes 80, 8080, 8081, 9376, 5000 |
//! | [`KITTEN`], [`NAUTILUS`] | agnhost's layer plus `/kitten.jpg` (`/nautilus.jpg`) and `/data.json`; command `test-webserver` |
//! | [`BUSYBOX`] (also tagged [`BUSYBOX_PREV`]) | the static busybox 1.37 with every applet in `/bin` (as the official image); its users and groups; command `sh` |
//! | [`NGINX`] | Debian's nginx (nginx-light) as `/usr/sbin/nginx` with its libraries, the official image's `nginx.conf` and `conf.d/default.conf` (port 80, `/usr/share/nginx/html`), user `nginx` (101), logs to stdout/stderr; busybox 1.37 as the shell; command `nginx -g 'daemon off;'`, stop signal SIGTERM, exposes 80 |
//! | [`NGINX_NEW`] | the same plus the official image's `/docker-entrypoint.sh` (as entrypoint; it adds the IPv6 listener when the pod has IPv6), stop signal SIGQUIT |
//! | [`NONEWPRIVS`] | busybox 1.37 (Alpine's place) and `/usr/local/bin/nnp`, setuid and setgid root; command `nnp` |
//! | [`NONROOT`] | a Debian bookworm base (merged `/usr`: `base-files`, `dash` as `/bin/sh`, `bash`, `coreutils`, `grep`, `sed`, `findutils`, `diffutils`, `gzip`, `tar`, `hostname`, `debianutils`, `mawk`, `libc-bin`; Debian's users and groups); user 1234 |
//! | [`GLIBC_DNS_TESTING`] | that Debian base plus Debian's `dig`/`nslookup`/`host` (bind9-dnsutils, bind9-host) |
//! | [`PAUSE`] | `/pause` compiled from upstream's `pause.c` with `gcc -static`; entrypoint `/pause`, user 65535:65535 |
//!
//! Left out of the images above: agnhost's `/coredns` (a CoreDNS 1.6.2
//! release binary) and `/var/registry` (the fake registry's content, made
//! with `crane` from a registry), glibc-dns-testing's `/coredns`; no
//! `[Conformance]` test uses them. The images the suite lists that are
//! not built at all, and why, are in [`NOT_BUILT`].

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;

use super::rootfs::{Layout, RootFs};
use super::{BuiltImage, ImageConfig, ImageError, run, write_image};

/// `registry.k8s.io/e2e-test-images/agnhost:2.63.0`.
pub const AGNHOST: &str = "registry.k8s.io/e2e-test-images/agnhost:2.63.0";
/// `agnhost:2.55` (the suite's `AgnhostPrev`): the same image, a second
/// name in [`AGNHOST`]'s archive.
pub const AGNHOST_PREV: &str = "registry.k8s.io/e2e-test-images/agnhost:2.55";
/// `kitten:1.8`.
pub const KITTEN: &str = "registry.k8s.io/e2e-test-images/kitten:1.8";
/// `nautilus:1.8`.
pub const NAUTILUS: &str = "registry.k8s.io/e2e-test-images/nautilus:1.8";
/// `busybox:1.37.0-1`.
pub const BUSYBOX: &str = "registry.k8s.io/e2e-test-images/busybox:1.37.0-1";
/// `busybox:1.36.1-1`: the same image, a second name in [`BUSYBOX`]'s
/// archive.
pub const BUSYBOX_PREV: &str = "registry.k8s.io/e2e-test-images/busybox:1.36.1-1";
/// `nginx:1.15-4` (the suite's `Nginx`).
pub const NGINX: &str = "registry.k8s.io/e2e-test-images/nginx:1.15-4";
/// `nginx:1.27-0` (the suite's `NginxNew`).
pub const NGINX_NEW: &str = "registry.k8s.io/e2e-test-images/nginx:1.27-0";
/// `nonewprivs:1.4`.
pub const NONEWPRIVS: &str = "registry.k8s.io/e2e-test-images/nonewprivs:1.4";
/// `nonroot:1.5`.
pub const NONROOT: &str = "registry.k8s.io/e2e-test-images/nonroot:1.5";
/// `glibc-dns-testing:2.0.0` (the DNS tests' "jessie" prober).
pub const GLIBC_DNS_TESTING: &str = "registry.k8s.io/e2e-test-images/glibc-dns-testing:2.0.0";
/// `registry.k8s.io/pause:3.10.2`, kubelet v1.36's sandbox image.
pub const PAUSE: &str = "registry.k8s.io/pause:3.10.2";

/// The user [`NONROOT`] runs as.
pub const NONROOT_UID: u32 = 1234;

/// Images of `e2e.test --list-images` that are not built, and why.
pub const NOT_BUILT: &[(&str, &str)] = &[
    (
        "registry.k8s.io/e2e-test-images/sample-apiserver:1.29.2",
        "a Go program (k8s.io/sample-apiserver) that is not among the shared binaries, and no Go toolchain is here to build it; the aggregator [Conformance] test needs it",
    ),
    (
        "registry.k8s.io/etcd:3.6.8-0",
        "only the sample-apiserver test runs it (beside sample-apiserver, which cannot be built); Debian's etcd is 3.4",
    ),
    (
        "invalid.registry.k8s.io/invalid/alpine:3.1",
        "must stay unavailable: the test expects its pull from an invalid registry to fail",
    ),
    (
        "gcr.io/k8s-authenticated-test/agnhost:2.6",
        "the private-registry tests need registry credentials; they run on GCE only",
    ),
    (
        "registry.k8s.io/e2e-test-images/perl:5.26",
        "no test in the v1.36.2 tree runs it",
    ),
    (
        "registry.k8s.io/e2e-test-images/apparmor-loader:1.4",
        "AppArmor tests only (not [Conformance]); needs apparmor_parser",
    ),
    (
        "registry.k8s.io/e2e-test-images/ipc-utils:1.4",
        "a node e2e (SELinux/IPC) image, not used by [Conformance] tests",
    ),
    (
        "registry.k8s.io/e2e-test-images/resource-consumer:1.14",
        "autoscaling tests only (not [Conformance]); its binary is not among the shared binaries",
    ),
    (
        "registry.k8s.io/e2e-test-images/regression-issue-74839:1.5",
        "a conntrack regression test (not [Conformance]); its binary is not among the shared binaries",
    ),
    (
        "registry.k8s.io/e2e-test-images/volume/nfs:1.6.0",
        "NFS volume tests (not [Conformance]); needs an in-kernel NFS server",
    ),
    (
        "registry.k8s.io/e2e-test-images/volume/iscsi:2.7",
        "iSCSI volume tests (not [Conformance]); needs an iSCSI target",
    ),
    (
        "registry.k8s.io/e2e-test-images/node-perf/npb-ep:1.6.0",
        "node performance tests only (not [Conformance])",
    ),
    (
        "registry.k8s.io/e2e-test-images/node-perf/npb-is:1.7.0",
        "node performance tests only (not [Conformance])",
    ),
    (
        "registry.k8s.io/e2e-test-images/node-perf/pytorch-wide-deep:1.0.0",
        "node performance tests only (not [Conformance])",
    ),
    (
        "registry.k8s.io/build-image/distroless-iptables:v0.9.3",
        "the kube-proxy conntrack test (not [Conformance])",
    ),
    (
        "registry.k8s.io/sig-storage/*",
        "CSI driver and sidecar images (csi-attacher, csi-provisioner, csi-resizer, csi-snapshotter, csi-node-driver-registrar, livenessprobe, hostpathplugin, nfs-provisioner, hello-populator, ...): the storage tests that deploy drivers are not [Conformance] (those that are only use the API), and the shared sidecar binaries are other versions than the suite's tags",
    ),
    (
        "registry.k8s.io/cloud-provider-gcp/gcp-compute-persistent-disk-csi-driver:v1.4.0",
        "GCE persistent disks only",
    ),
];

const PATH_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Alpine 3.21's `/etc/passwd` (alpine-baselayout).
const ALPINE_PASSWD: &str = "root:x:0:0:root:/root:/bin/sh
bin:x:1:1:bin:/bin:/sbin/nologin
daemon:x:2:2:daemon:/sbin:/sbin/nologin
lp:x:4:7:lp:/var/spool/lpd:/sbin/nologin
sync:x:5:0:sync:/sbin:/bin/sync
shutdown:x:6:0:shutdown:/sbin:/sbin/shutdown
halt:x:7:0:halt:/sbin:/sbin/halt
mail:x:8:12:mail:/var/mail:/sbin/nologin
news:x:9:13:news:/usr/lib/news:/sbin/nologin
uucp:x:10:14:uucp:/var/spool/uucppublic:/sbin/nologin
cron:x:16:16:cron:/var/spool/cron:/sbin/nologin
ftp:x:21:21::/var/lib/ftp:/sbin/nologin
sshd:x:22:22:sshd:/dev/null:/sbin/nologin
games:x:35:35:games:/usr/games:/sbin/nologin
ntp:x:123:123:NTP:/var/empty:/sbin/nologin
guest:x:405:100:guest:/dev/null:/sbin/nologin
nobody:x:65534:65534:nobody:/:/sbin/nologin
";

/// Alpine 3.21's `/etc/group` (alpine-baselayout).
const ALPINE_GROUP: &str = "root:x:0:root
bin:x:1:root,bin,daemon
daemon:x:2:root,bin,daemon
sys:x:3:root,bin
adm:x:4:root,daemon
tty:x:5:
disk:x:6:root
lp:x:7:lp
kmem:x:9:
wheel:x:10:root
floppy:x:11:root
mail:x:12:mail
news:x:13:news
uucp:x:14:uucp
cron:x:16:cron
console:x:17:
audio:x:18:
cdrom:x:19:
dialout:x:20:root
ftp:x:21:
sshd:x:22:
input:x:23:
tape:x:26:root
video:x:27:root
netdev:x:28:
kvm:x:34:kvm
games:x:35:
shadow:x:42:
www-data:x:82:
users:x:100:games
ntp:x:123:
abuild:x:300:
utmp:x:406:
ping:x:999:
nogroup:x:65533:
nobody:x:65534:
";

/// The official busybox image's `/etc/passwd` and `/etc/group`.
const BUSYBOX_PASSWD: &str = "root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/bin/false
bin:x:2:2:bin:/bin:/bin/false
sys:x:3:3:sys:/dev:/bin/false
sync:x:4:100:sync:/bin:/bin/sync
mail:x:8:8:mail:/var/spool/mail:/bin/false
www-data:x:33:33:www-data:/var/www:/bin/false
operator:x:37:37:Operator:/var:/bin/false
nobody:x:65534:65534:nobody:/home:/bin/false
";
const BUSYBOX_GROUP: &str = "root:x:0:
daemon:x:1:
bin:x:2:
sys:x:3:
adm:x:4:
tty:x:5:
disk:x:6:
lp:x:7:
mail:x:8:
kmem:x:9:
wheel:x:10:root
cdrom:x:11:
dialout:x:18:
floppy:x:19:
video:x:28:
audio:x:29:
tape:x:32:
www-data:x:33:
operator:x:37:
utmp:x:43:
plugdev:x:46:
staff:x:50:
lock:x:54:
netdev:x:82:
users:x:100:
nogroup:x:65534:
";

/// glibc's name service order (musl's and busybox's tools read the files
/// directly; Debian's `getent` and `curl` need this).
const NSSWITCH: &str = "passwd: files
group: files
shadow: files
hosts: files dns
networks: files
protocols: files
services: files
";

/// The official nginx image's `/etc/nginx/nginx.conf`.
const NGINX_CONF: &str = r#"
user  nginx;
worker_processes  auto;

error_log  /var/log/nginx/error.log notice;
pid        /run/nginx.pid;


events {
    worker_connections  1024;
}


http {
    include       /etc/nginx/mime.types;
    default_type  application/octet-stream;

    log_format  main  '$remote_addr - $remote_user [$time_local] "$request" '
                      '$status $body_bytes_sent "$http_referer" '
                      '"$http_user_agent" "$http_x_forwarded_for"';

    access_log  /var/log/nginx/access.log  main;

    sendfile        on;
    #tcp_nopush     on;

    keepalive_timeout  65;

    #gzip  on;

    include /etc/nginx/conf.d/*.conf;
}
"#;

/// The official nginx image's `/etc/nginx/conf.d/default.conf`.
const NGINX_DEFAULT_CONF: &str = r"server {
    listen       80;
    server_name  localhost;

    #access_log  /var/log/nginx/host.access.log  main;

    location / {
        root   /usr/share/nginx/html;
        index  index.html index.htm;
    }

    # redirect server error pages to the static page /50x.html
    #
    error_page   500 502 503 504  /50x.html;
    location = /50x.html {
        root   /usr/share/nginx/html;
    }
}
";

const NGINX_INDEX: &str = "<!DOCTYPE html>
<html>
<head>
<title>Welcome to nginx!</title>
<style>
html { color-scheme: light dark; }
body { width: 35em; margin: 0 auto;
font-family: Tahoma, Verdana, Arial, sans-serif; }
</style>
</head>
<body>
<h1>Welcome to nginx!</h1>
<p>If you see this page, the nginx web server is successfully installed and
working. Further configuration is required.</p>

<p>For online documentation and support please refer to
<a href=\"http://nginx.org/\">nginx.org</a>.<br/>
Commercial support is available at
<a href=\"http://nginx.com/\">nginx.com</a>.</p>

<p><em>Thank you for using nginx.</em></p>
</body>
</html>
";

const NGINX_50X: &str = "<!DOCTYPE html>
<html>
<head>
<title>Error</title>
</head>
<body>
<h1>An error occurred.</h1>
<p>Sorry, the page you are looking for is currently unavailable.<br/>
Please try again later.</p>
</body>
</html>
";

/// The official nginx image's entrypoint (1.27): runs the scripts in
/// `/docker-entrypoint.d` before `nginx`, then execs the command.
const NGINX_ENTRYPOINT: &str = r#"#!/bin/sh
# vim:sw=4:ts=4:et

set -e

entrypoint_log() {
    if [ -z "${NGINX_ENTRYPOINT_QUIET_LOGS:-}" ]; then
        echo "$@"
    fi
}

if [ "$1" = "nginx" ] || [ "$1" = "nginx-debug" ]; then
    if /usr/bin/find "/docker-entrypoint.d/" -mindepth 1 -maxdepth 1 -type f -print -quit 2>/dev/null | read v; then
        entrypoint_log "$0: /docker-entrypoint.d/ is not empty, will attempt to perform configuration"

        entrypoint_log "$0: Looking for shell scripts in /docker-entrypoint.d/"
        find "/docker-entrypoint.d/" -follow -type f -print | sort -V | while read -r f; do
            case "$f" in
                *.sh)
                    if [ -x "$f" ]; then
                        entrypoint_log "$0: Launching $f";
                        "$f"
                    else
                        # warn on shell scripts without exec bit
                        entrypoint_log "$0: Ignoring $f, not executable";
                    fi
                    ;;
                *) entrypoint_log "$0: Ignoring $f";;
            esac
        done

        entrypoint_log "$0: Configuration complete; ready for start up"
    else
        entrypoint_log "$0: No files found in /docker-entrypoint.d/, skipping configuration"
    fi
fi

exec "$@"
"#;

/// The official image's `10-listen-on-ipv6-by-default.sh`, reduced to what
/// it does to the unmodified `default.conf`.
const NGINX_IPV6_SCRIPT: &str = r#"#!/bin/sh
# vim:sw=4:ts=4:et

set -e

entrypoint_log() {
    if [ -z "${NGINX_ENTRYPOINT_QUIET_LOGS:-}" ]; then
        echo "$@"
    fi
}

ME=$(basename "$0")
DEFAULT_CONF_FILE="etc/nginx/conf.d/default.conf"

# check if we have ipv6 available
if [ ! -f "/proc/net/if_inet6" ]; then
    entrypoint_log "$ME: info: ipv6 not available"
    exit 0
fi

if [ ! -f "/$DEFAULT_CONF_FILE" ]; then
    entrypoint_log "$ME: info: /$DEFAULT_CONF_FILE is not a file or does not exist"
    exit 0
fi

# check if the file can be modified, e.g. not on a r/o filesystem
touch /$DEFAULT_CONF_FILE 2>/dev/null || { entrypoint_log "$ME: info: can not modify /$DEFAULT_CONF_FILE (read-only file system?)"; exit 0; }

# check if the file is already modified, e.g. on a container restart
grep -q "listen  \[::]\:80;" /$DEFAULT_CONF_FILE && exit 0

entrypoint_log "$ME: info: Enabled listen on IPv6 in /$DEFAULT_CONF_FILE"
sed -i -E 's,listen       80;,listen       80;\n    listen  [::]:80;,' /$DEFAULT_CONF_FILE

exit 0
"#;

/// The Debian packages of the Debian-based images' base (what
/// `debian-base` / `debian:bookworm-slim` carry that tests may call).
const DEBIAN_BASE_PACKAGES: [&str; 14] = [
    "base-files",
    "dash",
    "bash",
    "coreutils",
    "grep",
    "sed",
    "findutils",
    "diffutils",
    "gzip",
    "tar",
    "hostname",
    "debianutils",
    "mawk",
    "libc-bin",
];

/// Where the pieces come from.
struct Sources {
    /// The unpacked shared binaries.
    bin: PathBuf,
    /// The extracted `e2e-image-files` directory.
    files: PathBuf,
}

impl Sources {
    fn bin(&self, name: &str) -> Result<PathBuf, ImageError> {
        let path = self.bin.join(name);
        if path.is_file() {
            Ok(path)
        } else {
            Err(ImageError::Missing {
                path,
                hint:
                    "one of the shared binaries (`../shared/k8s/unpack DIR`, KEELSON_UPSTREAM_BIN)"
                        .into(),
            })
        }
    }

    fn file(&self, rel: &str) -> Result<PathBuf, ImageError> {
        let path = self.files.join(rel);
        if path.is_file() {
            Ok(path)
        } else {
            Err(ImageError::Missing {
                path,
                hint: "a file of e2e-image-files.tar.xz (../shared/k8s)".into(),
            })
        }
    }
}

/// `e2e-image-files.tar.xz`: `$KEELSON_E2E_IMAGE_FILES`, else the shared
/// folder beside the repository (`../shared/k8s/`).
pub fn image_files_tarball() -> PathBuf {
    std::env::var_os("KEELSON_E2E_IMAGE_FILES")
        .filter(|v| !v.is_empty())
        .map_or_else(
            || {
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../../shared/k8s/e2e-image-files.tar.xz")
            },
            PathBuf::from,
        )
}

/// Builds every e2e image archive into `dir` from the unpacked shared
/// binaries in `upstream_bin` and the upstream images' files in
/// `image_files` (`e2e-image-files.tar.xz`, extracted into `dir/files`).
/// One [`BuiltImage`] per archive, [`PAUSE`] first; an archive may carry a
/// second name ([`AGNHOST_PREV`], [`BUSYBOX_PREV`]), which `ctr images
/// import` creates too. Import each with [`super::import`].
///
/// Cached: `dir/e2e-images.json` records the inputs of the last build
/// ([`inputs`]) and its archives; when the inputs are the same and the
/// archives are still there, they are returned without a rebuild.
pub fn build_e2e_images(
    upstream_bin: &Path,
    image_files: &Path,
    dir: &Path,
) -> Result<Vec<BuiltImage>, ImageError> {
    let stamp = dir.join(STAMP);
    let inputs = inputs(upstream_bin, image_files);
    if let Some(cached) = cached_build(&stamp, &inputs) {
        return Ok(cached);
    }
    // A build that stops half-way leaves no stamp behind.
    remove_if_present(&stamp)?;
    let built = build_all(upstream_bin, image_files, dir)?;
    let record = json!({
        "inputs": inputs,
        "images": built.iter().map(|b| json!({
            "name": b.name,
            "archive": b.archive,
            "manifest_digest": b.manifest_digest,
            "size": std::fs::metadata(&b.archive).map(|m| m.len()).unwrap_or_default(),
        })).collect::<Vec<_>>(),
    });
    std::fs::write(&stamp, record.to_string()).map_err(|source| ImageError::Io {
        context: format!("writing {}", stamp.display()),
        source,
    })?;
    Ok(built)
}

/// The record of the last build in a directory.
const STAMP: &str = "e2e-images.json";

/// What a build reads, each as one line: this module's code (its source
/// and the OCI writer's, hashed), and the size and modification time of
/// the shared binaries used, the image-files tarball, the host files
/// copied outside packages, and dpkg's status (any package installed or
/// upgraded changes it).
pub fn inputs(upstream_bin: &Path, image_files: &Path) -> Vec<String> {
    let code = [
        include_str!("e2e.rs"),
        include_str!("rootfs.rs"),
        include_str!("oci.rs"),
    ]
    .concat();
    let mut lines = vec![format!(
        "code {}",
        hex::encode(ring::digest::digest(&ring::digest::SHA256, code.as_bytes()))
    )];
    let mut files: Vec<PathBuf> = ["agnhost", "busybox", "nnp"]
        .iter()
        .map(|b| upstream_bin.join(b))
        .collect();
    files.push(image_files.to_path_buf());
    files.extend(
        [
            "/var/lib/dpkg/status",
            "/etc/services",
            "/etc/protocols",
            "/etc/ssl/certs/ca-certificates.crt",
            "/etc/nginx/mime.types",
        ]
        .iter()
        .map(PathBuf::from),
    );
    for f in files {
        lines.push(match std::fs::metadata(&f) {
            Ok(m) => {
                use std::os::unix::fs::MetadataExt;
                format!(
                    "{} {} {}.{}",
                    f.display(),
                    m.len(),
                    m.mtime(),
                    m.mtime_nsec()
                )
            }
            Err(_) => format!("{} absent", f.display()),
        });
    }
    lines
}

/// The archives of the last build in `stamp`'s directory when it had the
/// same `inputs` and they are all still there, unchanged in size.
fn cached_build(stamp: &Path, inputs: &[String]) -> Option<Vec<BuiltImage>> {
    let record: serde_json::Value = serde_json::from_slice(&std::fs::read(stamp).ok()?).ok()?;
    if record["inputs"] != json!(inputs) {
        return None;
    }
    record["images"]
        .as_array()?
        .iter()
        .map(|i| {
            let archive = PathBuf::from(i["archive"].as_str()?);
            let size = std::fs::metadata(&archive).ok()?.len();
            (i["size"].as_u64()? == size).then(|| BuiltImage {
                name: i["name"].as_str().unwrap_or_default().to_string(),
                archive,
                manifest_digest: i["manifest_digest"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            })
        })
        .collect()
}

fn remove_if_present(path: &Path) -> Result<(), ImageError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(ImageError::Io {
            context: format!("removing {}", path.display()),
            source: e,
        }),
        _ => Ok(()),
    }
}

fn build_all(
    upstream_bin: &Path,
    image_files: &Path,
    dir: &Path,
) -> Result<Vec<BuiltImage>, ImageError> {
    let src = Sources {
        bin: upstream_bin.to_path_buf(),
        files: extract_image_files(image_files, &dir.join("files"))?,
    };
    let mut built = vec![build_pause(&src, dir)?];

    let agnhost = agnhost_layer(&src)?;
    built.push(write(
        dir,
        "agnhost",
        &[AGNHOST, AGNHOST_PREV],
        &[&agnhost],
        &agnhost_config(vec!["pause".into()]),
    )?);
    for (name, pic) in [(KITTEN, "kitten"), (NAUTILUS, "nautilus")] {
        let mut layer = super::LayerBuilder::new();
        layer.host_file(
            &format!("{pic}.jpg"),
            0o644,
            &src.file(&format!("{pic}/html/{pic}.jpg"))?,
        )?;
        layer.host_file(
            "data.json",
            0o644,
            &src.file(&format!("{pic}/html/data.json"))?,
        )?;
        built.push(write(
            dir,
            pic,
            &[name],
            &[&agnhost, &layer.finish()?],
            &agnhost_config(vec!["test-webserver".into()]),
        )?);
    }
    drop(agnhost);

    built.push(write(
        dir,
        "busybox",
        &[BUSYBOX, BUSYBOX_PREV],
        &[&busybox_layer(&src)?],
        &ImageConfig {
            cmd: vec!["sh".into()],
            env: vec![PATH_ENV.into()],
            ..Default::default()
        },
    )?);

    let nginx = nginx_layer(&src)?;
    let nginx_config = |entrypoint: Vec<String>, stop_signal: &str| ImageConfig {
        entrypoint,
        cmd: vec!["nginx".into(), "-g".into(), "daemon off;".into()],
        env: vec![PATH_ENV.into()],
        exposed_ports: vec!["80/tcp".into()],
        stop_signal: stop_signal.into(),
        ..Default::default()
    };
    built.push(write(
        dir,
        "nginx-1.15",
        &[NGINX],
        &[&nginx],
        &nginx_config(Vec::new(), "SIGTERM"),
    )?);
    let mut entrypoint = super::LayerBuilder::new();
    entrypoint.file("docker-entrypoint.sh", 0o755, NGINX_ENTRYPOINT.as_bytes())?;
    entrypoint.file(
        "docker-entrypoint.d/10-listen-on-ipv6-by-default.sh",
        0o755,
        NGINX_IPV6_SCRIPT.as_bytes(),
    )?;
    built.push(write(
        dir,
        "nginx-1.27",
        &[NGINX_NEW],
        &[&nginx, &entrypoint.finish()?],
        &nginx_config(vec!["/docker-entrypoint.sh".into()], "SIGQUIT"),
    )?);
    drop(nginx);

    built.push(write(
        dir,
        "nonewprivs",
        &[NONEWPRIVS],
        &[&nonewprivs_layer(&src)?],
        &ImageConfig {
            cmd: vec!["nnp".into()],
            env: vec![PATH_ENV.into()],
            ..Default::default()
        },
    )?);

    let base = debian_base()?.finish()?;
    built.push(write(
        dir,
        "nonroot",
        &[NONROOT],
        &[&base],
        &ImageConfig {
            cmd: vec!["/bin/sh".into()],
            env: vec![PATH_ENV.into()],
            user: NONROOT_UID.to_string(),
            ..Default::default()
        },
    )?);
    // glibc-dns-testing: the Debian base plus dnsutils, as its own layer.
    let mut dns = RootFs::new(Layout::MergedUsr)?;
    dns.debian_package("bind9-dnsutils")?;
    dns.debian_package("bind9-host")?;
    built.push(write(
        dir,
        "glibc-dns-testing",
        &[GLIBC_DNS_TESTING],
        &[&base, &dns.finish()?],
        &ImageConfig {
            cmd: vec!["bash".into()],
            env: vec![PATH_ENV.into()],
            ..Default::default()
        },
    )?);
    Ok(built)
}

fn write(
    dir: &Path,
    file: &str,
    names: &[&str],
    layers: &[&[u8]],
    config: &ImageConfig,
) -> Result<BuiltImage, ImageError> {
    let archive = dir.join(format!("{file}.tar"));
    let manifest_digest = write_image(names, layers, config, &archive)?;
    Ok(BuiltImage {
        name: names.first().copied().unwrap_or_default().to_string(),
        archive,
        manifest_digest,
    })
}

/// Extracts `tarball` into `into` (emptied first) and returns the
/// directory holding the images' folders (the tarball's top directory).
fn extract_image_files(tarball: &Path, into: &Path) -> Result<PathBuf, ImageError> {
    if !tarball.is_file() {
        return Err(ImageError::Missing {
            path: tarball.to_path_buf(),
            hint: "e2e-image-files.tar.xz of ../shared/k8s".into(),
        });
    }
    if into.exists() {
        std::fs::remove_dir_all(into).map_err(|source| ImageError::Io {
            context: format!("removing {}", into.display()),
            source,
        })?;
    }
    std::fs::create_dir_all(into).map_err(|source| ImageError::Io {
        context: format!("creating {}", into.display()),
        source,
    })?;
    run(Command::new("tar")
        .arg("-xJf")
        .arg(tarball)
        .arg("-C")
        .arg(into)
        .arg("--no-same-owner"))?;
    for candidate in [into.join("e2e-image-files"), into.to_path_buf()] {
        if candidate.join("agnhost").is_dir() {
            return Ok(candidate);
        }
    }
    Err(ImageError::Input(format!(
        "{} has no agnhost/ folder",
        tarball.display()
    )))
}

fn build_pause(src: &Sources, dir: &Path) -> Result<BuiltImage, ImageError> {
    let bin = dir.join("pause-3.10.2");
    run(Command::new("gcc")
        .args([
            "-static",
            "-Os",
            "-Wall",
            "-Werror",
            "-DVERSION=v3.10.2",
            "-o",
        ])
        .arg(&bin)
        .arg(src.file("pause.c")?))?;
    let mut layer = super::LayerBuilder::new();
    layer.host_file("pause", 0o755, &bin)?;
    write(
        dir,
        "pause-3.10.2",
        &[PAUSE],
        &[&layer.finish()?],
        &ImageConfig {
            entrypoint: vec!["/pause".into()],
            env: vec![PATH_ENV.into()],
            user: "65535:65535".into(),
            ..Default::default()
        },
    )
}

/// The skeleton of an Alpine-based image: its directories, the CA bundle,
/// `/etc/passwd` and `/etc/group` (Alpine's, plus `passwd`/`group` lines),
/// glibc's `nsswitch.conf`, and busybox 1.37's applets where no other
/// command of the name is in the image (add Debian's binaries first).
fn alpine_base(
    fs: &mut RootFs,
    src: &Sources,
    passwd: &str,
    group: &str,
) -> Result<(), ImageError> {
    fs.busybox(&src.bin("busybox")?, None)?;
    let layer = fs.layer();
    for (d, mode) in [
        ("dev", 0o755),
        ("proc", 0o555),
        ("sys", 0o555),
        ("run", 0o755),
        ("tmp", 0o1777),
        ("root", 0o700),
        ("home", 0o755),
        ("etc", 0o755),
        ("media", 0o755),
        ("mnt", 0o755),
        ("opt", 0o755),
        ("srv", 0o755),
        ("usr/local/bin", 0o755),
        ("usr/local/sbin", 0o755),
        ("var/cache", 0o755),
        ("var/lib", 0o755),
        ("var/log", 0o755),
        ("var/spool", 0o755),
        ("var/tmp", 0o1777),
        ("var/empty", 0o555),
    ] {
        layer.dir(d, mode)?;
    }
    if !layer.contains("var/run") {
        layer.symlink("var/run", "/run")?;
    }
    layer.file(
        "etc/passwd",
        0o644,
        format!("{ALPINE_PASSWD}{passwd}").as_bytes(),
    )?;
    layer.file(
        "etc/group",
        0o644,
        format!("{ALPINE_GROUP}{group}").as_bytes(),
    )?;
    layer.file("etc/nsswitch.conf", 0o644, NSSWITCH.as_bytes())?;
    host_etc_files(layer)?;
    Ok(())
}

/// The host's `/etc/services`, `/etc/protocols` (netbase) and CA bundle
/// (ca-certificates), where present.
fn host_etc_files(layer: &mut super::LayerBuilder) -> Result<(), ImageError> {
    for path in [
        "/etc/services",
        "/etc/protocols",
        "/etc/ssl/certs/ca-certificates.crt",
    ] {
        let rel = path.trim_start_matches('/');
        if Path::new(path).is_file() && !layer.contains(rel) {
            layer.host_file(rel, 0o644, Path::new(path))?;
        }
    }
    Ok(())
}

fn agnhost_layer(src: &Sources) -> Result<Vec<u8>, ImageError> {
    let mut fs = RootFs::new(Layout::Split)?;
    // What upstream adds with apk: bind-tools curl netcat-openbsd iproute2
    // iperf bash util-linux-misc.
    for package in [
        "curl",
        "netcat-openbsd",
        "bind9-dnsutils",
        "bind9-host",
        "iproute2",
        "iperf",
        "bash",
    ] {
        fs.debian_package(package)?;
    }
    // Debian's `nc` is an alternatives link; Alpine's netcat-openbsd
    // installs /usr/bin/nc.
    fs.layer().symlink("usr/bin/nc", "/bin/nc.openbsd")?;
    fs.host_binaries(&[
        ("/usr/bin/getent", "libc-bin"),
        ("/usr/bin/ipcs", "util-linux"),
        ("/usr/bin/ipcmk", "util-linux"),
        ("/usr/bin/ipcrm", "util-linux"),
        ("/usr/bin/lsipc", "util-linux"),
    ])?;
    fs.layer()
        .symlink("usr/local/bin/iperf", "/usr/bin/iperf")?;
    alpine_base(
        &mut fs,
        src,
        "user-defined-in-image:x:1000:1000:Linux User,,,:/home/user-defined-in-image:/bin/sh\n",
        "user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n",
    )?;
    let layer = fs.layer();
    layer.dir_owned("home/user-defined-in-image", 0o755, 1000, 1000)?;
    layer.dir("uploads", 0o755)?;
    layer.host_file("localhost.crt", 0o644, &src.file("agnhost/localhost.crt")?)?;
    layer.host_file("localhost.key", 0o644, &src.file("agnhost/localhost.key")?)?;
    layer.host_file("agnhost", 0o755, &src.bin("agnhost")?)?;
    layer.symlink("agnhost-2", "agnhost")?;
    fs.finish()
}

fn agnhost_config(cmd: Vec<String>) -> ImageConfig {
    ImageConfig {
        entrypoint: vec!["/agnhost".into()],
        cmd,
        env: vec![PATH_ENV.into()],
        exposed_ports: ["80", "8080", "8081", "9376", "5000"]
            .iter()
            .map(|p| format!("{p}/tcp"))
            .collect(),
        ..Default::default()
    }
}

/// The official busybox image: every applet in `/bin`, its users.
fn busybox_layer(src: &Sources) -> Result<Vec<u8>, ImageError> {
    let mut fs = RootFs::new(Layout::Split)?;
    fs.busybox(&src.bin("busybox")?, Some("/bin"))?;
    let layer = fs.layer();
    for (d, mode) in [
        ("dev", 0o755),
        ("etc", 0o755),
        ("home", 0o755),
        ("proc", 0o555),
        ("root", 0o700),
        ("sys", 0o555),
        ("tmp", 0o1777),
        ("usr", 0o755),
        ("var", 0o755),
        ("var/spool/mail", 0o755),
        ("var/www", 0o755),
    ] {
        layer.dir(d, mode)?;
    }
    layer.file("etc/passwd", 0o644, BUSYBOX_PASSWD.as_bytes())?;
    layer.file("etc/group", 0o644, BUSYBOX_GROUP.as_bytes())?;
    layer.file("etc/nsswitch.conf", 0o644, NSSWITCH.as_bytes())?;
    fs.finish()
}

/// The official nginx Alpine image's files, with Debian's nginx.
fn nginx_layer(src: &Sources) -> Result<Vec<u8>, ImageError> {
    let mut fs = RootFs::new(Layout::Split)?;
    fs.host_binaries(&[("/usr/sbin/nginx", "nginx-light")])?;
    alpine_base(
        &mut fs,
        src,
        "nginx:x:101:101:nginx:/var/cache/nginx:/sbin/nologin\n",
        "nginx:x:101:nginx\n",
    )?;
    let layer = fs.layer();
    layer.dir("etc/nginx/conf.d", 0o755)?;
    for f in [
        "mime.types",
        "fastcgi_params",
        "scgi_params",
        "uwsgi_params",
        "koi-utf",
        "koi-win",
        "win-utf",
    ] {
        let host = Path::new("/etc/nginx").join(f);
        if !host.is_file() {
            return Err(ImageError::Missing {
                path: host,
                hint: "Debian package nginx-common (with nginx-light; scripts/install-deps installs it)"
                    .into(),
            });
        }
        layer.host_file(&format!("etc/nginx/{f}"), 0o644, &host)?;
    }
    layer.file("etc/nginx/nginx.conf", 0o644, NGINX_CONF.as_bytes())?;
    layer.file(
        "etc/nginx/conf.d/default.conf",
        0o644,
        NGINX_DEFAULT_CONF.as_bytes(),
    )?;
    layer.file(
        "usr/share/nginx/html/index.html",
        0o644,
        NGINX_INDEX.as_bytes(),
    )?;
    layer.file("usr/share/nginx/html/50x.html", 0o644, NGINX_50X.as_bytes())?;
    layer.dir("var/cache/nginx", 0o755)?;
    // Debian's build keeps its temporary files under /var/lib/nginx.
    layer.dir("var/lib/nginx", 0o755)?;
    layer.dir("var/log/nginx", 0o755)?;
    layer.symlink("var/log/nginx/access.log", "/dev/stdout")?;
    layer.symlink("var/log/nginx/error.log", "/dev/stderr")?;
    layer.dir("docker-entrypoint.d", 0o755)?;
    fs.finish()
}

fn nonewprivs_layer(src: &Sources) -> Result<Vec<u8>, ImageError> {
    let mut fs = RootFs::new(Layout::Split)?;
    alpine_base(&mut fs, src, "", "")?;
    // `chmod +s`: setuid and setgid.
    fs.layer()
        .host_file("usr/local/bin/nnp", 0o6755, &src.bin("nnp")?)?;
    fs.finish()
}

/// A Debian bookworm base (merged `/usr`) from this host's packages
/// ([`DEBIAN_BASE_PACKAGES`]), with Debian's users and groups.
fn debian_base() -> Result<RootFs, ImageError> {
    let mut fs = RootFs::new(Layout::MergedUsr)?;
    for package in DEBIAN_BASE_PACKAGES {
        fs.debian_package(package)?;
    }
    // Links Debian's maintainer scripts create (alternatives).
    if !fs.layer().contains("usr/bin/awk") {
        fs.layer().symlink("usr/bin/awk", "mawk")?;
    }
    let layer = fs.layer();
    for (d, mode) in [("tmp", 0o1777), ("root", 0o700), ("var/tmp", 0o1777)] {
        layer.dir(d, mode)?;
    }
    let passwd = debian_accounts("passwd.master")?;
    let group = debian_accounts("group.master")?;
    layer.file("etc/passwd", 0o644, passwd.as_bytes())?;
    layer.file("etc/group", 0o644, group.as_bytes())?;
    layer.file(
        "etc/nsswitch.conf",
        0o644,
        b"passwd: files\ngroup: files\nshadow: files\ngshadow: files\n\nhosts: files dns\nnetworks: files\n\nprotocols: db files\nservices: db files\nethers: db files\nrpc: db files\n\nnetgroup: nis\n",
    )?;
    host_etc_files(layer)?;
    Ok(fs)
}

/// Debian's default `/etc/passwd` or `/etc/group` (base-passwd's master
/// file, with `x` for the password as `update-passwd` writes it).
fn debian_accounts(master: &str) -> Result<String, ImageError> {
    let path = Path::new("/usr/share/base-passwd").join(master);
    let text = std::fs::read_to_string(&path).map_err(|_| ImageError::Missing {
        path: path.clone(),
        hint: "Debian package base-passwd".into(),
    })?;
    Ok(text
        .lines()
        .map(|l| match l.split_once(':') {
            Some((name, rest)) => {
                let rest = rest.strip_prefix('*').unwrap_or(rest);
                format!("{name}:x{rest}\n")
            }
            None => format!("{l}\n"),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debian_accounts_have_x_passwords() {
        if !Path::new("/usr/share/base-passwd/passwd.master").exists() {
            crate::support::skip("debian_accounts_have_x_passwords", "no base-passwd here");
            return;
        }
        let passwd = debian_accounts("passwd.master").expect("passwd");
        assert!(
            passwd.starts_with("root:x:0:0:root:/root:/bin/bash\n"),
            "{passwd}"
        );
        assert!(passwd.contains("\nnobody:x:65534:65534:"), "{passwd}");
    }

    #[test]
    fn not_built_names_are_not_built() {
        for (name, reason) in NOT_BUILT {
            assert!(!reason.is_empty());
            for built in [
                AGNHOST,
                AGNHOST_PREV,
                KITTEN,
                NAUTILUS,
                BUSYBOX,
                BUSYBOX_PREV,
                NGINX,
                NGINX_NEW,
                NONEWPRIVS,
                NONROOT,
                GLIBC_DNS_TESTING,
                PAUSE,
            ] {
                assert_ne!(*name, built);
            }
        }
    }
}

#!/usr/bin/env bash
# Installs or removes keelson as a systemd service. Safe to run twice.
#
#   packaging/install.sh [install] [--binary FILE] [--prefix DIR]
#                        [--node-kubeconfig FILE] [--proxy-kubeconfig FILE]
#                        [--enable] [--now]
#   packaging/install.sh uninstall [--prefix DIR] [--purge]
#
# install   puts the binary in PREFIX/bin (default /usr/local/bin), the unit
#           in /etc/systemd/system/keelson.service, the default configuration
#           in /etc/keelson/config.yaml (only when absent: a changed copy is
#           never overwritten; the shipped default is always refreshed in
#           PREFIX/share/keelson/config.yaml), the given kubeconfigs in
#           /etc/keelson/{node,proxy}.kubeconfig (mode 0600), creates
#           /var/lib/keelson and /var/log/pods, validates the configuration
#           with `keelson check-config`, and reloads systemd. --enable enables
#           the unit; --now also starts it (or restarts it when running, which
#           keeps containers running: KillMode=process). --now refuses while
#           kubelet.service or kube-proxy.service is active; --enable (and
#           --now) refuse while either is enabled.
# uninstall stops and disables the unit, removes the proxy role's nftables
#           tables and eBPF programs (`keelson cleanup`), removes what install added,
#           keeping /etc/keelson and /var/lib/keelson unless --purge (which
#           refuses while anything is mounted below /var/lib/keelson).
#
# Environment:
#   DESTDIR   install below this directory instead of / (packaging, tests);
#             systemctl is then not run unless SYSTEMCTL is set.
#   SYSTEMCTL the systemctl command (default: systemctl, or nothing with DESTDIR).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"

die() {
  echo "install.sh: $*" >&2
  exit 1
}
say() { echo "install.sh: $*"; }

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//'
}

action=install
case "${1:-}" in
  install | uninstall)
    action="$1"
    shift
    ;;
  -h | --help | help)
    usage
    exit 0
    ;;
esac

prefix=/usr/local
binary=""
node_kubeconfig=""
proxy_kubeconfig=""
enable=0
now=0
purge=0
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix="${2:?--prefix needs a directory}"; shift 2 ;;
    --prefix=*) prefix="${1#*=}"; shift ;;
    --binary) binary="${2:?--binary needs a file}"; shift 2 ;;
    --binary=*) binary="${1#*=}"; shift ;;
    --node-kubeconfig) node_kubeconfig="${2:?--node-kubeconfig needs a file}"; shift 2 ;;
    --node-kubeconfig=*) node_kubeconfig="${1#*=}"; shift ;;
    --proxy-kubeconfig) proxy_kubeconfig="${2:?--proxy-kubeconfig needs a file}"; shift 2 ;;
    --proxy-kubeconfig=*) proxy_kubeconfig="${1#*=}"; shift ;;
    --enable) enable=1; shift ;;
    --now) enable=1; now=1; shift ;;
    --purge) purge=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
done
case "$prefix" in
  /*) ;;
  *) die "--prefix must be an absolute path, got $prefix" ;;
esac
if [ "$action" = install ] && [ "$purge" = 1 ]; then
  die "--purge is an uninstall option"
fi
if [ "$action" = uninstall ] && { [ "$enable" = 1 ] || [ -n "$binary$node_kubeconfig$proxy_kubeconfig" ]; }; then
  die "uninstall takes only --prefix and --purge"
fi

dest="${DESTDIR:-}"
dest="${dest%/}"
if [ -n "${SYSTEMCTL+set}" ]; then
  systemctl_cmd="$SYSTEMCTL"
elif [ -n "$dest" ]; then
  systemctl_cmd=""
else
  systemctl_cmd="systemctl"
fi
if [ -z "$dest" ] && [ "$(id -u)" -ne 0 ]; then
  die "run as root (or set DESTDIR to install below a directory)"
fi

bindir="$prefix/bin"
sharedir="$prefix/share/keelson"
docdir="$prefix/share/doc/keelson"
unitdir=/etc/systemd/system
confdir=/etc/keelson
rootdir=/var/lib/keelson
logdir=/var/log/pods
unit=keelson.service

# Runs systemctl when there is one to run; a failure is reported, not fatal,
# unless $1 is "must".
run_systemctl() {
  local must="$1"
  shift
  [ -n "$systemctl_cmd" ] || return 0
  if ! $systemctl_cmd "$@"; then
    if [ "$must" = must ]; then
      die "systemctl $* failed"
    fi
    say "note: systemctl $* failed (ignored)"
  fi
}

# Whether systemctl reports the unit active.
unit_active() {
  [ -n "$systemctl_cmd" ] || return 1
  $systemctl_cmd is-active --quiet "$1" 2>/dev/null
}

# Whether systemctl reports the unit enabled (it would start at boot).
unit_enabled() {
  [ -n "$systemctl_cmd" ] || return 1
  $systemctl_cmd is-enabled --quiet "$1" 2>/dev/null
}

# Copies $1 to $2 with mode $3 through a temporary file and a rename, so a
# running binary is never written in place and a second run changes nothing.
put() {
  local src="$1" dst="$2" mode="$3"
  mkdir -p "$(dirname "$dst")"
  if [ -f "$dst" ] && cmp -s "$src" "$dst"; then
    chmod "$mode" "$dst"
    return 0
  fi
  local tmp
  tmp="$(mktemp "$dst.XXXXXX")"
  cp "$src" "$tmp"
  chmod "$mode" "$tmp"
  mv -f "$tmp" "$dst"
  say "installed ${dst#"$dest"}"
}

find_binary() {
  if [ -n "$binary" ]; then
    [ -f "$binary" ] || die "--binary $binary: no such file"
    echo "$binary"
    return
  fi
  for c in "$repo/target/release/keelson" "$repo/target/debug/keelson"; do
    if [ -x "$c" ]; then
      echo "$c"
      return
    fi
  done
  die "no keelson binary: build one (cargo build --release -p keelson) or pass --binary FILE"
}

do_install() {
  local bin src_unit tmp
  bin="$(find_binary)"
  "$bin" version >/dev/null || die "$bin does not run"
  if [ "$now" = 1 ]; then
    for other in kubelet.service kube-proxy.service; do
      if unit_active "$other"; then
        die "$other is active: stop and disable it first (docs/install.md, 'Replacing kubelet and kube-proxy'), or install without --now"
      fi
    done
  fi
  # Two node agents enabled at once would fight at the next boot (the unit
  # conflicts with them: whichever starts last stops the other).
  if [ "$enable" = 1 ]; then
    for other in kubelet.service kube-proxy.service; do
      if unit_enabled "$other"; then
        die "$other is enabled: disable it first (systemctl disable $other; docs/install.md, 'Replacing kubelet and kube-proxy'), or install without --enable"
      fi
    done
  fi

  put "$bin" "$dest$bindir/keelson" 0755

  # The unit, pointed at this prefix.
  tmp="$(mktemp)"
  sed -e "s#/usr/local/bin/keelson#$bindir/keelson#g" \
    -e "s#file:///usr/local/share/doc/keelson/#file://$docdir/#g" \
    "$here/keelson.service" >"$tmp"
  put "$tmp" "$dest$unitdir/$unit" 0644
  rm -f "$tmp"

  put "$here/config.yaml" "$dest$sharedir/config.yaml" 0644
  if [ -f "$repo/docs/install.md" ]; then
    put "$repo/docs/install.md" "$dest$docdir/install.md" 0644
  fi
  mkdir -p "$dest$confdir"
  chmod 0755 "$dest$confdir"
  if [ -e "$dest$confdir/config.yaml" ]; then
    if ! cmp -s "$here/config.yaml" "$dest$confdir/config.yaml"; then
      say "kept $confdir/config.yaml (changed locally); the shipped default is $sharedir/config.yaml"
    fi
  else
    put "$here/config.yaml" "$dest$confdir/config.yaml" 0644
  fi
  if [ -n "$node_kubeconfig" ]; then
    [ -f "$node_kubeconfig" ] || die "--node-kubeconfig $node_kubeconfig: no such file"
    put "$node_kubeconfig" "$dest$confdir/node.kubeconfig" 0600
  fi
  if [ -n "$proxy_kubeconfig" ]; then
    [ -f "$proxy_kubeconfig" ] || die "--proxy-kubeconfig $proxy_kubeconfig: no such file"
    put "$proxy_kubeconfig" "$dest$confdir/proxy.kubeconfig" 0600
  fi
  mkdir -p "$dest$rootdir" "$dest$logdir"
  chmod 0700 "$dest$rootdir"
  chmod 0755 "$dest$logdir"

  if ! "$dest$bindir/keelson" check-config "$dest$confdir/config.yaml" >/dev/null; then
    die "$confdir/config.yaml is not valid (see above); fix it, then run install again"
  fi
  for k in node.kubeconfig proxy.kubeconfig; do
    if ! grep -q "$confdir/$k" "$dest$confdir/config.yaml"; then
      continue
    fi
    if [ ! -e "$dest$confdir/$k" ]; then
      say "note: $confdir/$k does not exist yet; keelson needs it to start (docs/install.md, 'Credentials')"
    fi
  done

  run_systemctl must daemon-reload
  if [ "$enable" = 1 ]; then
    run_systemctl must enable "$unit"
  fi
  if [ "$now" = 1 ]; then
    if unit_active "$unit"; then
      # A restart keeps pods running (KillMode=process); keelson adopts them.
      run_systemctl must restart "$unit"
    else
      run_systemctl must start "$unit"
    fi
  fi
  say "done"
}

# Mount points at or below $1 (from /proc/self/mountinfo, octal escapes kept).
mounts_below() {
  awk -v d="$1" '{ if ($5 == d || index($5, d "/") == 1) print $5 }' /proc/self/mountinfo
}

do_uninstall() {
  if [ -n "$systemctl_cmd" ] && [ -e "$dest$unitdir/$unit" ]; then
    run_systemctl ignore disable --now "$unit"
  fi
  # The proxy role's nftables tables and eBPF pins outlive the process (as
  # kube-proxy's rules do); remove them once keelson has stopped. Only on
  # the real root: with DESTDIR the kernel state is not ours to change.
  if [ -z "$dest" ] && [ -x "$bindir/keelson" ]; then
    local cfg_args=()
    [ -f "$confdir/config.yaml" ] && cfg_args=(--config "$confdir/config.yaml")
    if "$bindir/keelson" cleanup "${cfg_args[@]}"; then
      say "removed keelson's nftables tables and eBPF programs"
    else
      say "warning: keelson cleanup failed; remove the 'keelson' nftables tables by hand (nft delete table ip keelson)"
    fi
  fi
  local f
  for f in "$dest$unitdir/$unit" "$dest$bindir/keelson" "$dest$sharedir/config.yaml" "$dest$docdir/install.md"; do
    if [ -e "$f" ]; then
      rm -f "$f"
      say "removed ${f#"$dest"}"
    fi
  done
  rmdir "$dest$sharedir" "$dest$docdir" 2>/dev/null || true
  if [ -d "$dest$unitdir/$unit.d" ]; then
    say "kept drop-ins in $unitdir/$unit.d"
  fi
  run_systemctl ignore daemon-reload
  if [ "$purge" = 1 ]; then
    local root
    root="$(cd "$dest$rootdir" 2>/dev/null && pwd -P || true)"
    if [ -n "$root" ] && [ -n "$(mounts_below "$root")" ]; then
      die "not purging $rootdir: volumes are still mounted below it (drain the node and let keelson tear pods down first):
$(mounts_below "$root")"
    fi
    if [ -n "$root" ]; then
      rm -rf --one-file-system "$dest$rootdir"
      say "removed $rootdir"
    fi
    if [ -d "$dest$confdir" ]; then
      rm -rf "$dest$confdir"
      say "removed $confdir"
    fi
  else
    [ -d "$dest$confdir" ] && say "kept $confdir (uninstall --purge removes it)"
    [ -d "$dest$rootdir" ] && say "kept $rootdir (uninstall --purge removes it)"
  fi
  say "done"
}

case "$action" in
  install) do_install ;;
  uninstall) do_uninstall ;;
esac

# Shared by scripts/demo and scripts/test (sourced, not run).

# keelson_require_root NAME WHY: exits with a message unless run as root.
keelson_require_root() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "$1: run as root ($2): sudo ./scripts/$1" >&2
    exit 1
  fi
}

# keelson_toolchain: puts cargo on PATH; under sudo, a toolchain installed
# by the invoking user is used (found before install-deps, which would
# otherwise install one for root). Also puts keelson's own tools
# (kubectl v1.36, installed by install-deps) first.
keelson_toolchain() {
  export PATH="/usr/local/lib/keelson/bin:$HOME/.cargo/bin:$PATH"
  if ! command -v cargo >/dev/null 2>&1 && [ -n "${SUDO_USER:-}" ]; then
    local user_home
    user_home="$(getent passwd "$SUDO_USER" | cut -d: -f6)"
    export PATH="$user_home/.cargo/bin:$PATH"
    export RUSTUP_HOME="${RUSTUP_HOME:-$user_home/.rustup}"
  fi
}

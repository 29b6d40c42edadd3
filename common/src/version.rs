//! Versions keelson reports.

/// keelson's own version.
pub const KEELSON_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The Kubernetes version keelson implements: the API it is built against
/// (k8s-openapi feature `v1_36`) and what it reports as `kubeletVersion`
/// and `kubeProxyVersion`.
pub const KUBERNETES_VERSION: &str = "v1.36.0";

/// `<major>.<minor>` of [`KUBERNETES_VERSION`], as probes put it in their
/// `User-Agent: kube-probe/1.36`.
pub const KUBERNETES_MINOR: &str = "1.36";

/// The user agent of a role's API client: `keelson-<role>/<version> (linux/<arch>) kubernetes/<k8s version>`.
pub fn user_agent(role: &str) -> String {
    format!(
        "keelson-{role}/{KEELSON_VERSION} ({}/{}) kubernetes/{KUBERNETES_VERSION}",
        std::env::consts::OS,
        go_arch()
    )
}

/// The architecture in Go's spelling (`amd64`, `arm64`), as Kubernetes labels use.
pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        "arm" => "arm",
        "riscv64" => "riscv64",
        other => other,
    }
}

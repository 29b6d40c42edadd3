//! The upstream tier: keelson against the real Kubernetes v1.36 control
//! plane, each case run with keelson and with the real kubelet and
//! kube-proxy as the agents (`upstream_keelson_*`, `upstream_kube_*`).
//! Runner and cluster: `keelson_tests::upstream`.
//!
//! `KEELSON_UPSTREAM_BIN=DIR cargo test -p keelson-tests upstream_` runs
//! exactly this tier; without the binaries every case is reported skipped.

mod authz_matrix_cases;
mod config_cases;
mod csi_cases;
mod csi_pv_cases;
mod device_cases;
mod diagnose_cases;
mod hostile_cases;
mod migrate_cases;
mod node_api_cases;
mod node_cases;
mod pod_cases;
mod podspec_cases;
mod service_cases;
mod serving_bootstrap_cases;
mod shutdown_cases;
mod support;
mod volume_cases;
mod volume_stats_cases;

use keelson_tests::upstream::Case;
use keelson_tests::upstream::runner;

fn main() -> std::process::ExitCode {
    let cases: Vec<Case> = [
        node_cases::CASES,
        pod_cases::CASES,
        podspec_cases::CASES,
        service_cases::CASES,
        node_api_cases::CASES,
        authz_matrix_cases::CASES,
        diagnose_cases::CASES,
        config_cases::CASES,
        serving_bootstrap_cases::CASES,
        migrate_cases::CASES,
        device_cases::CASES,
        shutdown_cases::CASES,
        volume_cases::CASES,
        volume_stats_cases::CASES,
        csi_cases::CASES,
        csi_pv_cases::CASES,
        hostile_cases::CASES,
    ]
    .concat();
    runner::main(&cases)
}

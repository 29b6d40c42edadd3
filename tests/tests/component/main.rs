//! The component tier: keelson's node role in-process against the test API
//! server (`keelson_tests::testapi`) and the fake CRI runtime
//! (`keelson_cri::fake`), the test API server itself, `keelson migrate`
//! against a fake kubeadm node, the `keelson-proxy` binary beside
//! `keelson run --proxy-only`, and the packaging that needs no
//! containerd. One test binary; each module is what used to be a test
//! binary of its own and keeps that name, so
//! `cargo test -p keelson-tests --test component node_pods_lifecycle::`
//! runs what `--test node_pods_lifecycle` ran (a bare
//! `cargo test -p keelson-tests node_pods_lifecycle::` finds it too).
//!
//! The modules share one process and run concurrently on libtest's threads
//! (`scripts/test` passes `--test-threads=4`). Each was checked for state
//! that belongs to the whole process, and none has any:
//! - no `std::env::set_var`, `chdir`, umask, rlimit, signal handler or
//!   global tracing subscriber; keelson's own (`logging::init`,
//!   `lifecycle::cancel_on_signals`) are called by its `main` only, never by
//!   the in-process node role these tests drive;
//! - namespaces are entered by threads only (`NetNs::run` and friends
//!   spawn a thread that calls setns), and the mount and network
//!   namespaces of `packaging_*` are `unshare(1)` children;
//! - paused time (`start_paused`) belongs to each `#[tokio::test]`'s own
//!   runtime;
//! - nothing binds a fixed port or path: servers listen on port 0, each
//!   test has its own temporary directory, node name
//!   (`keelson_tests::netns::unique_suffix`) and child processes (kubectl,
//!   dbus-daemon, keelson-testapi), which it stops by PID;
//! - the checks that count things read their own objects: the fds open on
//!   their own log file (`node_api`), their own test API server's request
//!   log, their own mounts below their own temporary root (`node_volumes_*`);
//! - Prometheus registries are made per node, not the default registry.
//!
//! The timing-sensitive modules (`node_status_lease`, `node_status_outage`,
//! `node_status_runtime`, `node_pods_pleg`) wait with deadlines and allow
//! for a loaded machine; they were run folded, under the same four
//! threads, with the rest of the tier.

mod migrate_kubeadm_node;
mod node_api;
mod node_certificates;
mod node_cgroup_driver;
mod node_eviction_events;
mod node_eviction_gc;
mod node_log_rotation;
mod node_pods_admission;
mod node_pods_adoption;
mod node_pods_backoff;
mod node_pods_credential_providers;
mod node_pods_deadline;
mod node_pods_ephemeral;
mod node_pods_image_credentials;
mod node_pods_lifecycle;
mod node_pods_outage;
mod node_pods_pleg;
mod node_pods_resize;
mod node_pods_restart_all;
mod node_pods_restart_rules;
mod node_pods_runtime_class;
mod node_pods_security_contexts;
mod node_pods_static;
mod node_pods_support;
mod node_pods_termination;
mod node_pods_termination_message;
mod node_pods_unsupported_fields;
mod node_probes_wiring;
mod node_shutdown_graceful;
mod node_status_lease;
mod node_status_outage;
mod node_status_registration;
mod node_status_runtime;
mod node_volumes_plugins;
mod node_volumes_support;
mod node_volumes_updates;
mod packaging_install;
mod packaging_manifests;
mod proxy_binary;
mod testapi_binary;
mod testapi_knobs;
mod testapi_kube;
mod testapi_kubectl;
mod testapi_watch;

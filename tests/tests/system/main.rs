//! The system tier (root): real containerd, runc and CNI plugins started by
//! the harness, the real `keelson` binary, real nftables rules and eBPF
//! programs with real traffic in network namespaces the tests create, a
//! real systemd in private namespaces, the README's demo, the proxy
//! DaemonSet run for real and the benchmark's smoke run. One test binary;
//! each module is what used to be a test binary of its own and keeps that
//! name, so `cargo test -p keelson-tests --test system system_diagnose::`
//! runs what `--test system_diagnose` ran.
//!
//! The modules share one process and run concurrently on libtest's threads
//! (`scripts/test` passes `--test-threads=4`). What each does to the whole
//! process was checked:
//! - **Moving this process into a cgroup** (the socket LB serves only
//!   sockets made by processes of its cgroup) is the one thing that cannot
//!   be shared: while the process is inside, every socket any test makes is
//!   load-balanced by that test's programs (the nftables tests use the same
//!   Service case table, the same VIPs) and every process any test starts
//!   is born in that cgroup. The two modules that do it,
//!   `system_ebpf_proxy_cases` and `system_proxy_churn`, are the separate
//!   binary `system_process_cgroup` (see `keelson_tests::ebpf_env`). Here,
//!   `system_ebpf_socket_lb` moves child processes (this binary re-run as
//!   its ignored `ebpf_client_process`), and `system_diagnose` a child
//!   shell that becomes `keelson diagnose`.
//! - Namespaces are entered by threads (`NetNs::run`, `connect_in`), by
//!   child processes (`nsenter`, `unshare`, the keelson binary) or by a
//!   private systemd, never by this process.
//! - Children of this binary (`system_cri_containerd`'s killed run,
//!   `system_ebpf_socket_lb`'s clients) are selected by their full test
//!   name (`keelson_tests::support::libtest_name`).
//! - Names are unique per process: containerd instances are
//!   `/var/tmp/keelson-containerd/<pid>-<n>`, and an instance claims only
//!   the processes that name its own directory (`<pid>-1` never those of
//!   `<pid>-10`); network namespaces, node names, cgroup roots, bpffs
//!   mounts and eBPF cgroups take `keelson_tests::netns::unique_suffix`.
//! - Fixed ports are bound only inside the test's own network namespace
//!   (the proxy lab's node: 6443, 10248, 10249, 10256; a containerd
//!   instance's: 10248, 10255).
//! - `system_eviction_memory` reaches pressure on its own pods' cgroup
//!   (`allocatableMemory.available`, the node's allocatable shrunk to
//!   400Mi by `systemReserved`), not on the machine's memory, so other
//!   tests' memory does not decide it. `bench_smoke` runs `keelson-bench`
//!   in its own namespaces and cgroup and asserts behaviour, no timing.
//!
//! `node_volumes_support` is the component tier's (`system_volumes_cri`
//! drives the same volume manager against real containers).

mod bench_smoke;
#[path = "../component/node_volumes_support.rs"]
mod node_volumes_support;
mod packaging_daemonset;
mod system_cri_containerd;
mod system_demo;
mod system_devices_plugins;
mod system_diagnose;
mod system_e2e_images;
mod system_ebpf_socket_lb;
mod system_eviction_memory;
mod system_netns_support;
mod system_node_api;
mod system_node_status;
mod system_pods_cgroups;
mod system_pods_lifecycle;
mod system_pods_podspec;
mod system_pods_support;
mod system_pods_systemd_cgroups;
mod system_probes_wiring;
mod system_proxy_nftables;
mod system_proxy_role;
mod system_volumes_cri;
mod system_volumes_node;

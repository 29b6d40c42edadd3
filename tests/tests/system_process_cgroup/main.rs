//! The system tests that move this test process into a cgroup (root): the
//! eBPF socket LB serves only sockets made by processes of the cgroup it is
//! attached to, and these tests make their probe sockets from threads of
//! this process, so they move the whole process in and out of their test
//! cgroup (`keelson_tests::ebpf_env::TestCgroup`).
//!
//! That is process-wide, which is why they are not in the `system` binary:
//! while the process is inside, every socket any other test makes would be
//! load-balanced by these programs (`system_proxy_nftables` probes the same
//! Service case table, the same VIPs), and every process another test
//! starts (containerd, keelson, kubectl) would be born in the cgroup and
//! keep it from being removed. Here, the two modules take turns:
//! `TestCgroup::enter` waits for the process-wide turn, which the holder
//! gives back at `leave` (or drop), so one test at a time has the process
//! inside its cgroup. The nftables churn test runs meanwhile, as it always
//! did beside the eBPF one: its VIP (10.96.0.77) is in no eBPF test's
//! maps, and the only processes it starts (`ip`, `nsenter`) run to
//! completion (a cgroup they were born in is removed once they left it).
//!
//! Each module is what used to be a test binary of its own and keeps that
//! name: `cargo test -p keelson-tests --test system_process_cgroup
//! system_proxy_churn::`.

mod system_ebpf_proxy_cases;
mod system_proxy_churn;

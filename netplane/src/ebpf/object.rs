//! The compiled eBPF object, embedded at build time.
//!
//! `netplane/build.rs` compiles `ebpf/src/sock_lb.c` with clang into
//! `OUT_DIR`; the bytes live in the keelson binary, so a node needs no
//! object file on disk and the programs always match the map layouts of
//! this build.

/// The socket-LB object (ELF, bpf target, with BTF).
pub static SOCK_LB_OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/sock_lb.o"));

/// The programs of the object: (function name, pin name). Each is attached
/// to the cgroup for the hook its section names.
pub const PROGRAMS: &[(&str, &str)] = &[
    ("kl_connect4", "connect4"),
    ("kl_connect6", "connect6"),
    ("kl_sendmsg4", "sendmsg4"),
    ("kl_sendmsg6", "sendmsg6"),
    ("kl_recvmsg4", "recvmsg4"),
    ("kl_recvmsg6", "recvmsg6"),
    ("kl_getpeername4", "getpeername4"),
    ("kl_getpeername6", "getpeername6"),
];

/// Map names with their type and key/value sizes, as the object defines
/// them; a pinned map that differs is replaced at start.
pub const MAPS: &[MapSpec] = &[
    MapSpec {
        name: "kl_services",
        lru: false,
        key_size: 20,
        value_size: 16,
    },
    MapSpec {
        name: "kl_backends",
        lru: false,
        key_size: 8,
        value_size: 20,
    },
    MapSpec {
        name: "kl_members",
        lru: false,
        key_size: 24,
        value_size: 1,
    },
    MapSpec {
        name: "kl_affinity",
        lru: true,
        key_size: 16,
        value_size: 32,
    },
    MapSpec {
        name: "kl_revnat",
        lru: true,
        key_size: 32,
        value_size: 20,
    },
];

/// Shape of one map of the object.
#[derive(Clone, Copy, Debug)]
pub struct MapSpec {
    /// Name in the object and pin file name.
    pub name: &'static str,
    /// `BPF_MAP_TYPE_LRU_HASH` (else `BPF_MAP_TYPE_HASH`).
    pub lru: bool,
    /// Key size in bytes.
    pub key_size: u32,
    /// Value size in bytes.
    pub value_size: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_object_is_a_bpf_elf() {
        assert_eq!(&SOCK_LB_OBJECT[..4], b"\x7fELF");
        // e_machine 247 = EM_BPF, little endian at offset 18.
        assert_eq!(
            u16::from_le_bytes([SOCK_LB_OBJECT[18], SOCK_LB_OBJECT[19]]),
            247
        );
    }

    #[test]
    fn object_has_every_program_and_map() {
        let obj = aya_obj_names();
        for (func, _) in PROGRAMS {
            assert!(obj.contains(func), "program {func} missing");
        }
        for m in MAPS {
            assert!(obj.contains(m.name), "map {} missing", m.name);
        }
    }

    /// Symbol names in the object's string tables (good enough to find the
    /// programs and maps without parsing ELF).
    fn aya_obj_names() -> String {
        String::from_utf8_lossy(SOCK_LB_OBJECT).into_owned()
    }
}

//! FNV-1a, 32 bits (Go's `hash/fnv` `New32a`): kubelet's container hash
//! (`runtime::hash`) and the allocation checkpoint's checksum
//! (`allocation::checkpoint`).

/// The FNV-1a 32-bit hash of `data`.
pub(crate) fn fnv32a(data: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in data {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

//! Endpoint slots: the keys of `endpoint-slots` and `endpoint-chains`.
//!
//! Each endpoint list a service port renders (its Cluster-policy and its
//! Local-policy endpoints) owns a block of consecutive slot numbers, a
//! power of two in size; its endpoints are the elements `base + i`. The
//! service chain's rule draws `numgen random mod N offset base`, so the
//! rule names the block and the endpoint count, and an endpoint change
//! without a count change is element updates only.
//!
//! A block is kept while the list fits, and replaced by one of the right
//! size when the list outgrows it (or shrinks to a quarter of it). Freed
//! blocks are reused for lists of the same size; new ones are carved above
//! everything handed out so far, aligned to their size.

use std::collections::BTreeMap;

/// Smallest block: 4 slots (lists that change between 1 and 4 endpoints
/// keep theirs).
pub const MIN_ORDER: u8 = 2;

/// A block of `1 << order` slots starting at `base`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotBlock {
    /// First slot.
    pub base: u32,
    /// log2 of the size.
    pub order: u8,
}

impl SlotBlock {
    /// Number of slots.
    pub fn capacity(self) -> u64 {
        1u64 << self.order
    }

    /// The `i`-th slot.
    pub fn slot(self, i: u32) -> u32 {
        self.base.wrapping_add(i)
    }

    /// The block size a list of `n` endpoints needs.
    pub fn order_for(n: usize) -> u8 {
        let n = n.max(1 << MIN_ORDER) as u64;
        let order = 64 - (n - 1).leading_zeros();
        order.min(31) as u8
    }

    /// Whether a list of `n` endpoints stays in this block.
    pub fn fits(self, n: usize) -> bool {
        let n = n as u64;
        n <= self.capacity() && (self.order <= MIN_ORDER || n * 4 > self.capacity())
    }

    /// Whether two blocks overlap.
    pub fn overlaps(self, other: SlotBlock) -> bool {
        let (a0, a1) = (u64::from(self.base), u64::from(self.base) + self.capacity());
        let (b0, b1) = (
            u64::from(other.base),
            u64::from(other.base) + other.capacity(),
        );
        a0 < b1 && b0 < a1
    }
}

/// The slot number space of one table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotSpace {
    /// Everything at or above is unused.
    top: u64,
    /// Freed blocks by order.
    free: BTreeMap<u8, Vec<u32>>,
}

/// Slot numbers end at 2^32.
const SPACE_END: u64 = 1 << 32;

impl SlotSpace {
    /// A space whose blocks `used` are taken (after a restart: the blocks
    /// the kernel's rules name). The gaps between them are not reused.
    pub fn with_used(used: impl IntoIterator<Item = SlotBlock>) -> SlotSpace {
        let top = used
            .into_iter()
            .map(|b| u64::from(b.base) + b.capacity())
            .max()
            .unwrap_or(0);
        SlotSpace {
            top,
            free: BTreeMap::new(),
        }
    }

    /// A block for a list of `n` endpoints; `None` when the space is full.
    pub fn alloc(&mut self, n: usize) -> Option<SlotBlock> {
        let order = SlotBlock::order_for(n);
        if let Some(base) = self.free.get_mut(&order).and_then(Vec::pop) {
            return Some(SlotBlock { base, order });
        }
        let size = 1u64 << order;
        let base = self.top.div_ceil(size) * size;
        if base + size > SPACE_END {
            return None;
        }
        self.top = base + size;
        u32::try_from(base)
            .ok()
            .map(|base| SlotBlock { base, order })
    }

    /// Returns a block for reuse.
    pub fn free(&mut self, block: SlotBlock) {
        self.free.entry(block.order).or_default().push(block.base);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_powers_of_two_aligned_and_reused() {
        let mut s = SlotSpace::default();
        let a = s.alloc(3).expect("a");
        assert_eq!((a.base, a.order), (0, MIN_ORDER));
        let b = s.alloc(10).expect("b");
        assert_eq!((b.base, b.order), (16, 4), "aligned to its size");
        assert!(!a.overlaps(b));
        s.free(a);
        let c = s.alloc(1).expect("c");
        assert_eq!(c, a, "a freed block of the same size is reused");
        let d = s.alloc(4).expect("d");
        assert_eq!(d.base, 32);
    }

    #[test]
    fn a_block_is_kept_while_the_list_fits() {
        let b = SlotBlock { base: 0, order: 4 };
        assert!(b.fits(16));
        assert!(b.fits(5));
        assert!(!b.fits(17), "outgrown");
        assert!(!b.fits(4), "shrunk to a quarter: a smaller block");
        let small = SlotBlock {
            base: 0,
            order: MIN_ORDER,
        };
        assert!(small.fits(1) && small.fits(4));
        assert_eq!(SlotBlock::order_for(0), MIN_ORDER);
        assert_eq!(SlotBlock::order_for(5), 3);
        assert_eq!(SlotBlock::order_for(1024), 10);
    }

    #[test]
    fn the_space_ends_at_two_to_the_32() {
        let mut s = SlotSpace::with_used([SlotBlock {
            base: u32::MAX - 7,
            order: 3,
        }]);
        assert_eq!(s.alloc(1), None, "nothing above the last block");
        s.free(SlotBlock {
            base: 8,
            order: MIN_ORDER,
        });
        assert_eq!(s.alloc(2).map(|b| b.base), Some(8));
    }
}

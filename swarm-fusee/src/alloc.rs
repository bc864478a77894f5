//! The client half of FUSEE's two-level memory management (FUSEE §4.4).
//!
//! Memory nodes hand out coarse **blocks**: here a block is claimed by a CAS of its
//! block-table entry from 0 to `client id + 1` on every alive node (our memory nodes
//! run no code, so the MN-side ALLOC of FUSEE becomes a CAS; a claim that does not win
//! every node is abandoned, so two clients never share a block). Within its blocks a
//! client allocates fixed-size **objects** itself, in a predetermined order: the next
//! object's address is known before the current one is written, which is what lets
//! the embedded log link objects in allocation order with no extra roundtrip (§4.5).
//! A client therefore always holds a *reserve* block besides its current one.
//!
//! Objects are never freed: FUSEE frees superseded objects into per-block bitmaps and
//! reclaims them in the background; this baseline sizes its store for the run instead
//! (`FuseeParams::for_workload`), which is enough for benchmarks and keeps slot values
//! unique forever (see `crate::slot`).

use crate::layout::FuseeLayout;

/// Where the next objects come from.
#[derive(Clone, Debug, Default)]
pub struct Slab {
    /// Block being carved and the next object in it.
    current: Option<(u64, u32)>,
    /// Claimed blocks to continue with, in order.
    reserve: std::collections::VecDeque<u64>,
    /// The previously allocated object (the log's `prev`).
    last: u64,
    /// Where the next claim starts looking.
    pub cursor: u64,
    /// Whether this client has claimed a block yet (its log head is then written).
    pub started: bool,
}

/// One allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// The object's address.
    pub addr: u64,
    /// The client's previous object (0 for the first).
    pub prev: u64,
    /// The object allocated after this one.
    pub next: u64,
}

impl Slab {
    /// A slab whose claims start at `cursor` (spread clients over the block table).
    pub fn new(cursor: u64) -> Self {
        Self {
            cursor,
            ..Self::default()
        }
    }

    /// Whether a block must be claimed before [`Slab::allocate`] can succeed.
    #[cfg(test)]
    pub fn needs_block(&self) -> bool {
        self.current.is_none() || self.reserve.is_empty()
    }

    /// Adds a freshly claimed block.
    pub fn add_block(&mut self, block: u64) {
        if self.current.is_none() {
            self.current = Some((block, 0));
        } else {
            self.reserve.push_back(block);
        }
    }

    /// The next object, or `None` if a block must be claimed first.
    pub fn allocate(&mut self, layout: &FuseeLayout) -> Option<Allocation> {
        let (block, index) = self.current?;
        let reserve = *self.reserve.front()?;
        let addr = layout.object(block, index);
        let per_block = layout.params().objects_per_block;
        let next = if index + 1 < per_block {
            self.current = Some((block, index + 1));
            layout.object(block, index + 1)
        } else {
            self.current = Some((reserve, 0));
            self.reserve.pop_front();
            layout.object(reserve, 0)
        };
        let prev = core::mem::replace(&mut self.last, addr);
        Some(Allocation { addr, prev, next })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::FuseeParams;

    #[test]
    fn objects_come_in_the_order_their_predecessors_announced() {
        let mut params = FuseeParams::for_workload(10, 10, 8, 8, 1);
        params.objects_per_block = 3;
        let layout = FuseeLayout::new(params).expect("valid");
        let mut slab = Slab::new(0);
        assert!(slab.allocate(&layout).is_none());
        slab.add_block(5);
        assert!(slab.needs_block());
        slab.add_block(2);
        let mut prev = 0;
        let mut announced = None;
        for _ in 0..5 {
            if slab.needs_block() {
                slab.add_block(9);
            }
            let a = slab.allocate(&layout).expect("blocks available");
            assert_eq!(a.prev, prev);
            if let Some(next) = announced {
                assert_eq!(a.addr, next);
            }
            prev = a.addr;
            announced = Some(a.next);
        }
    }
}

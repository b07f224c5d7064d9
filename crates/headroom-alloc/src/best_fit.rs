//! Best fit: `get_free_block` and the search it makes, with PyTorch's rules
//! for expandable segments (best fit counts the room a block can still grow
//! into) and for oversize blocks (the policy's `may_serve`).

use crate::block::{DEFAULT_POOL, NIL};
use crate::caching::DeviceCachingAllocator;
use crate::device::{DeviceMemory, StreamId};
use crate::free_set::Take;
use crate::policy::Policy;
use crate::sizing;
use crate::stats::PoolKind;

impl<D: DeviceMemory, P: Policy> DeviceCachingAllocator<D, P> {
    /// `get_free_block`: best fit on the request's stream, with the
    /// expandable-segment and oversize rules. Removes the block it returns
    /// from the free set, or, where the block will be split
    /// (`sizing::should_split`), puts the remainder in its place there at once
    /// and says so (true).
    pub(crate) fn get_free_block(
        &mut self,
        owner: u32,
        kind: PoolKind,
        stream: StreamId,
        size: u64,
    ) -> Option<(u32, bool)> {
        // The walk below stops early where it cannot go on; the full walk (`pick_free_block`) must agree.
        #[cfg(debug_assertions)]
        let picked = self.pick_free_block(owner, kind, stream, size);
        let gc_clock = self.gc_clock;
        let expandable_on = self.expandable_active();
        let (policy, config) = (&self.policy, &self.config);
        let arena = &self.arena;
        let pool = match (owner, kind) {
            (DEFAULT_POOL, PoolKind::Small) => &mut self.small,
            (DEFAULT_POOL, PoolKind::Large) => &mut self.large,
            (_, PoolKind::Small) => &mut self.private.get_mut(&owner).expect("a live pool").small,
            (_, PoolKind::Large) => &mut self.private.get_mut(&owner).expect("a live pool").large,
        };
        if gc_clock {
            pool.get_free_blocks_call_count += 1;
        }
        let fits = |found_size| policy.may_serve(config, size, found_size);
        // Best fit counts the room an expandable block can still grow into: from the best fit, on to the next block
        // while that one has less room. One search and a walk (the common case: an ordinary block, no walk).
        let grow = |id: u32| {
            let b = &arena[id];
            b.size + if b.next != NIL && !arena[b.next].mapped { arena[b.next].size } else { 0 }
        };
        // Only a block with unmapped room after it is ever passed over: the entry after it is at least as large,
        // so without that room it never has less to grow into. Asked first, it spares the look-up of the next entry
        // that most walks made only to stop (docs/PERFORMANCE.md, "Replay passes, eighteenth round").
        let walks = |id: u32| {
            let b = &arena[id];
            b.is_expandable() && b.next != NIL && !arena[b.next].mapped
        };
        let further = |id: u32, next: u32| grow(next) < grow(id);
        let mut skipped_expandable = false;
        let mut shrunk = false;
        let take = |found_size, found_ptr, id| {
            skipped_expandable = !expandable_on && arena[id].is_expandable();
            if skipped_expandable || !fits(found_size) {
                Take::Leave
            } else if sizing::should_split(config, expandable_on, kind, found_size, size) {
                shrunk = true;
                Take::Shrink { size: found_size - size, ptr: found_ptr + size }
            } else {
                Take::Remove
            }
        };
        // Without expandable segments nothing walks: a search of its own with no walk in it, not one that
        // asks at every best fit whether to walk.
        let found = if expandable_on {
            pool.blocks.take_walking_if(stream, size, walks, further, take)
        } else {
            pool.blocks.take_walking_if(stream, size, |_| false, |_, _| false, take)
        };
        if let Some((_, _, id)) = found {
            #[cfg(debug_assertions)]
            debug_assert_eq!(picked.map(|p| p.2), Some(id), "best fit takes the block pick_free_block picks");
            return Some((id, shrunk));
        }
        #[cfg(debug_assertions)]
        debug_assert!(skipped_expandable || picked.is_none(), "best fit found nothing where pick_free_block did");
        if !skipped_expandable {
            return None;
        }
        // Expandable segments were turned off with blocks of them still free: rare.
        let (found_size, found_ptr, id) = self.pick_free_block(owner, kind, stream, size)?;
        self.pool_mut(owner, kind).blocks.remove(stream, found_size, found_ptr);
        Some((id, false))
    }

    /// The block `get_free_block` would take, without taking it: best fit,
    /// with the expandable-segment and oversize rules.
    pub(crate) fn pick_free_block(
        &self,
        owner: u32,
        kind: PoolKind,
        stream: StreamId,
        size: u64,
    ) -> Option<(u64, u64, u32)> {
        let expandable_on = self.expandable_active();
        let arena = &self.arena;
        let pool = self.pool(owner, kind);
        let fits = |found_size| self.policy.may_serve(&self.config, size, found_size);
        let (mut found_size, mut found_ptr, mut id) = pool.blocks.first_at_least(stream, size)?;
        if arena[id].is_expandable() {
            if expandable_on {
                // Best fit counts the room an expandable block can still grow into.
                let grow = |id: u32| {
                    let b = &arena[id];
                    b.size + if b.next != NIL && !arena[b.next].mapped { arena[b.next].size } else { 0 }
                };
                while arena[id].is_expandable() {
                    match pool.blocks.next_after(stream, found_size, found_ptr) {
                        Some((s, p, n)) if grow(n) < grow(id) => (found_size, found_ptr, id) = (s, p, n),
                        _ => break,
                    }
                }
            } else {
                // Expandable segments were turned off: honour it by skipping their blocks.
                loop {
                    let (s, p, n) = pool.blocks.next_after(stream, found_size, found_ptr)?;
                    (found_size, found_ptr, id) = (s, p, n);
                    if !arena[n].is_expandable() {
                        break;
                    }
                }
            }
        }
        fits(found_size).then_some((found_size, found_ptr, id))
    }
}

//! `BlockPool`: the KV-cache blocks of one GPU, their reference counts, the
//! free queue, and the prefix-cache map (vLLM v1's `BlockPool`).
//!
//! ```text
//!  blocks: [null][ 1 ][ 2 ][ 3 ] ... [N-1][head][tail]      (a flat Vec; ids are indices)
//!  free queue:  head <-> 7 <-> 8 <-> 4 <-> 3 <-> tail      (links live in the blocks)
//!               ^ next to be reused (least recently freed)    ^ most recently freed
//! ```
//!
//! The free queue is an intrusive doubly linked list threaded through the
//! blocks, between two sentinel blocks, so popping the head, appending,
//! prepending and removing a block from the middle are O(1) and allocate
//! nothing. It doubles as the LRU order of the prefix cache: a free block
//! keeps its hash and stays findable until it is popped for reuse, and only
//! then is it evicted from the map.
//!
//! Invariants (checked by [`BlockPool::validate`]): a block is in the free
//! queue iff its reference count is 0 (the null block aside); the queue holds
//! `num_free_blocks` blocks; every map entry names a block whose hash is that
//! key, and every hashed block is in the map.

use crate::hash::BlockHash;
use rustc_hash::FxHashMap;

/// A block's index in the pool.
pub type BlockId = u32;

/// No block.
const NONE: u32 = u32::MAX;

/// Where newly freed blocks go in the free queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FreeOrder {
    /// Every freed block goes to the tail (vLLM ≤ 0.10): pure LRU by time freed.
    AppendAll,
    /// Blocks with a hash go to the tail, blocks without one (partial, never
    /// cacheable) to the head, to be reused first (vLLM ≥ 0.33, PR #42656).
    /// headroom's default: a partial block holds nothing anyone can hit, so
    /// reusing it first keeps real cache entries alive longer.
    PrependUnhashed,
}

/// A broken invariant of the block pool or the manager: a bug, said where.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("KV block manager invariant broken: {0}")]
pub struct InvariantViolation(pub String);

/// Not enough free blocks; nothing was changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("KV cache full: {needed} blocks needed, {free} free")]
pub struct NoCapacity {
    pub needed: usize,
    pub free: usize,
}

/// A block's bookkeeping: 16 bytes, so the free queue's pointer chasing
/// stays in cache; the hash lives in a parallel array, read only for cached blocks.
#[derive(Clone, Copy, Debug)]
struct Block {
    ref_cnt: u32,
    prev: u32,
    next: u32,
    hashed: bool,
}

/// See the module documentation.
#[derive(Clone, Debug)]
pub struct BlockPool {
    blocks: Vec<Block>,
    hashes: Vec<BlockHash>,
    num_blocks: u32,
    num_free: u32,
    /// Hash -> a block cached under it.
    cached: FxHashMap<BlockHash, BlockId>,
    /// Further blocks with a hash already in `cached`: identical content cached
    /// twice is not de-duplicated (block tables are append-only while a request runs).
    duplicates: FxHashMap<BlockHash, Vec<BlockId>>,
    enable_caching: bool,
    free_order: FreeOrder,
    evictions: u64,
}

impl BlockPool {
    /// A pool of `num_blocks` blocks. Block 0 is the null block (a placeholder
    /// for table positions that need no KV); it is never handed out, freed or
    /// cached, so `num_blocks − 1` blocks are usable. Initial free order is by id.
    pub fn new(num_blocks: u32, enable_caching: bool, free_order: FreeOrder) -> Self {
        assert!(num_blocks >= 2, "a pool needs the null block and at least one more");
        let n = num_blocks as usize;
        let (head, tail) = (num_blocks, num_blocks + 1);
        let mut blocks = vec![Block { ref_cnt: 0, prev: NONE, next: NONE, hashed: false }; n + 2];
        // head -> 1 -> 2 -> ... -> N-1 -> tail; the null block 0 stays outside.
        let mut prev = head;
        for i in 1..num_blocks {
            blocks[prev as usize].next = i;
            blocks[i as usize].prev = prev;
            prev = i;
        }
        blocks[prev as usize].next = tail;
        blocks[tail as usize].prev = prev;
        BlockPool {
            blocks,
            hashes: vec![BlockHash([0; 32]); n],
            num_blocks,
            num_free: num_blocks - 1,
            // Sized for every block up front: growing the map mid-run rehashes 50k entries.
            cached: FxHashMap::with_capacity_and_hasher(if enable_caching { n } else { 0 }, Default::default()),
            duplicates: FxHashMap::default(),
            enable_caching,
            free_order,
            evictions: 0,
        }
    }

    /// The null block's id.
    pub const NULL_BLOCK: BlockId = 0;

    #[inline]
    fn head(&self) -> u32 {
        self.num_blocks
    }

    #[inline]
    fn tail(&self) -> u32 {
        self.num_blocks + 1
    }

    #[inline]
    fn unlink(&mut self, id: u32) {
        let (p, n) = (self.blocks[id as usize].prev, self.blocks[id as usize].next);
        self.blocks[p as usize].next = n;
        self.blocks[n as usize].prev = p;
        self.num_free -= 1;
    }

    #[inline]
    fn link_after(&mut self, at: u32, id: u32) {
        let n = self.blocks[at as usize].next;
        let b = &mut self.blocks[id as usize];
        b.prev = at;
        b.next = n;
        self.blocks[at as usize].next = id;
        self.blocks[n as usize].prev = id;
        self.num_free += 1;
    }

    /// Usable blocks (excluding the null block).
    pub fn capacity(&self) -> usize {
        self.num_blocks as usize - 1
    }

    /// Blocks in the free queue (cached-but-unreferenced blocks count as free).
    #[inline]
    pub fn num_free_blocks(&self) -> usize {
        self.num_free as usize
    }

    /// vLLM's `usage`: the fraction of usable blocks referenced by a request.
    pub fn usage(&self) -> f64 {
        1.0 - self.num_free as f64 / self.capacity() as f64
    }

    /// Cached blocks evicted (popped for reuse while holding a hash) so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Reference count of a block.
    pub fn ref_cnt(&self, id: BlockId) -> u32 {
        self.blocks[id as usize].ref_cnt
    }

    /// The hash a block is cached under, if any.
    pub fn block_hash(&self, id: BlockId) -> Option<BlockHash> {
        self.blocks[id as usize].hashed.then(|| self.hashes[id as usize])
    }

    /// The free queue from head (next reused) to tail.
    pub fn free_queue(&self) -> Vec<BlockId> {
        let mut out = Vec::with_capacity(self.num_free as usize);
        let mut id = self.blocks[self.head() as usize].next;
        while id != self.tail() {
            out.push(id);
            id = self.blocks[id as usize].next;
        }
        out
    }

    /// Takes `n` blocks from the head of the free queue, evicting any cached
    /// content they hold, with a reference count of 1 each; appends them to `out`.
    pub fn get_new_blocks(&mut self, n: usize, out: &mut Vec<BlockId>) -> Result<(), NoCapacity> {
        if n > self.num_free as usize {
            return Err(NoCapacity { needed: n, free: self.num_free as usize });
        }
        out.reserve(n);
        for _ in 0..n {
            let id = self.blocks[self.head() as usize].next;
            self.unlink(id);
            if self.blocks[id as usize].hashed {
                self.blocks[id as usize].hashed = false;
                self.uncache(self.hashes[id as usize], id);
                self.evictions += 1;
            }
            self.blocks[id as usize].ref_cnt = 1;
            out.push(id);
        }
        Ok(())
    }

    fn uncache(&mut self, h: BlockHash, id: BlockId) {
        if self.duplicates.is_empty() {
            let removed = self.cached.remove(&h);
            debug_assert_eq!(removed, Some(id), "hashed block {id} missing from the cache map");
            return;
        }
        let std::collections::hash_map::Entry::Occupied(mut e) = self.cached.entry(h) else {
            debug_assert!(false, "hashed block {id} missing from the cache map");
            return;
        };
        // Rare: other blocks hold the same content; keep one of them findable.
        match self.duplicates.get_mut(&h) {
            None => {
                e.remove();
            }
            Some(v) => {
                if *e.get() == id {
                    *e.get_mut() = v.pop().expect("non-empty duplicate list");
                } else {
                    v.retain(|&b| b != id);
                }
                if v.is_empty() {
                    self.duplicates.remove(&h);
                }
            }
        }
    }

    /// Takes a reference on blocks found in the prefix cache; those in the
    /// free queue leave it.
    pub fn touch(&mut self, ids: &[BlockId]) {
        for &id in ids {
            if id == Self::NULL_BLOCK {
                continue;
            }
            if self.blocks[id as usize].ref_cnt == 0 {
                self.unlink(id);
            }
            self.blocks[id as usize].ref_cnt += 1;
        }
    }

    /// Drops one reference on each block, in the order given; blocks reaching
    /// zero enter the free queue per the [`FreeOrder`]. Callers free a
    /// request's blocks tail first, so its longest-prefix block is evicted first.
    pub fn free_blocks(&mut self, ids: impl IntoIterator<Item = BlockId>) {
        for id in ids {
            if id == Self::NULL_BLOCK {
                continue;
            }
            let b = &mut self.blocks[id as usize];
            debug_assert!(b.ref_cnt > 0, "block {id} freed more often than referenced");
            b.ref_cnt -= 1;
            if b.ref_cnt == 0 {
                let to_head = self.free_order == FreeOrder::PrependUnhashed && !b.hashed;
                if to_head {
                    self.link_after(self.head(), id);
                } else {
                    let last = self.blocks[self.tail() as usize].prev;
                    self.link_after(last, id);
                }
            }
        }
    }

    /// Caches `blocks[i]` under `hashes[i]` for the given range of a
    /// request's block table (the blocks that just became full).
    pub fn cache_full_blocks(&mut self, blocks: &[BlockId], hashes: &[BlockHash], from: usize, to: usize) {
        if !self.enable_caching {
            return;
        }
        for i in from..to {
            let id = blocks[i];
            if id == Self::NULL_BLOCK || self.blocks[id as usize].hashed {
                continue;
            }
            let h = hashes[i];
            self.blocks[id as usize].hashed = true;
            self.hashes[id as usize] = h;
            match self.cached.entry(h) {
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(id);
                }
                std::collections::hash_map::Entry::Occupied(_) => self.duplicates.entry(h).or_default().push(id),
            }
        }
    }

    /// A block cached under `hash`, if any.
    #[inline]
    pub fn get_cached_block(&self, hash: &BlockHash) -> Option<BlockId> {
        self.cached.get(hash).copied()
    }

    /// Whether prefix caching is on.
    pub fn caching_enabled(&self) -> bool {
        self.enable_caching
    }

    /// Forgets every cached hash; refused (false) while any block is in use.
    pub fn reset_prefix_cache(&mut self) -> bool {
        if self.num_free as usize != self.capacity() {
            return false;
        }
        self.cached.clear();
        self.duplicates.clear();
        for b in &mut self.blocks {
            b.hashed = false;
        }
        true
    }

    /// Checks the invariants of the module documentation.
    pub fn validate(&self) -> Result<(), InvariantViolation> {
        self.why_invalid().map_err(InvariantViolation)
    }

    fn why_invalid(&self) -> Result<(), String> {
        let queue = self.free_queue();
        if queue.len() != self.num_free as usize {
            return Err(format!("queue holds {} blocks, num_free is {}", queue.len(), self.num_free));
        }
        let mut in_queue = vec![false; self.num_blocks as usize];
        let mut prev = self.head();
        for &id in &queue {
            if id == Self::NULL_BLOCK || id >= self.num_blocks {
                return Err(format!("block {id} must not be in the free queue"));
            }
            if in_queue[id as usize] {
                return Err(format!("block {id} is in the free queue twice"));
            }
            if self.blocks[id as usize].prev != prev {
                return Err(format!("block {id}: broken back link"));
            }
            in_queue[id as usize] = true;
            prev = id;
        }
        for id in 1..self.num_blocks {
            let b = &self.blocks[id as usize];
            if (b.ref_cnt == 0) != in_queue[id as usize] {
                return Err(format!("block {id}: ref_cnt {} but in free queue: {}", b.ref_cnt, in_queue[id as usize]));
            }
            if b.hashed {
                let h = self.hashes[id as usize];
                let listed =
                    self.cached.get(&h) == Some(&id) || self.duplicates.get(&h).is_some_and(|v| v.contains(&id));
                if !listed {
                    return Err(format!("hashed block {id} is not in the cache map"));
                }
            }
        }
        for (h, &id) in &self.cached {
            if self.block_hash(id) != Some(*h) {
                return Err(format!("cache entry {h:?} names block {id} without that hash"));
            }
        }
        for (h, v) in &self.duplicates {
            if !self.cached.contains_key(h) || v.is_empty() || v.iter().any(|&id| self.block_hash(id) != Some(*h)) {
                return Err(format!("duplicate entry {h:?} is inconsistent"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_pool_hands_out_blocks_in_id_order_and_never_the_null_block() {
        let mut p = BlockPool::new(5, true, FreeOrder::AppendAll);
        assert_eq!(p.free_queue(), vec![1, 2, 3, 4]);
        let mut got = Vec::new();
        p.get_new_blocks(4, &mut got).unwrap();
        assert_eq!(got, vec![1, 2, 3, 4]);
        assert_eq!(p.get_new_blocks(1, &mut got), Err(NoCapacity { needed: 1, free: 0 }));
        assert_eq!(p.usage(), 1.0);
        p.free_blocks([3, 1]);
        assert_eq!(p.free_queue(), vec![3, 1]);
        p.validate().unwrap();
    }

    #[test]
    fn free_order_conventions() {
        let h = |n: u8| BlockHash([n; 32]);
        for (order, want) in [(FreeOrder::AppendAll, vec![1, 2, 3, 4]), (FreeOrder::PrependUnhashed, vec![4, 3, 1, 2])]
        {
            let mut p = BlockPool::new(5, true, order);
            let mut b = Vec::new();
            p.get_new_blocks(4, &mut b).unwrap();
            p.cache_full_blocks(&b, &[h(1), h(2)], 0, 2);
            p.free_blocks(b.iter().copied());
            assert_eq!(p.free_queue(), want, "{order:?}");
            p.validate().unwrap();
        }
    }

    #[test]
    fn a_cached_free_block_stays_findable_until_reused() {
        let mut p = BlockPool::new(3, true, FreeOrder::AppendAll);
        let mut b = Vec::new();
        p.get_new_blocks(1, &mut b).unwrap();
        let h = BlockHash([7; 32]);
        p.cache_full_blocks(&b, &[h], 0, 1);
        p.free_blocks([b[0]]);
        assert_eq!(p.get_cached_block(&h), Some(b[0]));
        p.touch(&[b[0]]);
        assert_eq!(p.num_free_blocks(), 1);
        p.free_blocks([b[0]]);
        let mut c = Vec::new();
        p.get_new_blocks(2, &mut c).unwrap();
        assert_eq!(p.get_cached_block(&h), None, "evicted when popped");
        assert_eq!(p.evictions(), 1);
        p.validate().unwrap();
    }

    #[test]
    fn identical_content_cached_twice_stays_findable_until_both_are_evicted() {
        let mut p = BlockPool::new(4, true, FreeOrder::AppendAll);
        let h = BlockHash([9; 32]);
        let mut a = Vec::new();
        p.get_new_blocks(2, &mut a).unwrap();
        p.cache_full_blocks(&a, &[h, h], 0, 2);
        p.validate().unwrap();
        p.free_blocks(a.iter().copied());
        let mut x = Vec::new();
        p.get_new_blocks(2, &mut x).unwrap(); // block 3 (never cached), then block 1 (evicted)
        assert_eq!(x, vec![3, 1]);
        assert_eq!(p.get_cached_block(&h), Some(2), "the other copy is still found");
        p.validate().unwrap();
        p.get_new_blocks(1, &mut x).unwrap();
        assert_eq!(p.get_cached_block(&h), None);
        p.validate().unwrap();
    }
}

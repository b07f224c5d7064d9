//! `KvCacheManager`: the three operations a scheduler needs, with vLLM v1's
//! semantics for a model whose layers all use full attention.
//!
//! 1. [`KvCacheManager::get_computed_blocks`]: the longest cached prefix of a
//!    new request (block-aligned, at most `num_tokens − 1` tokens, since the
//!    last token must be computed to produce logits);
//! 2. [`KvCacheManager::allocate_slots`]: room for the tokens to compute this
//!    step (plus lookahead), taking references on the cache hits; returns
//!    [`NoCapacity`] — a value, not a panic — and changes nothing when the
//!    pool cannot serve it, so the scheduler can preempt and retry;
//! 3. [`KvCacheManager::free`]: releases a request's blocks, tail first.
//!
//! ```text
//!  tokens:  [t0 .. t15][t16 .. t31][t32 .. t38 ...]   block_size = 16
//!  table:   [   b7    ][   b2     ][   b9 (partial)]  b7, b2 full -> hashed and cached
//! ```

use crate::block_pool::{BlockId, BlockPool, FreeOrder, InvariantViolation, NoCapacity};
use crate::hash::{hash_block, none_hash, BlockHash};
use crate::metrics::PrefixCacheStats;
use rustc_hash::FxHashMap;

/// A request as the KV manager sees it: its token ids so far (prompt, then
/// generated tokens) and their full blocks' hashes, kept up to date as tokens arrive.
#[derive(Clone, Debug)]
pub struct KvRequest {
    pub id: u64,
    tokens: Vec<u32>,
    block_hashes: Vec<BlockHash>,
    block_size: usize,
    salt: Vec<u8>,
    /// Tokens whose KV is in the cache (computed or found in the prefix cache).
    pub num_computed_tokens: usize,
    /// Times the request was preempted (its lookups then count apart).
    pub num_preemptions: u32,
}

impl KvRequest {
    /// A request with `prompt` tokens; `salt` (possibly empty) isolates its
    /// prefix cache entries from other tenants'.
    pub fn new(id: u64, prompt: Vec<u32>, block_size: usize, salt: &[u8]) -> Self {
        let mut r = KvRequest {
            id,
            tokens: Vec::new(),
            block_hashes: Vec::new(),
            block_size,
            salt: salt.to_vec(),
            num_computed_tokens: 0,
            num_preemptions: 0,
        };
        r.append_tokens(&prompt);
        r
    }

    /// Appends tokens (generated ones) and hashes every block they complete.
    pub fn append_tokens(&mut self, tokens: &[u32]) {
        self.tokens.extend_from_slice(tokens);
        while (self.block_hashes.len() + 1) * self.block_size <= self.tokens.len() {
            let i = self.block_hashes.len();
            let parent = if i == 0 { none_hash() } else { self.block_hashes[i - 1] };
            let block = &self.tokens[i * self.block_size..(i + 1) * self.block_size];
            let extra: &[u8] = if i == 0 { &self.salt } else { &[] };
            self.block_hashes.push(hash_block(&parent, block, extra));
        }
    }

    pub fn num_tokens(&self) -> usize {
        self.tokens.len()
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn block_hashes(&self) -> &[BlockHash] {
        &self.block_hashes
    }
}

#[derive(Clone, Debug, Default)]
struct RequestBlocks {
    blocks: Vec<BlockId>,
    num_cached_blocks: usize,
}

/// Settings of a [`KvCacheManager`].
#[derive(Clone, Copy, Debug)]
pub struct KvConfig {
    pub num_blocks: u32,
    pub block_size: usize,
    pub max_model_len: usize,
    pub enable_caching: bool,
    pub free_order: FreeOrder,
    /// Fraction of blocks kept free when admitting new or preempted
    /// requests while others run (vLLM's `watermark`); 0 disables.
    pub watermark: f64,
}

/// See the module documentation.
#[derive(Clone, Debug)]
pub struct KvCacheManager {
    pool: BlockPool,
    cfg: KvConfig,
    watermark_blocks: usize,
    requests: FxHashMap<u64, RequestBlocks>,
    stats: PrefixCacheStats,
    #[cfg(feature = "negative-control")]
    leak_on_free: bool,
}

impl KvCacheManager {
    pub fn new(cfg: KvConfig) -> Self {
        assert!(cfg.block_size > 0, "block size must be positive");
        let pool = BlockPool::new(cfg.num_blocks, cfg.enable_caching, cfg.free_order);
        let watermark_blocks = (cfg.watermark * pool.capacity() as f64) as usize;
        KvCacheManager {
            pool,
            cfg,
            watermark_blocks,
            requests: FxHashMap::default(),
            stats: PrefixCacheStats::default(),
            #[cfg(feature = "negative-control")]
            leak_on_free: false,
        }
    }

    pub fn config(&self) -> &KvConfig {
        &self.cfg
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    pub fn stats(&self) -> &PrefixCacheStats {
        &self.stats
    }

    /// The blocks of a request, in token order.
    pub fn blocks(&self, request_id: u64) -> &[BlockId] {
        self.requests.get(&request_id).map(|r| r.blocks.as_slice()).unwrap_or(&[])
    }

    /// The longest run of leading full blocks of `req` found in the prefix
    /// cache, and the number of tokens they hold. Counts towards the hit rate.
    pub fn get_computed_blocks(&mut self, req: &KvRequest) -> (Vec<BlockId>, usize) {
        if !self.pool.caching_enabled() {
            return (Vec::new(), 0);
        }
        let max_hit_tokens = req.num_tokens().saturating_sub(1);
        let max_blocks = max_hit_tokens / self.cfg.block_size;
        let mut hits = Vec::new();
        for h in &req.block_hashes[..max_blocks.min(req.block_hashes.len())] {
            match self.pool.get_cached_block(h) {
                Some(b) => hits.push(b),
                None => break,
            }
        }
        let hit_tokens = hits.len() * self.cfg.block_size;
        if req.num_preemptions > 0 {
            self.stats.record_preempted(req.num_tokens() as u64, hit_tokens as u64);
        } else {
            self.stats.record(req.num_tokens() as u64, hit_tokens as u64);
        }
        (hits, hit_tokens)
    }

    /// Makes room for `num_new_tokens` more tokens of `req` (after its
    /// `num_computed_tokens` and the `new_computed` cache hits) plus
    /// `num_lookahead` speculative slots, then caches the blocks that became
    /// full. `admitting` applies the watermark (a waiting or preempted request
    /// joining others). Returns the newly allocated blocks.
    pub fn allocate_slots(
        &mut self,
        req: &KvRequest,
        num_new_tokens: usize,
        new_computed: &[BlockId],
        num_lookahead: usize,
        admitting: bool,
    ) -> Result<Vec<BlockId>, NoCapacity> {
        let bs = self.cfg.block_size;
        let have = self.requests.get(&req.id).map_or(0, |r| r.blocks.len());
        let num_new_computed = new_computed.len() * bs;
        let need_slots =
            (req.num_computed_tokens + num_new_computed + num_new_tokens + num_lookahead).min(self.cfg.max_model_len);
        let total_blocks = need_slots.div_ceil(bs);
        let num_new_blocks = total_blocks.saturating_sub(new_computed.len() + have);
        // Hits that sit in the free queue leave it: they count against the free blocks too.
        let evictable_hits = new_computed.iter().filter(|&&b| self.pool.ref_cnt(b) == 0).count();
        let needed = num_new_blocks + evictable_hits;
        let reserve = if admitting { self.watermark_blocks } else { 0 };
        let free = self.pool.num_free_blocks();
        if needed + reserve > free {
            return Err(NoCapacity { needed: needed + reserve, free });
        }
        self.pool.touch(new_computed);
        let state = self.requests.entry(req.id).or_default();
        if !new_computed.is_empty() {
            debug_assert_eq!(state.blocks.len(), 0, "cache hits only at admission");
            state.blocks.extend_from_slice(new_computed);
            state.num_cached_blocks = new_computed.len();
        }
        let start = state.blocks.len();
        self.pool.get_new_blocks(num_new_blocks, &mut state.blocks).expect("checked above");
        let new_blocks = state.blocks[start..].to_vec();
        // Cache the blocks that are now full (never beyond the tokens known).
        let computed = (req.num_computed_tokens + num_new_computed + num_new_tokens).min(req.num_tokens());
        let full = (computed / bs).min(req.block_hashes.len());
        if full > state.num_cached_blocks {
            self.pool.cache_full_blocks(&state.blocks, &req.block_hashes, state.num_cached_blocks, full);
            state.num_cached_blocks = full;
        }
        Ok(new_blocks)
    }

    /// Releases the request's blocks, tail first: among blocks freed together,
    /// the one holding the longest prefix (the least likely to be reused) is evicted first.
    pub fn free(&mut self, request_id: u64) {
        if let Some(state) = self.requests.remove(&request_id) {
            #[cfg(feature = "negative-control")]
            let state = {
                let mut state = state;
                if self.leak_on_free {
                    state.blocks.pop();
                }
                state
            };
            self.pool.free_blocks(state.blocks.iter().rev().copied());
        }
    }

    /// The negative control of the property suite: from now on `free` keeps
    /// the request's last block referenced (a leak). Tests only.
    #[cfg(feature = "negative-control")]
    #[doc(hidden)]
    pub fn break_free_for_negative_control(&mut self) {
        self.leak_on_free = true;
    }

    /// Blocks in use by running requests, and the token slots they hold.
    pub fn num_used_blocks(&self) -> usize {
        self.pool.capacity() - self.pool.num_free_blocks()
    }

    /// Checks the pool's invariants and that reference counts equal the
    /// number of requests holding each block.
    pub fn validate(&self) -> Result<(), InvariantViolation> {
        self.pool.validate()?;
        let mut holders = vec![0u32; self.cfg.num_blocks as usize];
        for r in self.requests.values() {
            for &b in &r.blocks {
                holders[b as usize] += 1;
            }
        }
        for (b, &n) in holders.iter().enumerate().skip(1) {
            if self.pool.ref_cnt(b as BlockId) != n {
                return Err(InvariantViolation(format!(
                    "block {b}: ref_cnt {} but {n} holders",
                    self.pool.ref_cnt(b as BlockId)
                )));
            }
        }
        Ok(())
    }
}

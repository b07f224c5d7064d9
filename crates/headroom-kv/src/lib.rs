//! # headroom-kv
//!
//! A paged KV-cache block manager for LLM serving, with vLLM v1's semantics,
//! and a serving simulator that answers capacity questions before a server
//! is started.
//!
//! | vLLM v1 | headroom-kv |
//! |---|---|
//! | `BlockPool`, `FreeKVCacheBlockQueue` | [`BlockPool`] (the free queue is intrusive and doubles as the LRU) |
//! | `hash_block_tokens` (SHA-256) | [`hash::hash_block`] (keyed BLAKE3) |
//! | `KVCacheManager` (one full-attention group) | [`KvCacheManager`] |
//! | `get_computed_blocks` / `allocate_slots` / `free` | the same names |
//! | `Scheduler` (continuous batching, recompute preemption) | [`sim`] |
//!
//! Glossary: a **block** holds the keys and values of `block_size`
//! consecutive tokens of one request, for every layer; a **full** block is
//! hashed and can be shared through the **prefix cache**; a **free** block
//! has no reference but may still hold cached content until it is reused
//! (**evicted**).
//!
//! ```
//! use headroom_kv::{FreeOrder, KvCacheManager, KvConfig, KvRequest};
//!
//! let cfg = KvConfig { num_blocks: 64, block_size: 16, max_model_len: 4096,
//!                      enable_caching: true, free_order: FreeOrder::PrependUnhashed, watermark: 0.0 };
//! let mut kv = KvCacheManager::new(cfg);
//! let prompt: Vec<u32> = (0..40).collect();
//! let mut a = KvRequest::new(1, prompt.clone(), 16, b"");
//! kv.allocate_slots(&a, 40, &[], 0, true).unwrap();          // 3 blocks, 2 full ones cached
//! a.num_computed_tokens = 40;
//! let b = KvRequest::new(2, prompt, 16, b"");
//! let (hits, tokens) = kv.get_computed_blocks(&b);           // shares the 2 full blocks
//! assert_eq!((hits.len(), tokens), (2, 32));
//! ```

pub mod block_pool;
pub mod catalog;
pub mod dist;
pub mod hash;
pub mod manager;
pub mod metrics;
pub mod roofline;
pub mod sim;

pub use block_pool::{BlockId, BlockPool, FreeOrder, InvariantViolation, NoCapacity};
pub use manager::{KvCacheManager, KvConfig, KvRequest};

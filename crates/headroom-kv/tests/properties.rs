//! Property tests: random admissions, decode steps, frees and preemptions
//! keep the block manager's invariants after every step.

use headroom_kv::{FreeOrder, KvCacheManager, KvConfig, KvRequest};
use proptest::prelude::*;
use std::collections::HashMap;

#[derive(Clone, Debug)]
enum Op {
    /// A new request: one of three shared prefixes (or none), then a random tail.
    Admit {
        prefix: usize,
        prefix_len: usize,
        tail: Vec<u32>,
    },
    Decode {
        pick: usize,
        token: u32,
    },
    Free {
        pick: usize,
    },
    /// Preempt by recompute: free and start over later.
    Preempt {
        pick: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0usize..4, 0usize..40, proptest::collection::vec(0u32..5, 0..30))
            .prop_map(|(prefix, prefix_len, tail)| Op::Admit { prefix, prefix_len, tail }),
        6 => (any::<usize>(), 0u32..5).prop_map(|(pick, token)| Op::Decode { pick, token }),
        2 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Preempt { pick }),
    ]
}

fn check(kv: &KvCacheManager, live: &[KvRequest]) -> Result<(), TestCaseError> {
    kv.validate().map_err(TestCaseError::fail)?;
    let pool = kv.pool();
    prop_assert_eq!(pool.num_free_blocks() + kv.num_used_blocks(), pool.capacity());
    // A block held by two requests is a shared, cached full block.
    let mut holders: HashMap<u32, usize> = HashMap::new();
    for r in live {
        for &b in kv.blocks(r.id) {
            *holders.entry(b).or_default() += 1;
        }
        let need = r.num_computed_tokens.div_ceil(kv.config().block_size);
        prop_assert!(kv.blocks(r.id).len() >= need, "request {} lacks slots", r.id);
    }
    for (&b, &n) in &holders {
        prop_assert!(n == 1 || pool.block_hash(b).is_some(), "block {} shared by {} but not cached", b, n);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_after_every_step(
        ops in proptest::collection::vec(op(), 1..200),
        order in prop_oneof![Just(FreeOrder::AppendAll), Just(FreeOrder::PrependUnhashed)],
        caching in any::<bool>(),
    ) {
        let bs = 4;
        let mut kv = KvCacheManager::new(KvConfig {
            num_blocks: 40, block_size: bs, max_model_len: 1 << 16, enable_caching: caching, free_order: order, watermark: 0.0,
        });
        let prefixes: Vec<Vec<u32>> = (0..3).map(|p| (0..40).map(|i| (p * 1000 + i) as u32).collect()).collect();
        let mut live: Vec<KvRequest> = Vec::new();
        let mut next_id = 0u64;
        // (hash, block) of every freed request's cached blocks.
        let mut freed: Vec<(headroom_kv::hash::BlockHash, u32)> = Vec::new();
        for op in ops {
            match op {
                Op::Admit { prefix, prefix_len, tail } => {
                    let mut prompt: Vec<u32> = if prefix < 3 { prefixes[prefix][..prefix_len].to_vec() } else { Vec::new() };
                    prompt.extend(tail);
                    if prompt.is_empty() { prompt.push(7); }
                    let mut r = KvRequest::new(next_id, prompt, bs, b"");
                    next_id += 1;
                    let (hits, hit_tokens) = kv.get_computed_blocks(&r);
                    prop_assert_eq!(hit_tokens % bs, 0);
                    prop_assert!(hit_tokens < r.num_tokens());
                    let n = r.num_tokens() - hit_tokens;
                    let before = kv.pool().free_queue();
                    match kv.allocate_slots(&r, n, &hits, 0, !live.is_empty()) {
                        Ok(_) => { r.num_computed_tokens = r.num_tokens(); live.push(r); }
                        Err(_) => prop_assert_eq!(kv.pool().free_queue(), before, "a failed allocation changed the pool"),
                    }
                }
                Op::Decode { pick, token } if !live.is_empty() => {
                    let i = pick % live.len();
                    live[i].append_tokens(&[token]);
                    if kv.allocate_slots(&live[i], 1, &[], 0, false).is_ok() {
                        live[i].num_computed_tokens += 1;
                    } else {
                        // Out of blocks: drop the token, as a scheduler that preempts would retry later.
                        let r = live.swap_remove(i);
                        kv.free(r.id);
                    }
                }
                Op::Free { pick } | Op::Preempt { pick } if !live.is_empty() => {
                    let r = live.swap_remove(pick % live.len());
                    for &b in kv.blocks(r.id) {
                        if let Some(h) = kv.pool().block_hash(b) { freed.push((h, b)); }
                    }
                    kv.free(r.id);
                }
                _ => {}
            }
            check(&kv, &live)?;
            // A freed request's full blocks stay findable until their block is reused.
            for &(h, b) in &freed {
                if kv.pool().block_hash(b) == Some(h) {
                    prop_assert!(kv.pool().get_cached_block(&h).is_some(), "cached block {} lost its hash entry", b);
                }
            }
        }
        for r in live.drain(..) { kv.free(r.id); }
        prop_assert_eq!(kv.pool().num_free_blocks(), kv.pool().capacity());
    }
}

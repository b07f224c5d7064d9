//! Property tests: random admissions, decode steps, frees, preemptions and
//! resumptions keep the block manager's invariants after every step, counted
//! from the requests' block tables rather than from the pool's own figures.
//! A deliberately broken manager (`free` leaks a block) must be caught.

use headroom_kv::{FreeOrder, KvCacheManager, KvConfig, KvRequest};
use proptest::prelude::*;
use proptest::test_runner::{TestError, TestRunner};
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
    /// The request finished: its blocks go back to the pool.
    Free {
        pick: usize,
    },
    /// Preempted by recompute: its blocks go back, and it waits to be resumed
    /// with every token it has so far.
    Preempt {
        pick: usize,
    },
    /// A preempted request comes back, finding what the cache still holds of it.
    Resume {
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
        1 => any::<usize>().prop_map(|pick| Op::Resume { pick }),
    ]
}

fn check(kv: &KvCacheManager, live: &[KvRequest]) -> Result<(), TestCaseError> {
    kv.validate().map_err(|e| TestCaseError::fail(e.to_string()))?;
    let pool = kv.pool();
    let mut holders: HashMap<u32, u32> = HashMap::new();
    for r in live {
        for &b in kv.blocks(r.id) {
            *holders.entry(b).or_default() += 1;
        }
        let need = r.num_computed_tokens.div_ceil(kv.config().block_size);
        prop_assert!(kv.blocks(r.id).len() >= need, "request {} lacks slots", r.id);
    }
    // Every block is either held by a live request or free, never both, never neither.
    prop_assert_eq!(pool.num_free_blocks() + holders.len(), pool.capacity(), "blocks lost or counted twice");
    for (&b, &n) in &holders {
        prop_assert_eq!(pool.ref_cnt(b), n, "block {} held by {} requests", b, n);
        // A block held by two requests is a shared, cached full block.
        prop_assert!(n == 1 || pool.block_hash(b).is_some(), "block {} shared by {} but not cached", b, n);
    }
    Ok(())
}

/// Admits (or resumes) `r`, checking the cache hits against what the pool holds.
fn admit(kv: &mut KvCacheManager, mut r: KvRequest, live: &mut Vec<KvRequest>) -> Result<(), TestCaseError> {
    let bs = kv.config().block_size;
    let (hits, hit_tokens) = kv.get_computed_blocks(&r);
    prop_assert_eq!(hit_tokens, hits.len() * bs);
    prop_assert!(hit_tokens < r.num_tokens(), "the last token is always computed");
    if kv.pool().caching_enabled() {
        // The longest run of leading full blocks the pool caches, short of the whole request.
        let cap = (r.num_tokens() - 1) / bs;
        let cached = r.block_hashes().iter().take(cap).take_while(|h| kv.pool().get_cached_block(h).is_some()).count();
        prop_assert_eq!(hits.len(), cached, "request {} found {} of {} cached blocks", r.id, hits.len(), cached);
        for (h, &b) in r.block_hashes().iter().zip(&hits) {
            prop_assert_eq!(kv.pool().block_hash(b), Some(*h), "hit block {} holds another prefix", b);
        }
    } else {
        prop_assert!(hits.is_empty());
    }
    let n = r.num_tokens() - hit_tokens;
    let before = kv.pool().free_queue();
    match kv.allocate_slots(&r, n, &hits, 0, !live.is_empty()) {
        Ok(_) => {
            r.num_computed_tokens = r.num_tokens();
            live.push(r);
        }
        Err(_) => prop_assert_eq!(kv.pool().free_queue(), before, "a failed allocation changed the pool"),
    }
    Ok(())
}

/// Preemption by recompute: the blocks go back, and the request waits with every token it has.
fn preempt(kv: &mut KvCacheManager, live: &mut Vec<KvRequest>, i: usize, preempted: &mut Vec<KvRequest>) {
    let mut r = live.swap_remove(i);
    kv.free(r.id);
    r.num_computed_tokens = 0;
    r.num_preemptions += 1;
    preempted.push(r);
}

fn run(ops: &[Op], order: FreeOrder, caching: bool, broken: bool) -> Result<(), TestCaseError> {
    let bs = 4;
    let mut kv = KvCacheManager::new(KvConfig {
        num_blocks: 40,
        block_size: bs,
        max_model_len: 1 << 16,
        enable_caching: caching,
        free_order: order,
        watermark: 0.0,
    });
    if broken {
        kv.break_free_for_negative_control();
    }
    let prefixes: Vec<Vec<u32>> = (0..3).map(|p| (0..40).map(|i| (p * 1000 + i) as u32).collect()).collect();
    let mut live: Vec<KvRequest> = Vec::new();
    let mut preempted: Vec<KvRequest> = Vec::new();
    let mut next_id = 0u64;
    // (hash, block) of every freed request's cached blocks.
    let mut freed: Vec<(headroom_kv::hash::BlockHash, u32)> = Vec::new();
    for op in ops {
        match op {
            Op::Admit { prefix, prefix_len, tail } => {
                let mut prompt: Vec<u32> =
                    if *prefix < 3 { prefixes[*prefix][..*prefix_len].to_vec() } else { Vec::new() };
                prompt.extend(tail);
                if prompt.is_empty() {
                    prompt.push(7);
                }
                let r = KvRequest::new(next_id, prompt, bs, b"");
                next_id += 1;
                admit(&mut kv, r, &mut live)?;
            }
            Op::Decode { pick, token } if !live.is_empty() => {
                let i = pick % live.len();
                live[i].append_tokens(&[*token]);
                if kv.allocate_slots(&live[i], 1, &[], 0, false).is_ok() {
                    live[i].num_computed_tokens += 1;
                } else {
                    // Out of blocks: preempt it, as vLLM's scheduler does.
                    preempt(&mut kv, &mut live, i, &mut preempted);
                }
            }
            Op::Free { pick } if !live.is_empty() => {
                let r = live.swap_remove(pick % live.len());
                for &b in kv.blocks(r.id) {
                    if let Some(h) = kv.pool().block_hash(b) {
                        freed.push((h, b));
                    }
                }
                kv.free(r.id);
            }
            Op::Preempt { pick } if !live.is_empty() => {
                let i = pick % live.len();
                preempt(&mut kv, &mut live, i, &mut preempted);
            }
            Op::Resume { pick } if !preempted.is_empty() => {
                let r = preempted.swap_remove(pick % preempted.len());
                let id = r.id;
                admit(&mut kv, r.clone(), &mut live)?;
                if live.last().is_none_or(|l| l.id != id) {
                    preempted.push(r);
                }
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
    for r in live.drain(..) {
        kv.free(r.id);
    }
    prop_assert_eq!(kv.pool().num_free_blocks(), kv.pool().capacity());
    Ok(())
}

fn inputs() -> impl Strategy<Value = (Vec<Op>, FreeOrder, bool)> {
    (
        proptest::collection::vec(op(), 1..200),
        prop_oneof![Just(FreeOrder::AppendAll), Just(FreeOrder::PrependUnhashed)],
        any::<bool>(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_after_every_step((ops, order, caching) in inputs()) {
        run(&ops, order, caching, false)?;
    }
}

#[test]
fn negative_control_a_manager_that_leaks_on_free_is_caught() {
    let mut runner =
        TestRunner::new(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() });
    match runner.run(&inputs(), |(ops, order, caching)| run(&ops, order, caching, true)) {
        Err(TestError::Fail(why, _)) => eprintln!("negative control: caught ({why})"),
        other => panic!("the property suite did not catch a manager that leaks on free: {other:?}"),
    }
}

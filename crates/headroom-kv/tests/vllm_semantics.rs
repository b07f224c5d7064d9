//! vLLM v1's block-manager semantics: the worked examples of
//! research/kv-and-checkpointing.md A.1.10 and the checklist of A.7.

use headroom_kv::{FreeOrder, KvCacheManager, KvConfig, KvRequest};

fn manager(num_blocks: u32, block_size: usize, order: FreeOrder) -> KvCacheManager {
    KvCacheManager::new(KvConfig {
        num_blocks,
        block_size,
        max_model_len: 1 << 20,
        enable_caching: true,
        free_order: order,
        watermark: 0.0,
    })
}

/// Admits a request: prefix-cache lookup, then slots for the rest of its prompt.
fn admit(kv: &mut KvCacheManager, req: &mut KvRequest) -> Vec<u32> {
    let (hits, hit_tokens) = kv.get_computed_blocks(req);
    let n = req.num_tokens() - hit_tokens;
    kv.allocate_slots(req, n, &hits, 0, false).unwrap();
    req.num_computed_tokens = req.num_tokens();
    kv.blocks(req.id).to_vec()
}

/// One decode step: the token emitted by the last step is appended and computed.
fn decode(kv: &mut KvCacheManager, req: &mut KvRequest, token: u32) {
    req.append_tokens(&[token]);
    kv.allocate_slots(req, 1, &[], 0, false).unwrap();
    req.num_computed_tokens += 1;
}

/// A.1.10 (a), the design-document example. Block size 4, ten usable blocks.
/// headroom keeps block 0 as the null block, so the document's block k is block k+1 here.
#[test]
fn design_document_example() {
    let doc = |v: &[u32]| v.iter().map(|b| b - 1).collect::<Vec<_>>();
    let mut kv = manager(11, 4, FreeOrder::AppendAll);
    let r0_prompt: Vec<u32> = (100..115).collect(); // 15 tokens
    let mut r0 = KvRequest::new(0, r0_prompt.clone(), 4, b"");
    assert_eq!(doc(&admit(&mut kv, &mut r0)), vec![0, 1, 2, 3]);
    decode(&mut kv, &mut r0, 115); // fills block 3, which is then cached
    decode(&mut kv, &mut r0, 116); // allocates block 4
    assert_eq!(doc(kv.blocks(0)), vec![0, 1, 2, 3, 4]);
    assert!(kv.pool().block_hash(4).is_some(), "block 3 (doc) is full and cached");

    let mut r1_prompt: Vec<u32> = r0_prompt[..10].to_vec();
    r1_prompt.extend([900, 901, 902, 903]); // 14 tokens, first 10 shared
    let mut r1 = KvRequest::new(1, r1_prompt, 4, b"");
    let (hits, _) = kv.get_computed_blocks(&r1);
    assert_eq!(doc(&hits), vec![0, 1], "block 2 matches only 2 of its 4 tokens");
    assert_eq!(doc(&admit(&mut kv, &mut r1)), vec![0, 1, 5, 6]);

    kv.free(0);
    assert_eq!(doc(&kv.pool().free_queue()), vec![7, 8, 9, 4, 3, 2]);
    kv.free(1);
    assert_eq!(doc(&kv.pool().free_queue()), vec![7, 8, 9, 4, 3, 2, 6, 5, 1, 0]);

    let mut r2_prompt: Vec<u32> = r0_prompt[..12].to_vec();
    r2_prompt.extend(500..517); // 29 tokens, first 12 shared with R0
    let mut r2 = KvRequest::new(2, r2_prompt, 4, b"");
    let (hits, _) = kv.get_computed_blocks(&r2);
    assert_eq!(doc(&hits), vec![0, 1, 2]);
    let evictions = kv.pool().evictions();
    assert_eq!(doc(&admit(&mut kv, &mut r2)), vec![0, 1, 2, 7, 8, 9, 4, 3]);
    assert!(kv.pool().evictions() > evictions, "block 3 (doc) is evicted from the cache");
    kv.validate().unwrap();
}

/// A.1.10 (b), vLLM's `test_prefill`, under both free-order conventions.
#[test]
fn vllm_test_prefill() {
    for (order, after_free) in [
        (FreeOrder::PrependUnhashed, vec![5, 4, 6, 7, 8, 9, 10, 3, 2, 1]),
        (FreeOrder::AppendAll, vec![6, 7, 8, 9, 10, 4, 5, 3, 2, 1]),
    ] {
        let mut kv = manager(11, 16, order);
        let common: Vec<u32> = (0..48).collect();
        let with_tail = |tail: std::ops::Range<u32>| common.iter().copied().chain(tail).collect::<Vec<u32>>();
        let mut r0 = KvRequest::new(0, with_tail(1000..1007), 16, b"");
        assert_eq!(admit(&mut kv, &mut r0), vec![1, 2, 3, 4]);
        assert!((1..=3).all(|b| kv.pool().block_hash(b).is_some()) && kv.pool().block_hash(4).is_none());
        let mut r1 = KvRequest::new(1, with_tail(2000..2005), 16, b"");
        assert_eq!(admit(&mut kv, &mut r1), vec![1, 2, 3, 5]);
        assert!((1..=3).all(|b| kv.pool().ref_cnt(b) == 2));
        assert_eq!(kv.pool().num_free_blocks(), 5);
        kv.free(0);
        kv.free(1);
        assert_eq!(kv.pool().free_queue(), after_free, "{order:?}");
        kv.validate().unwrap();
        if order == FreeOrder::PrependUnhashed {
            let mut r2 = KvRequest::new(2, with_tail(3000..3006), 16, b"");
            assert_eq!(admit(&mut kv, &mut r2), vec![1, 2, 3, 5], "reuses the partial block");
            assert_eq!(kv.pool().num_free_blocks(), 6);
            kv.free(2);
            let mut r3 = KvRequest::new(3, vec![99; 160], 16, b"");
            assert_eq!(admit(&mut kv, &mut r3), vec![5, 4, 6, 7, 8, 9, 10, 3, 2, 1]);
            assert_eq!(kv.pool().num_free_blocks(), 0);
        }
    }
}

/// A.1.10 (c), the paper's Fig. 6: block size 4, a 7-token prompt.
#[test]
fn paper_figure_6() {
    let mut kv = manager(8, 4, FreeOrder::PrependUnhashed);
    let mut r = KvRequest::new(0, (0..7).collect(), 4, b"");
    assert_eq!(admit(&mut kv, &mut r).len(), 2);
    decode(&mut kv, &mut r, 7);
    assert_eq!(kv.blocks(0).len(), 2, "the first output token fills the free slot");
    decode(&mut kv, &mut r, 8);
    assert_eq!(kv.blocks(0).len(), 3, "the second allocates a third block");
}

#[test]
fn hits_are_block_aligned_and_leave_the_last_token_to_compute() {
    let mut kv = manager(20, 16, FreeOrder::PrependUnhashed);
    let mut a = KvRequest::new(0, (0..64).collect(), 16, b"");
    admit(&mut kv, &mut a);
    let b = KvRequest::new(1, (0..48).collect(), 16, b"");
    assert_eq!(kv.get_computed_blocks(&b).1, 32, "48 tokens hit at most 32");
    let c = KvRequest::new(2, (0..49).collect(), 16, b"");
    assert_eq!(kv.get_computed_blocks(&c).1, 48, "49 tokens can hit 48");
    let salted = KvRequest::new(3, (0..49).collect(), 16, b"other tenant");
    assert_eq!(kv.get_computed_blocks(&salted).1, 0, "a cache salt isolates tenants");
}

#[test]
fn hits_waiting_in_the_free_queue_count_against_capacity_and_failure_changes_nothing() {
    let mut kv = manager(6, 4, FreeOrder::PrependUnhashed); // 5 usable blocks
    let mut a = KvRequest::new(0, (0..16).collect(), 4, b"");
    admit(&mut kv, &mut a); // 4 blocks, 3 cached (the last token's block is cached too: 16 tokens)
    kv.free(0);
    assert_eq!(kv.pool().num_free_blocks(), 5);
    // 20 tokens: hits 3 blocks (cap num_tokens - 1 = 19 -> 4 blocks; all 4 cached) that sit in the free queue.
    let b = KvRequest::new(1, (0..16).chain(100..108).collect(), 4, b"");
    let (hits, hit_tokens) = kv.get_computed_blocks(&b);
    assert_eq!((hits.len(), hit_tokens), (4, 16));
    let before = (kv.pool().free_queue(), kv.pool().evictions());
    // 24 tokens need 6 blocks: 4 hits (all free) + 2 new = 6 > 5 free.
    let err = kv.allocate_slots(&b, 8, &hits, 0, false).unwrap_err();
    assert_eq!((err.needed, err.free), (6, 5));
    assert_eq!((kv.pool().free_queue(), kv.pool().evictions()), before, "nothing changed");
    assert!(kv.blocks(1).is_empty());
    kv.validate().unwrap();
}

#[test]
fn reverse_freeing_makes_the_longest_prefix_block_the_first_victim() {
    let mut kv = manager(10, 4, FreeOrder::AppendAll);
    let mut a = KvRequest::new(0, (0..12).collect(), 4, b"");
    let blocks = admit(&mut kv, &mut a);
    kv.free(0);
    // The last block of the request is reused first.
    assert_eq!(&kv.pool().free_queue()[6..], &[blocks[2], blocks[1], blocks[0]]);
}

#[test]
fn watermark_holds_back_admissions_only() {
    let mut kv = KvCacheManager::new(KvConfig {
        num_blocks: 11,
        block_size: 4,
        max_model_len: 1 << 20,
        enable_caching: false,
        free_order: FreeOrder::PrependUnhashed,
        watermark: 0.2, // 2 of 10 blocks
    });
    let a = KvRequest::new(0, (0..36).collect(), 4, b""); // 9 blocks
    assert!(kv.allocate_slots(&a, 36, &[], 0, true).is_err(), "9 + 2 reserved > 10");
    assert!(kv.allocate_slots(&a, 36, &[], 0, false).is_ok(), "a running request may use the reserve");
}

//! # headroom-fuzz
//!
//! One function per fuzz target: each takes arbitrary bytes, feeds them to one
//! of headroom's readers (or drives the allocator with them), and panics only
//! when headroom is wrong — a reader that panics, a value read back
//! differently than it was written, a schedule that does not fit its budget,
//! an allocator whose invariants break. Errors for bad input are the expected
//! outcome and pass.
//!
//! `fuzz/` runs these under cargo-fuzz (libFuzzer, nightly);
//! `tests/corpora.rs` replays the checked-in corpora on stable in
//! `cargo test`, so a fixed crash never returns. Targets and figures:
//! docs/RELIABILITY.md.

use headroom_alloc::units::{parse_size, GIB, MIB};
use headroom_alloc::{AllocError, AllocatorConfig, DeviceCachingAllocator, SimDevice};
use headroom_kv::dist::{LengthDist, Role};
use headroom_plan::checkpoint::{simulate, solve, Chain, SolveError};
use headroom_plan::estimate::estimate;
use headroom_plan::gpu::gpu;
use headroom_plan::infer::{self, InferConfig, Runtime, WeightFormat};
use headroom_plan::job::{Attention, Job, Optimizer, Precision, TrainConfig};
use headroom_plan::model::Model;
use headroom_trace::jsonl::{format_op, parse_line, read_trace};
use headroom_trace::replay::{replay, ReplayOptions};
use rand::SeedableRng;

/// A fuzz target: arbitrary bytes in, a panic only when headroom is wrong.
pub type Target = fn(&[u8]);

/// The targets by name, as `fuzz/fuzz_targets/` and `fuzz/corpus/` name them.
pub const TARGETS: [(&str, Target); 9] = [
    ("trace_jsonl", trace_jsonl),
    ("alloc_conf", alloc_conf),
    ("hf_config", hf_config),
    ("hf_config_plan", hf_config_plan),
    ("checkpoint_chain", checkpoint_chain),
    ("byte_size", byte_size),
    ("length_dist", length_dist),
    ("allocator_ops", allocator_ops),
    ("snapshot", snapshot),
];

/// A memory snapshot (pickle or JSON): read, its start state inferred, its
/// trace checked and replayed on a small simulated GPU; errors are fine,
/// panics are not, and a replay's peaks stay within the device.
pub fn snapshot(data: &[u8]) {
    let Ok(snap) = headroom_trace::snapshot::read_snapshot(data) else { return };
    use headroom_trace::device_trace::DeviceTrace;
    use headroom_trace::snapshot_replay::check_from;
    use headroom_trace::what_if::what_if_device;
    for device in snap.devices().into_iter().take(4) {
        let Ok(t) = DeviceTrace::new(&snap, device) else { continue };
        let (config, _) = snap.allocator_config();
        let Ok(f) = check_from(&t, config.clone(), GIB, |_| {}) else { continue };
        if let Ok(w) = what_if_device(&t, config, GIB, &f.recorded, None, |_| {}) {
            assert!(w.peak_reserved_bytes <= GIB, "reserved past the device: {}", w.peak_reserved_bytes);
        }
    }
}

/// A JSONL trace: read, written back line by line and read again to the same
/// operations, then replayed on a small simulated GPU whose invariants must hold.
pub fn trace_jsonl(data: &[u8]) {
    let Ok(ops) = read_trace(data) else { return };
    for l in &ops {
        let again = parse_line(&format_op(&l.op), l.line).expect("a written line reads back");
        assert_eq!(again, l.op, "line {} changed in a round trip", l.line);
    }
    let opts = ReplayOptions {
        config: AllocatorConfig::default(),
        capacity: 64 * MIB,
        history: Some(1000),
        policy: headroom_alloc::PolicyName::PyTorch,
    };
    if let Ok((report, a)) = replay(&ops, &opts, |_| {}) {
        a.validate().expect("the allocator's invariants hold after a replay");
        assert!(report.peak_reserved_bytes <= 64 * MIB, "reserved past the device: {report:?}");
        assert!(report.peak_allocated_bytes <= report.peak_reserved_bytes);
    }
}

/// A `PYTORCH_CUDA_ALLOC_CONF` string: parsed, its keys without effect listed,
/// and its own text parsing to the same settings.
pub fn alloc_conf(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(c) = AllocatorConfig::parse(text) else { return };
    let _ = c.keys_without_effect();
    assert_eq!(AllocatorConfig::parse(&c.raw).as_ref(), Ok(&c), "{text:?} reads differently the second time");
    if c.expandable_segments {
        assert!(c.large_segment_size.is_multiple_of(2 * MIB), "{text:?}: pages that cannot be mapped");
    }
}

/// A Hugging Face `config.json`: read and checked, and when it is a model, its counts
/// computed and its jobs validated — the reader alone, at the speed a reader fuzzes at.
/// [`hf_config_plan`] plans what it reads, at a few hundred inputs a second.
pub fn hf_config(data: &[u8]) {
    let Ok(m) = read_model(data) else { return };
    let g = gpu("h100-sxm").expect("a catalog GPU");
    for seq in [1, 2048, 1 << 20] {
        let cfg = TrainConfig::new(1, seq, Precision::Mixed, Optimizer::AdamW);
        let _ = Job::new(&m, &g, cfg);
        if m.generates() {
            for cfg in infer_configs(&g, seq) {
                let _ = infer::check(&m, &cfg);
            }
        }
    }
}

fn read_model(data: &[u8]) -> Result<Model, ()> {
    let text = std::str::from_utf8(data).map_err(|_| ())?;
    let m = Model::from_hf_config(text, "fuzz").map_err(|_| ())?;
    let counts = (m.params(), m.active_params(), m.layer_params(), m.block_linears());
    assert!(counts.1 <= counts.0, "more active parameters than parameters: {m}");
    let _ = m.to_string();
    Ok(m)
}

fn infer_configs(g: &headroom_plan::gpu::GpuSpec, seq: u64) -> [InferConfig; 4] {
    [
        Runtime::Vllm(headroom_plan::engine::Engine::vllm_defaults(g)),
        Runtime::Transformers { attention: Attention::Eager, all_logits: false, new_tokens: 1 },
        Runtime::Transformers { attention: Attention::Sdpa, all_logits: true, new_tokens: 1 },
        Runtime::Transformers { attention: Attention::Sdpa, all_logits: false, new_tokens: 8 },
    ]
    .map(|runtime| InferConfig {
        runtime,
        batch: 1,
        seq,
        weights: WeightFormat::Bf16,
        kv_bytes: 2.0,
        tensor: 1,
        quantize: None,
    })
}

/// A Hugging Face `config.json`: read, and when it is a model, planned for
/// training and inference without a panic or a figure that is not a number.
pub fn hf_config_plan(data: &[u8]) {
    let Ok(m) = read_model(data) else { return };
    let g = gpu("h100-sxm").expect("a catalog GPU");
    for seq in [1, 2048, 1 << 20] {
        let cfg = TrainConfig::new(1, seq, Precision::Mixed, Optimizer::AdamW);
        if let Ok(job) = Job::new(&m, &g, cfg) {
            // A job no builder serves is refused with a reason; one that is served has figures.
            if let Ok(e) = estimate(&job) {
                let bytes = e.memory.per_gpu_bytes;
                assert!(!bytes.is_nan() && bytes >= 0.0, "{e:?}");
            }
        }
        if m.generates() {
            for cfg in infer_configs(&g, seq) {
                if infer::check(&m, &cfg).is_ok() {
                    let e = infer::estimate(&m, &g, &cfg);
                    assert!(!e.per_gpu_bytes.is_nan() && e.activations >= 0.0, "{e:?}");
                }
            }
        }
    }
}

/// A checkpoint chain: read, and when it is one, solved at a budget and slot
/// count drawn from the input. A plan fits its budget and replays; when none
/// fits, the least budget reported fits.
pub fn checkpoint_chain(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(chain) = Chain::from_json(text) else { return };
    if chain.stages.len() > 40 {
        return;
    }
    let h = data.iter().fold(0u64, |h, &b| h.wrapping_mul(31).wrapping_add(b as u64));
    let total: u64 = chain
        .stages
        .iter()
        .map(|s| s.saved_bytes.saturating_add(s.output_bytes))
        .fold(chain.input_bytes, u64::saturating_add);
    let budget = (total / (1 + h % 7)).max(1);
    let slots = 1 + (h >> 8) as u32 % 200;
    match solve(&chain, budget, slots) {
        Ok(plan) => {
            assert!(plan.outcome.peak <= budget, "a plan over its budget");
            let again = simulate(&chain, &plan.ops, Some(budget)).expect("the plan replays");
            assert_eq!(again.peak, plan.outcome.peak);
        }
        Err(SolveError::Infeasible { least: Some(least), least_bytes, .. }) => {
            assert!(least >= least_bytes, "{least} < {least_bytes}");
            assert!(solve(&chain, least, slots).is_ok(), "the least budget reported, {least}, does not fit");
            // Fitting is monotone from slots² bytes on: a budget there that does not fit is under the least.
            if budget >= (slots as u64).pow(2) {
                assert!(least > budget, "{budget} does not fit, but {least} below it does");
                assert!(solve(&chain, least.saturating_mul(2), slots).is_ok(), "twice the least does not fit");
            }
        }
        Err(_) => {}
    }
}

/// A size as typed on the command line: when it reads, its digits read back to it.
pub fn byte_size(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(n) = parse_size(text) {
        assert_eq!(parse_size(&n.to_string()), Ok(n));
    }
}

/// A length distribution: when it reads, it samples lengths of at least 1 token.
pub fn length_dist(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    for role in [Role::Prompt, Role::Output] {
        if let Ok(d) = LengthDist::parse(text, role) {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
            for _ in 0..8 {
                assert!(d.sample(&mut rng) >= 1);
            }
            let _ = d.to_string();
        }
    }
}

/// Settings the allocator target runs under, picked by the first byte.
const CONFIGS: [&str; 5] = [
    "",
    "expandable_segments:True",
    "max_split_size_mb:40,garbage_collection_threshold:0.6",
    "roundup_power2_divisions:[64:8,256:4,>:2]",
    "max_split_size_mb:24,max_non_split_rounding_mb:32,expandable_segments:True",
];

/// Arbitrary operations on the allocator over a 256 MiB simulated GPU, under
/// a setting and a policy the first byte picks, the validator after each:
/// malloc, free, record_stream, event completion, empty_cache and the memory
/// fraction, decoded three bytes at a time.
pub fn allocator_ops(data: &[u8]) {
    let Some((&first, rest)) = data.split_first() else { return };
    let config = AllocatorConfig::parse(CONFIGS[first as usize % CONFIGS.len()]).expect("a valid setting");
    let policy =
        headroom_alloc::PolicyName::ALL[first as usize / CONFIGS.len() % headroom_alloc::PolicyName::ALL.len()];
    let capacity = 256 * MIB;
    let mut a = DeviceCachingAllocator::with_policy(SimDevice::new(capacity), config, policy.build());
    a.record_history(Some(256));
    let mut live: Vec<u64> = Vec::new();
    for op in rest.chunks(3) {
        let (kind, x, y) = (op[0], *op.get(1).unwrap_or(&0) as u64, *op.get(2).unwrap_or(&0) as u64);
        let stream = y % 3;
        match kind % 8 {
            // Sizes from a byte to 2^26 bytes, spread over both pools and own segments.
            0..=2 => {
                let size = (1 + x * 257 + y) << (kind / 8 % 12);
                match a.malloc(size, stream) {
                    Ok(b) => {
                        assert!(b.size >= size);
                        live.push(b.ptr);
                    }
                    Err(AllocError::OutOfMemory(r) | AllocError::OverLimit(r)) => {
                        assert!(r.allocated <= capacity && r.reserved <= capacity, "{r:?}");
                    }
                    Err(AllocError::NeverFits(r)) => assert!(r.alloc_size > capacity || r.requested >= 1 << 60),
                    Err(e) => panic!("malloc({size}) failed oddly: {e}"),
                }
            }
            3 | 4 if !live.is_empty() => {
                let ptr = live.swap_remove(x as usize % live.len());
                a.free(ptr).expect("a live block frees");
            }
            5 if !live.is_empty() => {
                let ptr = live[x as usize % live.len()];
                a.record_stream(ptr, stream).expect("a live block is recorded");
            }
            6 => a.device_mut().complete_all_events(),
            7 if x < 16 => a.empty_cache().expect("empty_cache"),
            7 if x < 32 => a.set_memory_fraction((y as f64 / 255.0).max(0.05)).expect("a fraction in range"),
            _ => {}
        }
        a.validate().expect("the allocator's invariants hold after every operation");
    }
    while let Some(ptr) = live.pop() {
        a.free(ptr).expect("a live block frees");
    }
    a.device_mut().complete_all_events();
    a.empty_cache().expect("empty_cache");
    a.validate().expect("the allocator's invariants hold at the end");
}

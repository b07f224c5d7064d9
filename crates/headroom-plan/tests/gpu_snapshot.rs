//! A synthesized step program against the same job recorded on a GPU.
//!
//! `data/snapshots/qwen3-1.7b-train.pickle.gz` is what PyTorch recorded on an H200 (torch 2.11,
//! transformers 5.17) for Qwen3-1.7B built from its config and trained in bf16 without
//! checkpointing for two steps of `torch.optim.AdamW` at one sequence of 512 tokens, from
//! before the model was built. The planner's program for that job — its template, recorded
//! on CPU at five layers and expanded to 28, with the GPU's kernels — is compared with it:
//!
//! - what is live at the peak (the caller's bytes) within 1%;
//! - the allocator's peak reserved, the program replayed through headroom's allocator, within
//!   5% of the recording's (recounted from its segment events);
//! - the allocations, size by size: at least 95% of the recording's allocated bytes are of a
//!   size the program allocates as often;
//! - in order: at least 90% of the recording's allocations of more than 256 bytes line up with
//!   the program's, size for size, in the longest common subsequence of the two (the smaller
//!   ones are numbers the CPU recording leaves out as host values, and cuDNN's 256-byte
//!   workspace).
//!
//! The differences are printed by size (`-- --nocapture`): what only the GPU allocates, and
//! what only the CPU-recorded program does. Tolerances set before comparing.

use headroom_alloc::{AllocatorConfig, PolicyName};
use headroom_plan::builders::{hf, Device, StateScale};
use headroom_plan::gpu::gpu;
use headroom_plan::job::{Attention, Optimizer, Precision, TrainConfig};
use headroom_plan::model::Model;
use headroom_plan::program::{Op, Program};
use headroom_plan::replay::{replay, ReplaySettings};
use headroom_trace::device_trace::DeviceTrace;
use headroom_trace::snapshot::{read_snapshot_file, TraceAction};
use std::collections::BTreeMap;

const QWEN3_1_7B: &str = r#"{"model_type": "qwen3", "hidden_size": 2048, "intermediate_size": 6144,
  "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
  "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": true}"#;

/// Allocations of at most this many bytes are left out of the comparison in order.
const SMALLEST_ORDERED: u64 = 256;

/// What the recording shows: live bytes over time and reserved bytes over time, from the
/// state the trace began in.
struct Recorded {
    live_peak: u64,
    reserved_peak: u64,
    sizes: BTreeMap<u64, u64>,
    /// Every allocation's size, in order.
    order: Vec<u64>,
}

fn recorded() -> Recorded {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/snapshots/qwen3-1.7b-train.pickle.gz");
    let snap = read_snapshot_file(std::path::Path::new(path)).expect("the shipped snapshot reads");
    let t = DeviceTrace::new(&snap, 0).expect("its start state");
    let (mut live, mut reserved) = (t.start.allocated_bytes(), t.start.reserved_bytes());
    let (mut live_peak, mut reserved_peak) = (live, reserved);
    let mut sizes = BTreeMap::new();
    let mut order = Vec::new();
    // The caller's bytes of each live block, by address, to subtract at its free.
    let mut at: BTreeMap<u64, u64> = BTreeMap::new();
    for e in &snap.device_traces[0] {
        match e.action {
            TraceAction::Alloc => {
                live += e.size;
                at.insert(e.addr, e.size);
                *sizes.entry(e.size).or_insert(0) += 1;
                if e.size > SMALLEST_ORDERED {
                    order.push(e.size);
                }
                live_peak = live_peak.max(live);
            }
            TraceAction::FreeCompleted => {
                if let Some(n) = at.remove(&e.addr) {
                    live -= n;
                }
            }
            TraceAction::SegmentAlloc => {
                reserved += e.size;
                reserved_peak = reserved_peak.max(reserved);
            }
            TraceAction::SegmentFree => reserved -= e.size,
            _ => {}
        }
    }
    Recorded { live_peak, reserved_peak, sizes, order }
}

fn program() -> (Program, Vec<u64>, String) {
    let model = Model::from_hf_config(QWEN3_1_7B, "qwen3-1.7b").unwrap();
    let h200 = gpu("h200").unwrap();
    let cfg = TrainConfig { attention: Attention::Sdpa, ..TrainConfig::new(1, 512, Precision::Bf16, Optimizer::AdamW) };
    let hf = hf::program(&model, &cfg, Device::Gpu(&h200), 2, &StateScale::default()).expect("a template serves it");
    let sizes = hf.program.sizes(1, 512);
    (hf.program, sizes, hf.key)
}

#[test]
fn qwen3_as_the_h200_recorded_it() {
    let rec = recorded();
    let (p, sizes, key) = program();
    // The recording began with PyTorch's cuBLAS workspaces already made by an earlier step of
    // the process; the program makes them in its first step: compare beside them.
    let live = p.live_peak(&sizes).bytes;
    let mut ours: BTreeMap<u64, u64> = BTreeMap::new();
    let mut order = Vec::new();
    for op in &p.ops {
        if let Op::Alloc(t) = op {
            *ours.entry(sizes[*t as usize]).or_insert(0) += 1;
            if sizes[*t as usize] > SMALLEST_ORDERED {
                order.push(sizes[*t as usize]);
            }
        }
    }
    let in_order = common_subsequence(&rec.order, &order);
    let settings = ReplaySettings {
        capacity: gpu("h200").unwrap().memory_bytes,
        config: AllocatorConfig::default(),
        policy: PolicyName::PyTorch,
    };
    let r = replay(&p, &sizes, &settings);
    let total: u64 = rec.sizes.iter().map(|(s, n)| s * n).sum();
    let matched: u64 = rec.sizes.iter().map(|(s, n)| s * (*n).min(ours.get(s).copied().unwrap_or(0))).sum();
    let mut diffs: Vec<(u64, u64, u64, u64)> = rec
        .sizes
        .keys()
        .chain(ours.keys())
        .map(|&s| {
            let (g, o) = (rec.sizes.get(&s).copied().unwrap_or(0), ours.get(&s).copied().unwrap_or(0));
            (s * g.abs_diff(o), s, g, o)
        })
        .filter(|d| d.0 > 0)
        .collect();
    diffs.sort_unstable_by(|a, b| b.cmp(a));
    diffs.dedup();
    println!("template {key}");
    println!(
        "live peak: recorded {} B, program {} B ({:+.2}%)",
        rec.live_peak,
        live,
        (live as f64 / rec.live_peak as f64 - 1.0) * 100.0
    );
    println!(
        "reserved peak: recorded {} B, replayed {} B ({:+.2}%)",
        rec.reserved_peak,
        r.peak_reserved,
        (r.peak_reserved as f64 / rec.reserved_peak as f64 - 1.0) * 100.0
    );
    println!("allocated bytes matched size by size: {:.1}%", matched as f64 / total as f64 * 100.0);
    println!(
        "allocations in order: {in_order} of the recording's {} ({:.1}%), the program's {}",
        rec.order.len(),
        in_order as f64 / rec.order.len() as f64 * 100.0,
        order.len()
    );
    for (bytes, size, g, o) in diffs.iter().take(12) {
        println!("  {size:>12} B: recorded {g:>5}, program {o:>5} ({:.1} MiB apart)", *bytes as f64 / (1 << 20) as f64);
    }
    assert!((live as f64 / rec.live_peak as f64 - 1.0).abs() <= 0.01, "live peak");
    assert!((r.peak_reserved as f64 / rec.reserved_peak as f64 - 1.0).abs() <= 0.05, "reserved peak");
    assert!(matched as f64 >= 0.95 * total as f64, "allocations size by size");
    assert!(in_order as f64 >= 0.90 * rec.order.len() as f64, "allocations in order");
}

/// The length of the longest common subsequence of `a` and `b`: Myers's O((N + M) D)
/// algorithm, D the edit distance.
fn common_subsequence(a: &[u64], b: &[u64]) -> usize {
    let (n, m) = (a.len() as isize, b.len() as isize);
    let max = (n + m) as usize;
    let offset = max as isize + 1;
    let mut v = vec![0isize; 2 * max + 3];
    for d in 0..=max as isize {
        let mut k = -d;
        while k <= d {
            let i = (k + offset) as usize;
            let mut x = if k == -d || (k != d && v[i - 1] < v[i + 1]) { v[i + 1] } else { v[i - 1] + 1 };
            let mut y = x - k;
            while x < n && y < m && a[x as usize] == b[y as usize] {
                x += 1;
                y += 1;
            }
            v[i] = x;
            if x >= n && y >= m {
                // d edits: insertions and deletions; the rest is common.
                return ((n + m - d) / 2) as usize;
            }
            k += 2;
        }
    }
    0
}

//! What a user can do about a plan's memory, each answer checked by replaying the job again
//! with it applied.
//!
//! A job that does not fit: the levers a user has — checkpointing, a smaller micro-batch
//! with accumulation to the same sequences a step, the attention kernel, AdamW's fused
//! implementation, the allocator's expandable segments, LoRA or QLoRA where the job is
//! fine-tuning, and more GPUs — each replayed alone; where none fits alone, those that save
//! memory are applied together until the job fits. At most [`MOST_REPLAYS`] replays in all.
//!
//! A job that fits but whose allocator reserves far more than it allocates: the caching
//! allocator's cache, and what it reserves under `expandable_segments:True`.

use crate::estimate::{by_step_time, Estimate, Estimator};
use crate::gpu::GpuSpec;
use crate::job::{Attention, Checkpointing, Job, Optimizer, OptimizerImpl};
use crate::model::Model;
use crate::names::{named, Named};
use crate::recording::Recording;
use crate::request::{FinetuneMode, TrainRequest};
use headroom_alloc::AllocatorConfig;

/// What a lever changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lever {
    Checkpointing,
    /// A smaller micro-batch, accumulated to the same sequences per optimizer step (for a
    /// recording, whose accumulation is its own, the smaller micro-batch alone).
    MicroBatch,
    Attention,
    /// AdamW's fused implementation (no copy of the second moments during the step).
    OptimizerImpl,
    /// `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`.
    ExpandableSegments,
    /// LoRA adapters, or QLoRA's 4-bit base.
    Adapters,
    /// More GPUs, the model states sharded over them (ZeRO-3).
    MoreGpus,
    /// Several of the above at once.
    Together,
}

named!(Lever {
    Checkpointing => ("checkpointing", "recompute activations in the backward"),
    MicroBatch => ("micro-batch", "a smaller micro-batch, accumulated to the same sequences a step"),
    Attention => ("attention", "an attention kernel that keeps less"),
    OptimizerImpl => ("optimizer-impl", "AdamW's fused implementation"),
    ExpandableSegments => ("expandable-segments", "the caching allocator's expandable segments"),
    Adapters => ("adapters", "LoRA adapters, or QLoRA's 4-bit base"),
    MoreGpus => ("more-gpus", "more GPUs, the model states sharded over them"),
    Together => ("together", "several levers at once"),
});

/// A lever replayed: the flags that change, as the user would write them, and the estimate
/// with them.
#[derive(Clone, Debug)]
pub struct Remedy {
    pub lever: Lever,
    pub flags: String,
    pub estimate: Estimate,
}

impl Remedy {
    pub fn fits(&self) -> bool {
        self.estimate.verdict.fits
    }
}

/// The job asked for, as the levers change it: the request and the allocator's settings.
#[derive(Clone, Copy)]
pub struct Asked<'a> {
    pub request: &'a TrainRequest,
    pub model: &'a Model,
    pub gpu: &'a GpuSpec,
    pub estimator: &'a Estimator,
    /// The job fine-tunes a pretrained model (adapters are a lever), where the request says
    /// full fine-tuning.
    pub fine_tuning: bool,
    /// The step recorded in a file (`--program`): its program is the one recorded, and only
    /// the allocator's settings change what it needs.
    pub recording: Option<&'a Recording>,
}

/// One change to the job: its flags and what it does to the request and the allocator.
#[derive(Clone)]
struct Change {
    lever: Lever,
    flags: String,
    request: fn(&mut TrainRequest, u64),
    /// The value the change sets, where it takes one (a micro-batch, a GPU count).
    value: u64,
    expandable: bool,
}

impl Change {
    fn new(lever: Lever, flags: String, request: fn(&mut TrainRequest, u64), value: u64) -> Change {
        Change { lever, flags, request, value, expandable: false }
    }
}

/// Most GPUs the lever asks for: eight times the job's.
const MOST_GPUS_FACTOR: u64 = 8;

/// Replays the levers may take in all, alone and together: a plan that does not fit takes
/// at most this many more estimates of the job.
pub const MOST_REPLAYS: usize = 14;

/// The replays left.
struct Budget(std::cell::Cell<usize>);

impl Budget {
    fn take(&self) -> bool {
        let left = self.0.get();
        self.0.set(left.saturating_sub(1));
        left > 0
    }
}

/// The levers that a job which does not fit has, each replayed, those that fit first and
/// fastest first, then the others by the memory they need; a lever that saves nothing is
/// left out. Empty where the job fits.
pub fn remedies(asked: &Asked, estimate: &Estimate) -> Vec<Remedy> {
    if estimate.verdict.fits {
        return Vec::new();
    }
    let base = estimate.memory.per_gpu_bytes;
    let budget = Budget(std::cell::Cell::new(MOST_REPLAYS));
    let mut out = Vec::new();
    // The levers that save memory alone, in the order they are combined.
    let mut saving = Vec::new();
    for cascade in cascades(asked, estimate) {
        let Some(r) = first_fit(asked, &budget, &[], &cascade) else { continue };
        if r.fits() || r.estimate.memory.per_gpu_bytes < base {
            out.push(r);
            saving.push(cascade);
        }
    }
    if saving.len() > 1 && !out.iter().any(Remedy::fits) {
        if let Some(together) = together(asked, &budget, &saving) {
            out.push(together);
        }
    }
    out.sort_by(|a, b| {
        b.fits().cmp(&a.fits()).then(if a.fits() {
            by_step_time(a.estimate.step_time_s(), b.estimate.step_time_s())
        } else {
            a.estimate.memory.per_gpu_bytes.total_cmp(&b.estimate.memory.per_gpu_bytes)
        })
    });
    out
}

/// Of a cascade of changes on top of `fixed`, the first whose replay fits, or the last
/// replayed (the one that saves the most).
fn first_fit(asked: &Asked, budget: &Budget, fixed: &[Change], cascade: &[Change]) -> Option<Remedy> {
    let mut last = None;
    for change in cascade {
        let mut changes = fixed.to_vec();
        changes.push(change.clone());
        let Some(r) = replay(asked, budget, &changes) else { continue };
        let fits = r.fits();
        last = Some(r);
        if fits {
            break;
        }
    }
    last
}

/// Where no lever fits alone: the levers that save memory, in their order (the cheapest in
/// step time first), one on top of the other until the job fits; each cascade tried again on
/// top of those before it.
fn together(asked: &Asked, budget: &Budget, cascades: &[Vec<Change>]) -> Option<Remedy> {
    let mut fixed: Vec<Change> = Vec::new();
    let mut best = None;
    for cascade in cascades {
        let Some(r) = first_fit(asked, budget, &fixed, cascade) else { continue };
        // The change kept: the cascade's step the replay stopped at.
        let kept = cascade.iter().find(|c| r.flags.ends_with(c.flags.as_str())).cloned();
        fixed.extend(kept);
        let fits = r.fits();
        best = Some(r);
        if fits {
            break;
        }
    }
    best.filter(|r| r.lever == Lever::Together)
}

/// The job with `changes` applied, replayed; `None` where the changed job is refused or
/// the replays are spent.
fn replay(asked: &Asked, budget: &Budget, changes: &[Change]) -> Option<Remedy> {
    let mut request = *asked.request;
    let mut estimator = asked.estimator.clone();
    for c in changes {
        (c.request)(&mut request, c.value);
        if c.expandable {
            estimator.alloc = AllocatorConfig::parse("expandable_segments:True").ok()?;
        }
    }
    let job = match asked.recording {
        Some(rec) => request.resolve_recorded(asked.model, asked.gpu, rec).ok()?,
        None => request.resolve(asked.model, asked.gpu).ok()?,
    };
    if !budget.take() {
        return None;
    }
    let estimate = estimator.estimate(&job).ok()?;
    let lever = if changes.len() == 1 { changes[0].lever } else { Lever::Together };
    let flags = changes.iter().map(|c| c.flags.as_str()).collect::<Vec<_>>().join(" ");
    Some(Remedy { lever, flags, estimate })
}

/// Each lever as the changes to try in order, the first that fits kept.
fn cascades(asked: &Asked, estimate: &Estimate) -> Vec<Vec<Change>> {
    let r = asked.request;
    let job = &estimate.job;
    let mut out = Vec::new();
    let expandable = (!asked.estimator.alloc.expandable_segments).then(|| {
        let flags = "--alloc-conf expandable_segments:True".into();
        vec![Change { expandable: true, ..Change::new(Lever::ExpandableSegments, flags, |_, _| {}, 0) }]
    });
    if let Some(rec) = asked.recording {
        // A recording's program is the one recorded: its optimizer and its kernels; only
        // checkpointing by layers is made of it (for a training step: inference has no backward
        // to recompute for), and, where its laws were fitted from shapes of two micro-batches, a
        // smaller micro-batch (no accumulation: that is the step's own).
        if estimate.job.checkpointing == Checkpointing::None && !rec.inference() {
            let set = |q: &mut TrainRequest, _| q.checkpointing = Checkpointing::Full;
            out.push(vec![Change::new(Lever::Checkpointing, "--checkpoint full".into(), set, 0)]);
        }
        if rec.grows_with(true, "").is_ok() {
            let halved = std::iter::successors(Some(r.micro_batch), |&b| (b > 1).then_some(b / 2)).skip(1);
            let set = |q: &mut TrainRequest, b| q.micro_batch = b;
            out.push(halved.map(|b| Change::new(Lever::MicroBatch, format!("--batch {b}"), set, b)).collect());
        }
        out.extend(expandable);
        return out;
    }
    out.push(checkpointing(estimate));
    let mut smaller = Vec::new();
    let mut b = r.micro_batch;
    while b > 1 {
        b = if b.is_multiple_of(2) { b / 2 } else { 1 };
        let accumulation = r.accumulation * (r.micro_batch / b);
        let flags = format!("--batch {b} --accumulation {accumulation}");
        smaller.push(Change::new(
            Lever::MicroBatch,
            flags,
            |q, b| {
                q.accumulation *= q.micro_batch / b;
                q.micro_batch = b;
            },
            b,
        ));
    }
    out.push(smaller);
    let attention = match job.attention {
        Attention::Eager => Some(Attention::Sdpa),
        Attention::Sdpa => Some(Attention::Flash),
        Attention::Flash => None,
    };
    if let Some(a) = attention {
        let set = if a == Attention::Sdpa {
            (|q: &mut TrainRequest, _| q.attention = Attention::Sdpa) as fn(&mut TrainRequest, u64)
        } else {
            |q: &mut TrainRequest, _| q.attention = Attention::Flash
        };
        out.push(vec![Change::new(Lever::Attention, format!("--attention {}", a.name()), set, 0)]);
    }
    if job.optimizer == Optimizer::AdamW && estimate.runner.optimizer_impl != OptimizerImpl::Fused {
        let set = |q: &mut TrainRequest, _| q.optimizer_impl = Some(OptimizerImpl::Fused);
        out.push(vec![Change::new(Lever::OptimizerImpl, "--optimizer-impl fused".into(), set, 0)]);
    }
    out.extend(expandable);
    out.push(adapters(asked));
    let gpus = r.gpus;
    out.push(
        (1..)
            .map(|k| gpus << k)
            .take_while(|&g| g <= gpus * MOST_GPUS_FACTOR)
            .map(|g| {
                let set = |q: &mut TrainRequest, g| {
                    q.gpus = g;
                    q.zero = Some(3);
                };
                Change::new(Lever::MoreGpus, format!("--gpus {g} --zero 3"), set, g)
            })
            .collect(),
    );
    out
}

/// Checkpointing that keeps less than the job's, cheapest first: selective (the attention
/// core recomputed) where the framework runs it, then every layer's.
fn checkpointing(estimate: &Estimate) -> Vec<Change> {
    let set_full = |q: &mut TrainRequest, _| q.checkpointing = Checkpointing::Full;
    let set_selective = |q: &mut TrainRequest, _| q.checkpointing = Checkpointing::Selective;
    let full = Change::new(Lever::Checkpointing, "--checkpoint full".into(), set_full, 0);
    let selective = Change::new(Lever::Checkpointing, "--checkpoint selective".into(), set_selective, 0);
    // transformers' code checkpoints whole layers or none.
    let transformers = estimate.runner.builder == "transformers";
    match estimate.job.checkpointing {
        Checkpointing::None if transformers => vec![full],
        Checkpointing::None => vec![selective, full],
        Checkpointing::Full => Vec::new(),
        _ => vec![full],
    }
}

/// Adapters over a frozen base where the job fine-tunes: LoRA, then QLoRA as peft sets it up by
/// default — with gradient checkpointing, which `prepare_model_for_kbit_training` turns on
/// unless told not to.
fn adapters(asked: &Asked) -> Vec<Change> {
    let lora = |q: &mut TrainRequest, _| q.finetune = FinetuneMode::Lora;
    let qlora = |q: &mut TrainRequest, _| {
        q.finetune = FinetuneMode::Qlora;
        q.base_weights = None;
        if q.checkpointing == Checkpointing::None {
            q.checkpointing = Checkpointing::Full;
        }
    };
    let qlora_flags = if asked.request.checkpointing == Checkpointing::None {
        "--finetune qlora --checkpoint full"
    } else {
        "--finetune qlora"
    };
    let lora = Change::new(Lever::Adapters, "--finetune lora".into(), lora, 0);
    let qlora = Change::new(Lever::Adapters, qlora_flags.into(), qlora, 0);
    match asked.request.finetune {
        FinetuneMode::Full if asked.fine_tuning => vec![lora, qlora],
        FinetuneMode::Lora if asked.request.base_weights.is_none() => vec![qlora],
        _ => Vec::new(),
    }
}

/// The allocator's cache, where it holds far more than the job allocates, and what
/// `expandable_segments:True` reserves instead.
#[derive(Clone, Debug)]
pub struct CacheSaving {
    pub allocated_bytes: f64,
    pub reserved_bytes: f64,
    /// Reserved and allocated under expandable segments.
    pub expandable: Estimate,
}

/// Reserved memory beyond allocated that is worth a note: a quarter of allocated, and 1 GiB.
const CACHE_WORTH_NAMING: f64 = 0.25;
const CACHE_LEAST_BYTES: f64 = (1u64 << 30) as f64;

/// Where a job that fits reserves far more than it allocates (and does not run with
/// expandable segments already): the job replayed under `expandable_segments:True`.
pub fn cache_saving(job: &Job, estimator: &Estimator, estimate: &Estimate) -> Option<CacheSaving> {
    let m = &estimate.memory;
    let cache = m.reserved_bytes - m.allocated_bytes;
    if !estimate.verdict.fits
        || estimator.alloc.expandable_segments
        || cache < CACHE_LEAST_BYTES
        || cache < CACHE_WORTH_NAMING * m.allocated_bytes
    {
        return None;
    }
    let alloc = AllocatorConfig::parse("expandable_segments:True").ok()?;
    let expandable = Estimator { alloc, ..estimator.clone() }.estimate(job).ok()?;
    Some(CacheSaving { allocated_bytes: m.allocated_bytes, reserved_bytes: m.reserved_bytes, expandable })
}

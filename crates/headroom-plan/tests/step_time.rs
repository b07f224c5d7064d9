//! The planner's step time against training steps timed on a real GPU: the dev grid of
//! `../shared/gpu/` (36 jobs on an H200 with torch 2.11: llama-1b, qwen2-0.5b and
//! gpt2-medium built from their configs, × 1×512 and 4×2048 × bf16, fp32 and AMP × no and
//! full checkpointing, SDPA, `torch.optim.AdamW` at torch's defaults; `step_s` is the mean
//! of steps 2 and 3, synchronized before and after).
//!
//! The split between the rows the step-time model's constants were fitted on and the rows
//! only compared was fixed before anything was fitted: the tuning rows are the twelve bf16
//! jobs (three families, both shapes, with and without checkpointing), where the launch
//! rate and the checkpoint hooks' cost show alone; every fp32 and AMP job is a check — they
//! run other kernels (autocast's copies, fp32 matrix multiplies, the math path of SDPA for
//! grouped heads in fp32, an fp32 optimizer) that nothing was fitted to.
//!
//! Figures to reach, the issue's, set before comparing: within ±15% on at least 30 of the
//! 36 jobs, none off by more than 1.5× either way.

/// The rows the constants were fitted on.
const TUNING: &[&str] = &[
    "llama-1b-train-bf16-none-sdpa-1x512",
    "llama-1b-train-bf16-full-sdpa-1x512",
    "llama-1b-train-bf16-none-sdpa-4x2048",
    "llama-1b-train-bf16-full-sdpa-4x2048",
    "qwen2-0.5b-train-bf16-none-sdpa-1x512",
    "qwen2-0.5b-train-bf16-full-sdpa-1x512",
    "qwen2-0.5b-train-bf16-none-sdpa-4x2048",
    "qwen2-0.5b-train-bf16-full-sdpa-4x2048",
    "gpt2-medium-train-bf16-none-sdpa-1x512",
    "gpt2-medium-train-bf16-full-sdpa-1x512",
    "gpt2-medium-train-bf16-none-sdpa-4x2048",
    "gpt2-medium-train-bf16-full-sdpa-4x2048",
];
/// ±15%, on at least this many of the 36 jobs.
const TOLERANCE: f64 = 0.15;
const WITHIN: usize = 30;
/// No job planned more than this many times too fast or too slow.
const WORST_RATIO: f64 = 1.5;

//! `headroom kv simulate`: a serving workload run step by step with the paged
//! KV-cache manager, and again with contiguous per-request reservation.

use crate::progress::LazyBar;
use crate::target_arg::Target;
use crate::Outcome;
use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use headroom_alloc::units::format_size;
use headroom_kv::dist::{LengthDist, Role};
use headroom_kv::sim::{
    kv_budget, simulate_contiguous, simulate_paged, KvBudget, NoRoom, RunReport, SimConfig, Workload,
};
use serde_json::{json, Value};

#[derive(Args, Debug)]
pub struct KvArgs {
    #[command(subcommand)]
    command: KvCommand,
}

#[derive(Subcommand, Debug)]
enum KvCommand {
    Simulate(SimulateArgs),
}

/// Simulate LLM serving with continuous batching: how many requests run at
/// once, how well the KV cache is used, how often requests are preempted,
/// how much the prefix cache saves, and the throughput — with headroom's
/// paged block manager (vLLM v1 semantics) and with contiguous per-request
/// reservation, on the same workload.
///
/// The KV cache gets what the GPU's memory leaves after the bf16 weights, an
/// activation estimate and the CUDA context, at --gpu-memory-utilization.
/// Step times come from a roofline (FLOPs and bytes against the GPU's peaks).
///
/// Length distributions: N or fixed:N, uniform:A-B, normal:MEAN,STD, or
/// sharegpt (log-normal with ShareGPT's mean lengths: 161 prompt, 338 output
/// tokens). As vLLM does, a prompt of --max-model-len tokens or more is
/// rejected, and an output stops where the sequence reaches --max-model-len;
/// both are counted in the output.
///
/// Exit status: 0 when the model serves, 1 when it does not fit (no room for
/// a KV cache, or less than one --max-model-len request), 2 on bad input.
#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  headroom kv simulate --model llama-2-13b --gpu a100-40gb --prompt-len sharegpt --output-len sharegpt\n  \
                        headroom kv simulate --model llama-3-8b --gpu h100-sxm --requests 2000 --shared-prefix 1024:0.8 --json"
)]
pub struct SimulateArgs {
    #[command(flatten)]
    target: Target,
    /// Fraction of GPU memory the server may use.
    #[arg(long, default_value_t = 0.9)]
    gpu_memory_utilization: f64,
    /// Number of requests, all arriving at the start.
    #[arg(long, default_value_t = 1000)]
    requests: usize,
    /// Prompt length distribution.
    #[arg(long, default_value = "sharegpt", value_name = "DIST")]
    prompt_len: String,
    /// Output length distribution.
    #[arg(long, default_value = "sharegpt", value_name = "DIST")]
    output_len: String,
    /// A shared prompt prefix: TOKENS tokens at the start of a FRACTION of the requests.
    #[arg(long, value_name = "TOKENS:FRACTION")]
    shared_prefix: Option<String>,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// Token budget of one step (prefill chunks and decodes together).
    #[arg(long, default_value_t = 8192)]
    max_batched_tokens: usize,
    /// Most requests running at once.
    #[arg(long, default_value_t = 256)]
    max_num_seqs: usize,
    /// Longest sequence served (the contiguous baseline reserves this much per request);
    /// default: the model's context, capped at 4096.
    #[arg(long)]
    max_model_len: Option<usize>,
    /// Turn prefix caching off.
    #[arg(long)]
    no_prefix_caching: bool,
    /// Use exactly this many KV blocks instead of sizing from memory.
    #[arg(long)]
    num_gpu_blocks: Option<u32>,
    /// Seed of the workload.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

pub fn run(args: KvArgs) -> Result<Outcome> {
    match args.command {
        KvCommand::Simulate(a) => simulate(a),
    }
}

fn simulate(a: SimulateArgs) -> Result<Outcome> {
    let (model, gpu) = a.target.resolve()?;
    if !model.generates() {
        bail!("{} is an encoder: it keeps no KV cache and generates no tokens to serve", model.name);
    }
    if !(a.gpu_memory_utilization > 0.0 && a.gpu_memory_utilization <= 1.0) {
        bail!("--gpu-memory-utilization must be in (0, 1], got {}", a.gpu_memory_utilization);
    }
    if a.block_size == 0 || a.max_batched_tokens == 0 || a.max_num_seqs == 0 || a.requests == 0 {
        bail!("--block-size, --max-batched-tokens, --max-num-seqs and --requests must be positive");
    }
    if a.num_gpu_blocks == Some(0) {
        bail!("--num-gpu-blocks must be positive");
    }
    let context = usize::try_from(model.max_position).unwrap_or(usize::MAX);
    let max_model_len = match a.max_model_len {
        // vLLM refuses a max_model_len beyond the model's context ("User-specified max_model_len … is greater than the derived").
        Some(n) if n > context => {
            bail!("--max-model-len {n} is more than {}'s context of {context} tokens (vLLM refuses it too)", model.name)
        }
        Some(n) => n,
        None => context.min(4096),
    };
    if max_model_len < 2 {
        bail!("--max-model-len must be at least 2");
    }
    let shared_prefix = match &a.shared_prefix {
        None => None,
        Some(s) => {
            let (t, f) = s.split_once(':').ok_or_else(|| anyhow!("--shared-prefix {s:?}: expected TOKENS:FRACTION"))?;
            let tokens: usize = t.trim().parse().with_context(|| format!("--shared-prefix {s:?}: TOKENS"))?;
            let fraction: f64 = f.trim().parse().with_context(|| format!("--shared-prefix {s:?}: FRACTION"))?;
            if !(0.0..=1.0).contains(&fraction) {
                bail!("--shared-prefix {s:?}: FRACTION must be in [0, 1]");
            }
            if tokens >= max_model_len {
                bail!(
                    "--shared-prefix {s:?}: a prefix of {tokens} tokens leaves no room in a prompt of at most \
                     max_model_len − 1 = {} tokens",
                    max_model_len - 1
                );
            }
            Some((tokens, fraction))
        }
    };
    let cfg = SimConfig {
        model,
        gpu,
        gpu_memory_utilization: a.gpu_memory_utilization,
        num_requests: a.requests,
        prompt_len: LengthDist::parse(&a.prompt_len, Role::Prompt).map_err(|e| anyhow!("--prompt-len: {e}"))?,
        output_len: LengthDist::parse(&a.output_len, Role::Output).map_err(|e| anyhow!("--output-len: {e}"))?,
        shared_prefix,
        block_size: a.block_size,
        max_batched_tokens: a.max_batched_tokens,
        max_num_seqs: a.max_num_seqs,
        max_model_len,
        enable_caching: !a.no_prefix_caching,
        num_gpu_blocks: a.num_gpu_blocks,
        seed: a.seed,
    };
    let mut out = String::new();
    let budget = match kv_budget(&cfg) {
        Ok(b) => b,
        Err(NoRoom(why)) => {
            if a.json {
                let v = json!({ "model": cfg.model.name, "gpu": cfg.gpu.name, "fits": false, "reason": why });
                outln!(out, "{}", serde_json::to_string_pretty(&v)?);
            } else {
                outln!(out, "does NOT fit: {why}");
            }
            return Ok(Outcome::new(out, 1));
        }
    };
    let total = a.requests as u64;
    let mut bar = LazyBar::new("requests");
    let mut w = Workload::new(&cfg);
    let paged = simulate_paged(&cfg, &budget, &mut w, &mut |done| bar.update("paged", done as u64, total))
        .map_err(|e| anyhow!("paged: {e}"))?;
    let contiguous = simulate_contiguous(&cfg, &budget, Workload::lengths_only(&cfg), &mut |done| {
        bar.update("contiguous", done as u64, total)
    })
    .map_err(|e| anyhow!("contiguous: {e}"))?;
    bar.finish();
    let served = w.drawn() - w.rejected;
    if a.json {
        let v = json!({
            "model": cfg.model.name,
            "gpu": cfg.gpu.name,
            "fits": true,
            "requests": served,
            "rejected_requests": w.rejected,
            "capped_requests": w.capped,
            "max_model_len": cfg.max_model_len,
            "block_size": cfg.block_size,
            "kv_cache": budget_json(&budget, cfg.block_size),
            "paged": report_json(&paged),
            "contiguous": report_json(&contiguous),
        });
        outln!(out, "{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_human(&mut out, &cfg, &budget, (served, w.rejected, w.capped), &paged, &contiguous);
    }
    Ok(Outcome::new(out, 0))
}

fn budget_json(b: &KvBudget, block_size: usize) -> Value {
    json!({
        "usable_bytes": b.usable_bytes,
        "weight_bytes": b.weight_bytes,
        "activation_bytes": b.activation_bytes,
        "overhead_bytes": b.overhead_bytes,
        "kv_bytes": b.kv_bytes,
        "kv_bytes_per_token": b.kv_bytes_per_token,
        "num_blocks": b.num_blocks,
        "token_slots": b.num_blocks as u64 * block_size as u64,
    })
}

fn report_json(r: &RunReport) -> Value {
    json!({
        "finished": r.finished,
        "steps": r.steps,
        "peak_running": r.peak_running,
        "mean_running": r.mean_running,
        "kv_utilization": r.kv_utilization,
        "preemptions": r.preemptions,
        "prefix_hit_rate": r.prefix_hit_rate,
        "preempted_prefix_hit_rate": r.preempted_prefix_hit_rate,
        "prefix_cache_evictions": r.prefix_cache_evictions,
        "output_tokens": r.output_tokens,
        "elapsed_s": r.elapsed_s,
        "throughput_tokens_per_s": r.throughput_tokens_per_s,
        "requests_per_s": r.requests_per_s,
    })
}

fn print_human(
    out: &mut String,
    cfg: &SimConfig,
    b: &KvBudget,
    (n, rejected, capped): (usize, usize, usize),
    p: &RunReport,
    c: &RunReport,
) {
    outln!(
        out,
        "{} on {}: {} requests, prompts {}, outputs {}{}",
        cfg.model.name,
        cfg.gpu.name,
        n,
        cfg.prompt_len,
        cfg.output_len,
        match cfg.shared_prefix {
            Some((t, f)) => format!(", {t}-token prefix shared by {:.0}%", f * 100.0),
            None => String::new(),
        }
    );
    if rejected > 0 {
        outln!(
            out,
            "{rejected} requests rejected: their prompts reach max_model_len = {} tokens (vLLM rejects them too)",
            cfg.max_model_len
        );
    }
    if capped > 0 {
        outln!(out, "{capped} outputs stop early, where the sequence reaches max_model_len (as vLLM stops them)");
    }
    outln!(
        out,
        "KV cache: {} = {} blocks of {} tokens ({} per token); weights {}, activations {}, context {}",
        format_size(b.kv_bytes),
        b.num_blocks,
        cfg.block_size,
        format_size(b.kv_bytes_per_token),
        format_size(b.weight_bytes),
        format_size(b.activation_bytes),
        format_size(b.overhead_bytes)
    );
    outln!(out);
    outln!(out, "{:<26} {:>14} {:>22}", "", "paged", format!("contiguous ({} each)", cfg.max_model_len));
    let mut row = |name: &str, x: String, y: String| outln!(out, "{name:<26} {x:>14} {y:>22}");
    row("peak running requests", p.peak_running.to_string(), c.peak_running.to_string());
    row("mean running requests", format!("{:.1}", p.mean_running), format!("{:.1}", c.mean_running));
    row("KV utilization", pct(p.kv_utilization), pct(c.kv_utilization));
    row("preemptions", p.preemptions.to_string(), c.preemptions.to_string());
    row("prefix cache hit rate", pct(p.prefix_hit_rate), "-".to_string());
    if p.preemptions > 0 {
        row("  after preemption", pct(p.preempted_prefix_hit_rate), "-".to_string());
    }
    row(
        "throughput (tokens/s)",
        format!("{:.0}", p.throughput_tokens_per_s),
        format!("{:.0}", c.throughput_tokens_per_s),
    );
    row("requests/s", format!("{:.2}", p.requests_per_s), format!("{:.2}", c.requests_per_s));
    row("time (s, estimated)", format!("{:.1}", p.elapsed_s), format!("{:.1}", c.elapsed_s));
    if c.throughput_tokens_per_s > 0.0 {
        outln!(out);
        outln!(
            out,
            "paged serves {:.2}x the throughput of contiguous reservation",
            p.throughput_tokens_per_s / c.throughput_tokens_per_s
        );
    }
}

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

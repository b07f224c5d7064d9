//! `headroom checkpoint`: the fastest activation-checkpointing schedule of a
//! chain of layers within a memory budget, against the usual baselines.

use crate::progress::LazyBar;
use crate::Outcome;
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use headroom_alloc::units::{format_size, parse_size};
use headroom_plan::checkpoint::{baseline, format_ops, simulate, solve_with_progress, Baseline, Chain, SolveError};
use serde_json::{json, Value};
use std::path::PathBuf;

/// Find the fastest activation-checkpointing schedule of a chain of layers
/// that fits a memory budget (the dynamic program of Beaumont et al., "rotor",
/// for heterogeneous chains), and compare it with storing everything,
/// recomputing every layer, checkpointing every √n or every k layers, and
/// Chen et al.'s greedy plan.
///
/// The chain is JSON:
///
///   {"input_bytes": 4194304,
///    "stages": [{"name": "block0", "forward_time": 1.0, "backward_time": 2.0,
///                "output_bytes": 4194304, "saved_bytes": 33554432,
///                "forward_tmp_bytes": 0, "backward_tmp_bytes": 0}, ...],
///    "loss": {"forward_time": 0.1, "backward_time": 0.1}}
///
/// saved_bytes is what the backward needs when the forward keeps everything
/// (it includes the output). Times are in any unit. Memory is discretised
/// into --slots units (sizes rounded up), so the schedule fits in bytes.
///
/// Exit status: 0 with a schedule, 1 when nothing fits (the least budget that
/// fits at --slots is printed, or why none does), 2 on bad input (a chain
/// whose table would pass 2 GiB included: the message says which --slots fit).
#[derive(Args, Debug)]
#[command(after_help = "Example:\n  headroom checkpoint data/chains/gpt2-small-layers.json --budget 1.5GiB")]
pub struct CheckpointArgs {
    /// The chain (JSON).
    chain: PathBuf,
    /// Memory budget for activations, input and gradients: bytes, or e.g. 1.5GiB.
    #[arg(long, value_name = "BYTES")]
    budget: String,
    /// Memory slots of the dynamic program. Finer is slower: time and memory
    /// grow linearly with slots (the table takes stages² / 2 × slots × 4
    /// bytes, at most 2 GiB), and time with the cube of the stages.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..))]
    slots: u32,
    /// Print the schedule, operation by operation.
    #[arg(long)]
    schedule: bool,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

pub fn run(args: CheckpointArgs) -> Result<Outcome> {
    if args.chain.is_dir() {
        bail!("{} is a directory; give a chain file (JSON)", args.chain.display());
    }
    let text = std::fs::read(&args.chain).with_context(|| format!("reading {}", args.chain.display()))?;
    let text = String::from_utf8(text).map_err(|e| {
        anyhow!("reading {}: not UTF-8 text (byte {} is not)", args.chain.display(), e.utf8_error().valid_up_to() + 1)
    })?;
    let chain = Chain::from_json(&text).with_context(|| format!("reading {}", args.chain.display()))?;
    let budget = parse_size(&args.budget).map_err(|e| anyhow!("--budget: {e}"))?;
    if budget == 0 {
        bail!("--budget must be positive");
    }
    let store_all = simulate(&chain, &baseline(&chain, Baseline::StoreAll, budget).ops(), None)
        .map_err(|e| anyhow!("store-all schedule: {e}"))?;
    let baselines: Vec<(String, f64, u64)> =
        [Baseline::StoreAll, Baseline::FullRecompute, Baseline::SqrtN, Baseline::EveryK(2), Baseline::ChenGreedy]
            .iter()
            .filter_map(|&b| {
                let o = simulate(&chain, &baseline(&chain, b, budget).ops(), None).ok()?;
                Some((b.name(), o.time, o.peak))
            })
            .collect();
    let mut bar = LazyBar::new("");
    let solved =
        solve_with_progress(&chain, budget, args.slots, &mut |phase, done, total| bar.update(phase, done, total));
    bar.finish();
    let mut out = String::new();
    let plan = match solved {
        Ok(p) => p,
        Err(SolveError::Infeasible { least, least_bytes, .. }) => {
            if args.json {
                let v = json!({
                    "fits": false,
                    "budget_bytes": budget,
                    "slots": args.slots,
                    "least_feasible_budget_bytes": least,
                    "least_budget_unrounded_bytes": (least_bytes != u64::MAX).then_some(least_bytes),
                });
                outln!(out, "{}", serde_json::to_string_pretty(&v)?);
            } else {
                let why = match least {
                    Some(l) => format!("the least budget that fits at {} slots is {}", args.slots, size_and_bytes(l)),
                    None if least_bytes == u64::MAX => "the chain needs more than 2^64 bytes".to_string(),
                    None => format!(
                        "at {} slots none does: sizes rounded up to whole slots take more slots than there are \
                         (use more --slots; without rounding the least budget is {} bytes)",
                        args.slots, least_bytes
                    ),
                };
                outln!(out, "no schedule of {} fits in {}; {why}", args.chain.display(), size_and_bytes(budget));
            }
            return Ok(Outcome::new(out, 1));
        }
        Err(e) => return Err(e.into()),
    };
    let o = plan.outcome;
    if args.json {
        let v = json!({
            "fits": true,
            "budget_bytes": budget,
            "slots": args.slots,
            "stages": chain.stages.len(),
            "time": o.time,
            "peak_bytes": o.peak,
            "recomputations": o.recomputations,
            "store_all_time": store_all.time,
            "store_all_peak_bytes": store_all.peak,
            "overhead": o.time / store_all.time - 1.0,
            "schedule": plan.ops.iter().map(|op| op.to_string()).collect::<Vec<_>>(),
            "baselines": baselines.iter().map(|(n, t, p)| json!({"name": n, "time": t, "peak_bytes": p, "fits": *p <= budget})).collect::<Vec<Value>>(),
        });
        outln!(out, "{}", serde_json::to_string_pretty(&v)?);
        return Ok(Outcome::new(out, 0));
    }
    outln!(
        out,
        "{}: {} stages, budget {} ({} slots of {})",
        args.chain.display(),
        chain.stages.len(),
        format_size(budget),
        args.slots,
        format_size((budget / args.slots as u64).max(1))
    );
    outln!(
        out,
        "optimal: time {:.4} ({:+.1}% over storing everything), peak {}, {} forward recomputations",
        o.time,
        (o.time / store_all.time - 1.0) * 100.0,
        format_size(o.peak),
        o.recomputations
    );
    outln!(out);
    outln!(out, "{:<26} {:>12} {:>12}  fits", "strategy", "time", "peak");
    outln!(out, "{:<26} {:>12.4} {:>12}  yes", "optimal", o.time, format_size(o.peak));
    for (name, t, p) in &baselines {
        outln!(out, "{:<26} {:>12.4} {:>12}  {}", name, t, format_size(*p), if *p <= budget { "yes" } else { "no" });
    }
    if args.schedule {
        outln!(out);
        outln!(out, "{}", format_ops(&plan.ops));
    }
    Ok(Outcome::new(out, 0))
}

/// `1.50 GiB (1610612736 bytes)`, or `512 bytes` where that says it all.
fn size_and_bytes(b: u64) -> String {
    let s = format_size(b);
    if s.ends_with("bytes") {
        s
    } else {
        format!("{s} ({b} bytes)")
    }
}

//! `headroom checkpoint`: the fastest activation-checkpointing schedule of a
//! chain of layers within a memory budget, against the usual baselines.

use crate::bytes_arg::parse_bytes;
use anyhow::{anyhow, Context, Result};
use clap::Args;
use headroom_alloc::units::format_size;
use headroom_plan::checkpoint::{baseline, format_ops, simulate, solve, Baseline, Chain, SolveError};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::ExitCode;

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
/// fits is printed), 2 on bad input.
#[derive(Args, Debug)]
#[command(after_help = "Example:\n  headroom checkpoint data/chains/gpt2-small-layers.json --budget 1.5GiB")]
pub struct CheckpointArgs {
    /// The chain (JSON).
    chain: PathBuf,
    /// Memory budget for activations, input and gradients: bytes, or e.g. 1.5GiB.
    #[arg(long, value_name = "BYTES")]
    budget: String,
    /// Memory slots of the dynamic program (finer is slower: time grows linearly).
    #[arg(long, default_value_t = 500)]
    slots: u32,
    /// Print the schedule, operation by operation.
    #[arg(long)]
    schedule: bool,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

pub fn run(args: CheckpointArgs) -> Result<ExitCode> {
    let text = std::fs::read_to_string(&args.chain).with_context(|| format!("reading {}", args.chain.display()))?;
    let chain = Chain::from_json(&text).with_context(|| format!("reading {}", args.chain.display()))?;
    let budget = parse_bytes(&args.budget).context("--budget")?;
    if args.slots == 0 {
        anyhow::bail!("--slots must be positive");
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
    let plan = match solve(&chain, budget, args.slots) {
        Ok(p) => p,
        Err(SolveError::Infeasible { least, .. }) => {
            let msg = format!(
                "no schedule of {} fits in {} ({budget} bytes); the least budget that fits is {} ({least} bytes) at {} slots",
                args.chain.display(),
                format_size(budget),
                format_size(least),
                args.slots
            );
            if args.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(
                        &json!({"fits": false, "budget_bytes": budget, "least_feasible_budget_bytes": least})
                    )?
                );
            } else {
                println!("{msg}");
            }
            return Ok(ExitCode::from(1));
        }
        Err(e) => return Err(e.into()),
    };
    let o = plan.outcome;
    if args.json {
        let out = json!({
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
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{}: {} stages, budget {} ({} slots of {})",
        args.chain.display(),
        chain.stages.len(),
        format_size(budget),
        args.slots,
        format_size(budget.div_ceil(args.slots as u64))
    );
    println!(
        "optimal: time {:.4} ({:+.1}% over storing everything), peak {}, {} forward recomputations",
        o.time,
        (o.time / store_all.time - 1.0) * 100.0,
        format_size(o.peak),
        o.recomputations
    );
    println!();
    println!("{:<26} {:>12} {:>12}  fits", "strategy", "time", "peak");
    println!("{:<26} {:>12.4} {:>12}  yes", "optimal", o.time, format_size(o.peak));
    for (name, t, p) in &baselines {
        println!("{:<26} {:>12.4} {:>12}  {}", name, t, format_size(*p), if *p <= budget { "yes" } else { "no" });
    }
    if args.schedule {
        println!();
        println!("{}", format_ops(&plan.ops));
    }
    Ok(ExitCode::SUCCESS)
}

//! The `headroom` command: parses arguments and hands each subcommand to the
//! library crates; no allocator logic lives here.

mod bytes_arg;
mod checkpoint_cmd;
mod kv_cmd;
mod plan_cmd;
mod replay_cmd;
mod target_arg;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// GPU memory management for deep learning: measured answers instead of folklore.
#[derive(Parser, Debug)]
#[command(name = "headroom", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Will it fit? Memory per GPU, term by term, for training or inference.
    Plan(plan_cmd::PlanArgs),
    Replay(replay_cmd::ReplayArgs),
    /// Paged KV cache for LLM serving: capacity and throughput answers.
    Kv(kv_cmd::KvArgs),
    /// The fastest activation-checkpointing schedule within a memory budget.
    Checkpoint(checkpoint_cmd::CheckpointArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Plan(args) => plan_cmd::run(args),
        Command::Replay(args) => replay_cmd::run(args),
        Command::Kv(args) => kv_cmd::run(args),
        Command::Checkpoint(args) => checkpoint_cmd::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

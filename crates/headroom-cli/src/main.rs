//! The `headroom` command: parses arguments and hands each subcommand to the
//! library crates; no allocator logic lives here.
//!
//! Each command returns what it has to say as an [`Outcome`] and writes
//! nothing itself: standard output is written in one place, where a reader
//! that went away (`headroom … | head -1`) ends the command quietly with the
//! status it earned, and a full disk is an error rather than a panic.

// `plan --json`'s object has more keys than serde_json's macro expands by default.
#![recursion_limit = "256"]

/// Appends a line to a `String` (as `println!` prints one).
macro_rules! outln {
    ($out:expr) => {
        $out.push('\n')
    };
    ($out:expr, $($arg:tt)*) => {{
        use std::fmt::Write as _;
        // Writing into a String cannot fail.
        let _ = writeln!($out, $($arg)*);
    }};
}

mod checkpoint_cmd;
mod inspect_cmd;
mod kv_cmd;
mod named_arg;
mod out_file;
mod plan_cmd;
mod progress;
mod replay_args;
mod replay_cmd;
mod replay_cuda;
mod replay_snapshot;
mod shell_cmd;
mod target_arg;

use clap::{Parser, Subcommand};
use std::io::{self, Write};
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
    Plan(Box<plan_cmd::PlanArgs>),
    Replay(replay_args::ReplayArgs),
    Inspect(inspect_cmd::InspectArgs),
    /// Paged KV cache for LLM serving: capacity and throughput answers.
    Kv(kv_cmd::KvArgs),
    /// The fastest activation-checkpointing schedule within a memory budget.
    Checkpoint(checkpoint_cmd::CheckpointArgs),
    /// Print a completion script for bash, zsh, fish, elvish or powershell.
    Completions(shell_cmd::CompletionsArgs),
    /// Print the man page (roff).
    Man(shell_cmd::ManArgs),
}

/// What a command prints on standard output, and its exit status.
pub struct Outcome {
    pub stdout: String,
    pub code: u8,
}

impl Outcome {
    pub fn new(stdout: String, code: u8) -> Outcome {
        Outcome { stdout, code }
    }
}

fn main() -> ExitCode {
    out_file::fail_writes_past_the_size_limit();
    let cli = Cli::parse();
    out_file::remove_partial_on_interrupt();
    let result = match cli.command {
        Command::Plan(args) => plan_cmd::run(*args),
        Command::Replay(args) => replay_cmd::run(args),
        Command::Inspect(args) => inspect_cmd::run(args),
        Command::Kv(args) => kv_cmd::run(args),
        Command::Checkpoint(args) => checkpoint_cmd::run(args),
        Command::Completions(args) => shell_cmd::completions(args),
        Command::Man(args) => shell_cmd::man(args),
    };
    match result {
        Ok(outcome) => ExitCode::from(write_stdout(outcome)),
        Err(e) => {
            eprint_error(&e);
            ExitCode::from(2)
        }
    }
}

/// Writes the command's output; returns the exit status.
fn write_stdout(o: Outcome) -> u8 {
    let mut stdout = io::stdout().lock();
    match stdout.write_all(o.stdout.as_bytes()).and_then(|()| stdout.flush()) {
        Ok(()) => o.code,
        // The reader has what it wanted (`| head`); the answer stands.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => o.code,
        Err(e) => {
            let _ = writeln!(io::stderr(), "error: writing the output: {e}");
            2
        }
    }
}

/// `error: outer: cause: cause`, leaving out a cause whose text the message
/// before it already carries (errors that print their source as well as
/// returning it would otherwise repeat it).
fn eprint_error(e: &anyhow::Error) {
    let mut text = String::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if text.contains(&s) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&s);
    }
    let _ = writeln!(io::stderr(), "error: {text}");
}

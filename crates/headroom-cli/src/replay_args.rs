//! `headroom replay`'s arguments, shared by the trace replay
//! (`replay_cmd.rs`) and the snapshot replay (`replay_snapshot.rs`).

use clap::Args;
use headroom_alloc::PolicyName;
use std::path::PathBuf;

/// Replay a recorded run through headroom's caching allocator (PyTorch's
/// policy, or headroom's own with --policy) on a simulated GPU, and report
/// peak memory, fragmentation, device calls and OOMs — under the recorded
/// settings or any others.
///
/// The input is either a PyTorch memory snapshot (the file
/// `torch.cuda.memory._dump_snapshot()` writes, pickle or JSON) or a
/// headroom trace in JSON Lines (see docs/TRACE_FORMAT.md), either of them
/// gzip-compressed or not:
///
///   {"op":"alloc","id":1,"size":4096,"stream":0}
///   {"op":"free","id":1}
///
/// A snapshot's trace usually starts mid-run; headroom rebuilds the
/// allocator's state at its first entry from the final segments, then
/// replays every request and free. --check compares each decision with the
/// recorded one (addresses, segments allocated and released, final blocks).
/// Without --alloc-conf a snapshot is replayed under its recorded settings,
/// and that replay is the recorded run: the simulated device hands out the
/// recorded segment addresses and refuses where the recorded device refused,
/// the program's empty_cache() calls are made where it made them, and the
/// device is the size the recording tells (held plus free at an OOM; a
/// per-process memory limit when the device had room the request was refused
/// all the same). Every other setting is replayed the same way and differs
/// only by what it changes.
///
/// Give --alloc-conf several times to compare settings side by side, and
/// --policy to compare allocation policies: `pytorch` (the default,
/// PyTorch's decisions), `expandable` (expandable segments for every pool),
/// `headroom` (expandable segments' growth and device calls, and whole free
/// pages of the request's own pool given back where they replace growth past
/// the peak), `tight` (every free page given back before the peak grows: the
/// lowest peak, for device calls every step). A snapshot replayed under --policy starts from
/// an empty device (--start fresh): each policy places the blocks live when
/// the trace began itself, and the table shows each run's peak reserved
/// against the peak of live bytes, which no allocator can go below. Each
/// run also shows its device calls' time on a GPU (published per-call costs;
/// docs/PERFORMANCE.md) and, for a training run of more than two steps (told
/// apart by the optimizer's frames), its device calls after the second step.
///
/// --backend cuda runs the same requests through the allocator on a real
/// GPU instead (real device calls; the host time each operation took),
/// from an empty device; without an NVIDIA driver it says so and exits 2.
///
/// Exit status: 0 when every allocation succeeded (and, with --check, every
/// decision matched), 1 when some ran out of memory (or a decision
/// differed), 2 on bad input.
#[derive(Args, Debug)]
#[command(after_help = "Examples (from the repository's root; the files ship in data/):\n  \
                  headroom replay data/traces/gpt2-small-train.jsonl\n  \
                  headroom replay data/snapshots/qwen3-1.7b-train.pickle.gz --check\n  \
                  headroom replay data/snapshots/qwen3-1.7b-train.pickle.gz --alloc-conf '' --alloc-conf expandable_segments:True --capacity 16.25GiB\n  \
                  headroom replay data/snapshots/qwen3-1.7b-train.pickle.gz --policy pytorch --policy expandable --policy headroom\n  \
                  headroom replay data/traces/gpt2-small-train.jsonl --capacity 4GiB --json\n  \
                  headroom replay data/traces/gpt2-small-train.jsonl --snapshot-out snap.pickle   # open at pytorch.org/memory_viz")]
pub struct ReplayArgs {
    /// The run to replay: a PyTorch snapshot (.pickle or JSON) or a JSONL trace.
    pub trace: PathBuf,

    /// Allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax, e.g.
    /// "expandable_segments:True,max_split_size_mb:128". Repeat to compare.
    #[arg(long = "alloc-conf", value_name = "STR")]
    pub alloc_conf: Vec<String>,

    /// Allocation policy: pytorch, expandable, headroom, tight, lifetime or planned.
    /// Repeat to compare; each runs under every --alloc-conf.
    #[arg(long = "policy", value_name = "NAME")]
    pub policy: Vec<PolicyName>,

    /// Snapshots: where the replay begins. `recorded`: in the segments the
    /// trace began with; `fresh`: from an empty device, the blocks live then
    /// allocated first by the policy under test. Default: fresh with
    /// --policy, recorded without.
    #[arg(long, value_name = "FROM", value_parser = ["recorded", "fresh"])]
    pub start: Option<String>,

    /// Memory of the simulated GPU: bytes, or with a unit (80GiB, 24GB) [default: a
    /// snapshot's recorded device, as its refusals and OOMs tell, else 80GiB].
    #[arg(long, value_name = "BYTES")]
    pub capacity: Option<String>,

    /// Where the allocator runs: `sim`, a simulated GPU of --capacity, or `cuda`, the real
    /// GPU --cuda-device (a snapshot's requests replayed from an empty device).
    #[arg(long, value_name = "NAME", default_value = "sim", value_parser = ["sim", "cuda"])]
    pub backend: String,

    /// With --backend cuda: the GPU, by CUDA ordinal.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub cuda_device: u32,

    /// Print one JSON object (an object with "runs" when comparing settings).
    #[arg(long)]
    pub json: bool,

    /// Snapshots: compare every decision with the recorded one, and report
    /// matched of total per kind with the first divergence.
    #[arg(long)]
    pub check: bool,

    /// Snapshots: replay only this device (default: every device).
    #[arg(long, value_name = "N")]
    pub device: Option<u32>,

    /// Write the final allocator snapshot, with the trace of allocator
    /// events, as a PyTorch pickle (or JSON if the name ends in .json).
    /// With several runs (--policy, --alloc-conf), the first one's. The file
    /// appears only once the whole replay succeeded.
    #[arg(long, value_name = "FILE")]
    pub snapshot_out: Option<PathBuf>,

    /// Trace entries the snapshot keeps: the most recent N, as PyTorch's
    /// `_record_memory_history(max_entries=N)` keeps them (memory grows
    /// with N, about 60 bytes an entry).
    #[arg(long, value_name = "N", default_value_t = 1_000_000, requires = "snapshot_out",
          value_parser = clap::value_parser!(u64).range(1..=1 << 32))]
    pub max_entries: u64,
}

/// The simulated GPU's memory when neither --capacity nor the recording says.
pub const DEFAULT_CAPACITY: u64 = 80 << 30;

//! `memory_summary()` against PyTorch's own formatting of the same statistics.
//!
//! Each case runs a workload, and its 122 statistics must equal the committed
//! `data/validation/memory_summary/<case>.stats.json`; PyTorch's
//! `torch.cuda.memory.memory_summary()` formatted those statistics into
//! `<case>.full.txt` and `<case>.abbreviated.txt`
//! (`python3 scripts/validate/memory_summary.py`), and headroom's text must equal
//! them character for character. `HEADROOM_REGENERATE=1` rewrites the statistics
//! (then rerun the script).

use headroom_alloc::units::{GIB, MIB};
use headroom_alloc::{AllocatorConfig, DeviceCachingAllocator, SimDevice};
use std::collections::BTreeMap;
use std::path::PathBuf;

type Alloc = DeviceCachingAllocator<SimDevice>;

/// The spec's worked example: a split large segment, a small one, one free.
fn worked_example() -> Alloc {
    let mut a = DeviceCachingAllocator::new(SimDevice::new(80 * GIB), AllocatorConfig::default());
    let b = a.malloc(3_000_000, 0).unwrap();
    a.malloc(100, 0).unwrap();
    a.free(b.ptr).unwrap();
    a
}

/// 900,000 allocations over two streams with oversize blocks, flushes and an OOM: counts in
/// the thousands (`K`), sizes in GiB, and the oversize rows.
fn long_run() -> Alloc {
    let cfg = AllocatorConfig::parse("max_split_size_mb:64").unwrap();
    let mut a = DeviceCachingAllocator::new(SimDevice::new(16 * GIB), cfg);
    let mut live = Vec::new();
    for i in 0..900_000u64 {
        let size = match i % 7 {
            0 => 200 * MIB + (i % 13) * MIB,
            1 | 2 => 3 * MIB + (i % 5) * 4096,
            _ => 512 + (i % 1000) * 256,
        };
        if let Ok(b) = a.malloc(size, i % 2) {
            live.push(b.ptr);
        }
        if live.len() > 40 {
            a.free(live.swap_remove((i as usize * 7919) % live.len())).unwrap();
        }
        if i % 100_000 == 0 {
            a.empty_cache().unwrap();
        }
    }
    let _ = a.malloc(15 * GIB, 0);
    a
}

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/validation/memory_summary")
}

#[test]
fn memory_summary_is_pytorchs_text_for_the_same_statistics() {
    let regenerate = std::env::var_os("HEADROOM_REGENERATE").is_some();
    for (case, a) in [("worked_example", worked_example()), ("long_run", long_run())] {
        let stats = a.memory_stats();
        let path = dir().join(format!("{case}.stats.json"));
        if regenerate {
            std::fs::write(&path, serde_json::to_string_pretty(&stats).unwrap() + "\n").unwrap();
            eprintln!("wrote {}; now run scripts/validate/memory_summary.py", path.display());
            continue;
        }
        let committed: BTreeMap<String, i64> = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(stats, committed, "{case}: the statistics changed; regenerate them and rerun the script");
        for (abbreviated, suffix) in [(false, "full"), (true, "abbreviated")] {
            let pytorch = std::fs::read_to_string(dir().join(format!("{case}.{suffix}.txt"))).unwrap();
            let ours = a.memory_summary(abbreviated);
            assert_eq!(ours, pytorch, "{case} ({suffix}):\nheadroom:\n{ours}\nPyTorch:\n{pytorch}");
        }
        eprintln!("{case}: {} statistics, both summaries equal PyTorch's", stats.len());
    }
}

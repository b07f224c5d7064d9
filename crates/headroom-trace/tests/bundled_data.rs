//! The bundled example trace is exactly what the generator produces, and it
//! replays without error. Regenerate with `HEADROOM_REGENERATE=1 cargo test -p headroom-trace --test bundled_data`.

use headroom_alloc::AllocatorConfig;
use headroom_trace::jsonl::{format_op, read_trace};
use headroom_trace::replay::{replay, ReplayOptions};
use headroom_trace::synth::TrainingLoop;
use std::path::PathBuf;

fn path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/traces/gpt2-small-train.jsonl")
}

fn generated() -> String {
    TrainingLoop::gpt2_small().ops().iter().map(|op| format_op(op) + "\n").collect()
}

#[test]
fn bundled_trace_matches_the_generator() {
    let text = generated();
    if std::env::var_os("HEADROOM_REGENERATE").is_some() {
        std::fs::write(path(), &text).unwrap();
    }
    let on_disk = std::fs::read_to_string(path()).expect("data/traces/gpt2-small-train.jsonl");
    assert!(on_disk == text, "the bundled trace differs from the generator; regenerate it (see the file's header)");
}

#[test]
fn bundled_trace_replays_cleanly_and_expandable_segments_waste_less() {
    let ops = read_trace(generated().as_bytes()).unwrap();
    let run = |conf: &str| {
        let opts = ReplayOptions {
            config: AllocatorConfig::parse(conf).unwrap(),
            capacity: 80 << 30,
            history: None,
            policy: headroom_alloc::PolicyName::PyTorch,
        };
        replay(&ops, &opts, |_| {}).unwrap().0
    };
    let native = run("");
    let expandable = run("expandable_segments:True");
    assert!(native.ooms.is_empty() && expandable.ooms.is_empty());
    // The same requests; expandable segments split large blocks finer (no 1 MiB slack) and reserve less.
    let requested = |r: &headroom_trace::replay::ReplayReport| r.stats["requested_bytes.all.peak"];
    assert_eq!(requested(&native), requested(&expandable));
    assert!(expandable.peak_allocated_bytes <= native.peak_allocated_bytes);
    assert!(expandable.peak_reserved_bytes < native.peak_reserved_bytes);
    // After the last step only weights, gradients and Adam state stay: 3 + 1 copies of 124 M fp32 parameters.
    let params = native.final_allocated_bytes / 4 / 4;
    assert!((124_000_000..126_000_000).contains(&params), "{params}");
}

//! The same step recorded at two or three shapes: each tensor's size law fitted from its
//! sizes ([`headroom_plan::recorded_laws`]), checked on synthetic recordings whose tensors
//! follow known laws, and on GPT-2's step as `python -m headroom_gpu record` recorded it at
//! three shapes (data/recordings/): a law fitted from two of them predicts the third.

use headroom_alloc::{AllocatorConfig, PolicyName};
use headroom_plan::program::Law;
use headroom_plan::recording::Recording;
use headroom_plan::replay::{replay, ReplaySettings};
use std::path::Path;

/// The laws of the synthetic step's tensors, by id: weights, an activation per token, the
/// shifted logits `b·(s − 1)·vocab·4`, eager attention's `b·h·s²`, a rotary table (`s`), a
/// causal mask (`s²`) and a per-sequence loss.
fn laws() -> Vec<(&'static str, Law)> {
    let v = 4.0 * 1000.0;
    vec![
        ("0 setup weights model.embed", Law::fixed(4096.0 * 1024.0)),
        ("1 step1.forward activations model.rotary", Law { per_position: 128.0, ..Law::default() }),
        ("2 step1.forward activations model.mask", Law { per_position_square: 1.0, ..Law::default() }),
        ("3 step1.forward activations model.layers.0.attn", Law { per_token_position: 2.0 * 12.0, ..Law::default() }),
        ("4 step1.forward activations model.layers.0.mlp", Law::per_token(2.0 * 3072.0) + Law::fixed(512.0)),
        ("5 step1.forward logits model.lm_head", Law::per_token(v) + Law { per_sequence: -v, ..Law::default() }),
        ("6 step1.backward gradients model.embed", Law::fixed(4096.0 * 1024.0)),
        ("7 step1.optimizer optimizer model.embed", Law { per_sequence: 4.0, ..Law::default() } + Law::fixed(8.0)),
    ]
}

/// The synthetic step at micro-batch `b` and sequence `s`, as the recorder writes it; `head`
/// writes the shape line.
fn recorded(b: u64, s: u64, head: bool) -> String {
    let mut out = String::new();
    if head {
        out += &format!("{{\"op\":\"shape\",\"batch\":{b},\"seq\":{s}}}\n");
    }
    let laws = laws();
    for (i, (id, law)) in laws.iter().enumerate() {
        out += &format!("{{\"op\":\"alloc\",\"id\":\"{id}\",\"size\":{}}}\n", law.bytes(b as f64, s as f64));
        if (1..=5).contains(&i) && i % 2 == 1 {
            out += &format!("{{\"op\":\"free\",\"id\":\"{id}\"}}\n");
        }
    }
    out
}

const SHAPES: [(u64, u64); 3] = [(1, 512), (2, 512), (1, 1024)];

fn fitted(shapes: &[(u64, u64)]) -> Recording {
    let files = shapes
        .iter()
        .map(|&(b, s)| Recording::parse(recorded(b, s, true).as_bytes(), &format!("b{b}-s{s}.jsonl")).unwrap())
        .collect();
    Recording::fitted(files).unwrap()
}

#[test]
fn laws_fitted_from_three_shapes_give_each_recording_and_a_fourth_shape() {
    let r = fitted(&SHAPES);
    assert_eq!(r.inexact, 0);
    assert_eq!(r.shapes, SHAPES);
    assert_eq!(r.path, "b1-s512.jsonl, b2-s512.jsonl, b1-s1024.jsonl");
    for (t, (id, law)) in laws().iter().enumerate() {
        assert_eq!(&r.program.tensors[t].law, law, "{id}");
    }
    // Each file, to the byte.
    for &(b, s) in &SHAPES {
        let one = Recording::parse(recorded(b, s, true).as_bytes(), "one.jsonl").unwrap();
        assert_eq!(r.program.sizes(b, s), one.program.sizes(b, s), "b{b} s{s}");
    }
    // A shape never recorded plans to the laws' values.
    let (b, s) = (3, 2048);
    let want: Vec<u64> = laws().iter().map(|(_, l)| l.bytes(b as f64, s as f64)).collect();
    assert_eq!(r.program.sizes(b, s), want);
    assert_eq!(r.program.ops, Recording::parse(recorded(b, s, false).as_bytes(), "x").unwrap().program.ops);
    assert!(r.grows_with(true, "--max-batch").is_ok() && r.grows_with(false, "--max-seq").is_ok());
    assert_eq!(r.refuses_shape(b, s), None);
}

#[test]
fn two_shapes_at_one_sequence_length_plan_only_that_length() {
    let r = fitted(&SHAPES[..2]);
    // Fixed and per-token laws: what two batches at one length tell.
    assert_eq!(r.program.tensors[4].law, laws()[4].1);
    assert_eq!(r.program.sizes(8, 512)[4], laws()[4].1.bytes(8.0, 512.0));
    assert!(r.grows_with(true, "--max-batch").is_ok());
    let e = r.grows_with(false, "--max-seq").unwrap_err();
    assert!(e.starts_with("--max-seq: every recording is at --seq 512"), "{e}");
    let e = r.refuses_shape(2, 1024).unwrap();
    assert!(e.starts_with("--seq 1024: every recording is at --seq 512"), "{e}");
    assert!(e.ends_with("(recorded at --batch 1 --seq 512; --batch 2 --seq 512)"), "{e}");
    assert_eq!(r.refuses_shape(7, 512), None);
}

#[test]
fn one_recording_plans_its_own_shape_only() {
    let r = Recording::fitted(vec![Recording::parse(recorded(2, 512, true).as_bytes(), "one.jsonl").unwrap()]).unwrap();
    assert_eq!(r.shapes, [(2, 512)]);
    assert_eq!(r.refuses_shape(2, 512), None);
    let e = r.refuses_shape(4, 512).unwrap();
    assert!(e.contains("holds one shape's sizes") && e.contains("record the step at two or three shapes"), "{e}");
    // A file without its shape line plans as before: its sizes are the shape asked for.
    let r = Recording::parse(recorded(2, 512, false).as_bytes(), "old.jsonl").unwrap();
    assert!(r.shapes.is_empty());
    assert_eq!(r.refuses_shape(4, 512), None);
}

#[test]
fn recordings_that_are_not_the_same_step_are_refused_naming_the_lines() {
    let a = Recording::parse(recorded(1, 512, true).as_bytes(), "a.jsonl").unwrap();
    // Another site for the mlp's activation: line 8 of each (the shape line, then six lines).
    let other = recorded(2, 512, true).replace("layers.0.mlp", "layers.1.mlp");
    let b = Recording::parse(other.as_bytes(), "b.jsonl").unwrap();
    let e = Recording::fitted(vec![a.clone(), b]).unwrap_err().to_string();
    assert!(e.starts_with("b.jsonl line 8: alloc \"4 step1.forward activations model.layers.1.mlp\""), "{e}");
    assert!(e.contains("where a.jsonl line 8 has alloc \"4 step1.forward activations model.layers.0.mlp\""), "{e}");
    // One operation fewer.
    let short: String = recorded(2, 512, true).lines().take(8).map(|l| format!("{l}\n")).collect();
    let b = Recording::parse(short.as_bytes(), "b.jsonl").unwrap();
    let e = Recording::fitted(vec![a.clone(), b]).unwrap_err().to_string();
    assert!(e.starts_with("a.jsonl line 9: alloc \"5 step1.forward logits model.lm_head\" stream 0 has no counterpart: b.jsonl ends after 7 operations (line 8)"), "{e}");
    // No shape line, or the same shape twice.
    let b = Recording::parse(recorded(2, 512, false).as_bytes(), "b.jsonl").unwrap();
    let e = Recording::fitted(vec![a.clone(), b]).unwrap_err().to_string();
    assert!(e.starts_with("b.jsonl line 1: does not say the shape it was recorded at"), "{e}");
    let e = Recording::fitted(vec![a.clone(), a]).unwrap_err().to_string();
    assert!(e.contains("is recorded at batch 1 × seq 512, as a.jsonl is"), "{e}");
}

#[test]
fn a_shape_line_comes_first_and_whole() {
    let text = recorded(1, 512, false) + "{\"op\":\"shape\",\"batch\":1,\"seq\":512}\n";
    let e = Recording::parse(text.as_bytes(), "s.jsonl").unwrap_err().to_string();
    assert!(e.contains("a shape line comes first"), "{e}");
    let e = Recording::parse(b"{\"op\":\"shape\",\"batch\":0,\"seq\":512}\n", "s.jsonl").unwrap_err().to_string();
    assert!(e.starts_with("s.jsonl line 1: a shape line needs"), "{e}");
    let e = Recording::parse(b"{\"op\":\"free\",\"id\":\"1\",\"batch\":2}\n", "s.jsonl").unwrap_err().to_string();
    assert_eq!(e, "s.jsonl line 1: \"free\" takes no \"batch\"");
}

/// GPT-2's step recorded at batch 2 × 512 and 4 × 1024: the laws fitted from the two predict
/// the step recorded at 2 × 1024, tensor by tensor and at its peaks.
#[test]
fn gpt2_fitted_from_two_shapes_predicts_the_third() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/recordings");
    let read = |name: &str| Recording::read(&dir.join(name)).unwrap();
    let r = Recording::fitted(vec![read("gpt2-bf16-b2-s512.jsonl"), read("gpt2-bf16-b4-s1024.jsonl")]).unwrap();
    let third = read("gpt2-bf16-b2-s1024.jsonl");
    let (b, s) = (2, 1024);
    let (ours, theirs) = (r.program.sizes(b, s), third.program.sizes(b, s));
    let wrong = ours.iter().zip(&theirs).filter(|(a, b)| a != b).count();
    let settings =
        ReplaySettings { capacity: 1 << 40, config: AllocatorConfig::default(), policy: PolicyName::PyTorch };
    let (po, pt) = (replay(&r.program, &ours, &settings), replay(&third.program, &theirs, &settings));
    let err = |a: u64, b: u64| 100.0 * (a as f64 - b as f64) / b as f64;
    let (live, allocated) = (
        err(r.program.live_peak(&ours).bytes, third.program.live_peak(&theirs).bytes),
        err(po.peak_allocated, pt.peak_allocated),
    );
    println!(
        "gpt2 b2 s1024 from b2 s512 and b4 s1024: {wrong} of {} tensors' sizes differ ({} fitted inexactly); live \
         peak {live:+.3}%, allocated peak {allocated:+.3}% ({} MiB recorded)",
        ours.len(),
        r.inexact,
        pt.peak_allocated >> 20
    );
    assert_eq!(r.inexact, 0);
    assert!(live.abs() < 0.5 && allocated.abs() < 0.5, "live {live:+.3}%, allocated {allocated:+.3}%");
    // From all three, each recorded to the byte.
    let names = ["gpt2-bf16-b2-s512.jsonl", "gpt2-bf16-b2-s1024.jsonl", "gpt2-bf16-b4-s1024.jsonl"];
    let all = Recording::fitted(names.iter().map(|n| read(n)).collect()).unwrap();
    assert_eq!(all.inexact, 0);
    for n in names {
        let one = read(n);
        let (b, s) = one.shapes[0];
        assert_eq!(all.program.sizes(b, s), one.program.sizes(b, s), "{n}");
    }
}

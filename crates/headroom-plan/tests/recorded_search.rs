//! A recording planned as its own model, and `--recommend`'s search over a recording's levers
//! ([`headroom_plan::search::recommend_recorded`]), on GPT-2's step as `python -m headroom_gpu
//! record` recorded it (data/recordings/).

use headroom_plan::estimate::Estimator;
use headroom_plan::gpu::gpu;
use headroom_plan::job::Checkpointing;
use headroom_plan::program::{Phase, Term};
use headroom_plan::recording::Recording;
use headroom_plan::request::TrainRequest;
use headroom_plan::search::{held_gradients, recommend_recorded, RecordedSpace};
use std::path::Path;

fn read(file: &str) -> Recording {
    Recording::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/recordings").join(file)).unwrap()
}

/// GPT-2's recording is its own model: named by its root module, its twelve layers, and a
/// model the planner's checks accept, known as the recording's stand-in.
#[test]
fn a_recording_is_its_own_model() {
    let r = read("gpt2-bf16-b4-s1024.jsonl");
    assert_eq!(r.model_name(), "GPT2LMHeadModel");
    assert_eq!(r.layers(), 12);
    assert!(!r.recomputes());
    let m = r.stand_in_model();
    assert_eq!((m.name.as_str(), m.layers), ("GPT2LMHeadModel", 12));
    assert!(m.check().is_ok());
    assert!(Recording::is_stand_in(&m));
    assert!(!Recording::is_stand_in(&headroom_plan::model::preset("gpt2").unwrap()));
}

/// The gradients held when the optimizer step begins are one per parameter (full
/// fine-tuning in bf16): as many bytes as the weights.
#[test]
fn the_held_gradients_are_the_parameters_gradients() {
    let r = read("gpt2-bf16-b4-s1024.jsonl");
    let p = &r.program;
    let weights: f64 = p.tensors.iter().filter(|t| t.term == Term::Weights).map(|t| t.law.fixed).sum();
    assert_eq!(held_gradients(p, 4, 1024), weights);
    assert!(p
        .ops
        .iter()
        .any(|o| matches!(o, headroom_plan::program::Op::Mark { step: 1, phase: Phase::OptimizerStep })));
}

/// The search over a recording's levers on an L4 of 6.5 GiB, where the recorded micro-batch
/// fits with the margin accumulation needs under `expandable_segments:True` and not under
/// PyTorch's defaults: every row fits and reaches the global batch; the timed rows come first,
/// fastest first; with accumulation the step is the forward and backward once a micro-batch and
/// the optimizer once, so it is less than that many recorded steps; and a row that accumulates
/// keeps a margin that holds the gradients.
#[test]
fn the_search_finds_the_fastest_of_a_recordings_levers_that_fit() {
    let r = Recording::fitted(
        ["gpt2-bf16-b2-s512.jsonl", "gpt2-bf16-b2-s1024.jsonl", "gpt2-bf16-b4-s1024.jsonl"].map(read).to_vec(),
    )
    .unwrap();
    let model = r.stand_in_model();
    let mut l4 = gpu("l4").unwrap();
    l4.memory_bytes = 13 << 29;
    let request = TrainRequest { micro_batch: 4, seq: 1024, ..TrainRequest::default() };
    let job = request.resolve_recorded(&model, &l4, &r).unwrap();
    let allocators = vec![
        ("PyTorch's defaults".to_string(), Estimator::default()),
        (
            "expandable".to_string(),
            Estimator::replaying("expandable_segments:True", headroom_alloc::PolicyName::PyTorch).unwrap(),
        ),
    ];
    let space = RecordedSpace::for_recording(&r, allocators, None, 4, 8);
    assert_eq!(space.micro_batches, [1, 2, 4, 8]);
    assert_eq!(space.checkpointing.len(), 12, "none, full and every-2 … every-11");
    let found = recommend_recorded(&job, 8, &space, 20);
    let rows = &found.recommendations;
    assert!(!rows.is_empty() && found.replayed >= rows.len() && found.tried == space.len());
    let timed: Vec<f64> = rows.iter().map_while(|r| r.estimate.step_time_s()).collect();
    assert!(!timed.is_empty() && timed.windows(2).all(|w| w[0] <= w[1]), "{timed:?}");
    assert!(rows[timed.len()..].iter().all(|r| r.estimate.time.is_none()));
    let one = Estimator::default().estimate(&job).unwrap().step_time_s().unwrap();
    for row in rows {
        assert!(row.estimate.verdict.fits);
        assert_eq!(row.config.micro_batch * row.config.accumulation, 8);
        if let Some(t) = row.estimate.step_time_s() {
            assert_eq!((row.config.micro_batch, row.config.checkpointing), (4, Checkpointing::None));
            assert!(t > one && t < 2.0 * one, "{t} against one step's {one}");
        }
        let held = held_gradients(&row.estimate.program, row.config.micro_batch, 1024);
        assert!(row.estimate.verdict.margin_bytes.unwrap() >= held);
    }
}

//! Checkpointing as a transform, against transformers' checkpointed steps as recorded.
//!
//! `data/programs/hf.tpl` holds transformers' training step recorded tensor by tensor both
//! without checkpointing and under `gradient_checkpointing_enable()` (torch.utils.checkpoint
//! around every decoder layer), for GPT-2, Llama, Qwen2 and Qwen3 at three precisions. The
//! transform of the first ([`recompute::checkpoint_layers`]) is compared with the second: the
//! step's live peak, and the allocated and reserved peaks replayed through PyTorch's caching
//! allocator. Tolerances were declared before the first comparison: live and allocated within
//! 3%, reserved within 5%. Not every row meets them (docs/VALIDATION.md lists the rows and
//! why): the test holds the count that does, so a change that loses a row fails, and prints
//! the table (`-- --nocapture`).

use headroom_alloc::{AllocatorConfig, PolicyName};
use headroom_plan::builders::{hf, Device, StateScale};
use headroom_plan::gpu::gpu;
use headroom_plan::job::{Attention, Checkpointing, Optimizer, Precision, TrainConfig};
use headroom_plan::model::Model;
use headroom_plan::recompute::{checkpoint_layers, Wrapped};
use headroom_plan::replay::{replay, ReplaySettings};

/// Each family at a size whose step a test replays in a moment, at its own vocabulary and at
/// a small one, where the layers' activations rather than the logits make the step's peak.
fn models() -> Vec<Model> {
    let configs = [
        ("gpt2", r#"{"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 8192, "VOCAB"}"#),
        (
            "llama",
            r#"{"model_type": "llama", "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 8,
               "num_attention_heads": 16, "num_key_value_heads": 4, "max_position_embeddings": 8192, "VOCAB"}"#,
        ),
        (
            "qwen2",
            r#"{"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 8,
               "num_attention_heads": 14, "num_key_value_heads": 2, "max_position_embeddings": 8192, "VOCAB"}"#,
        ),
        (
            "qwen3",
            r#"{"model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 8,
               "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 8192, "VOCAB"}"#,
        ),
    ];
    let mut out = Vec::new();
    for (name, c) in configs {
        for vocab in [151_936, 4096] {
            let text = c.replace("\"VOCAB\"", &format!("\"vocab_size\": {vocab}"));
            out.push(
                Model::from_hf_config(&text, &format!("{name}-v{vocab}")).unwrap_or_else(|e| panic!("{name}: {e}")),
            );
        }
    }
    out
}

#[test]
fn the_transform_of_an_uncheckpointed_step_is_the_checkpointed_step_as_recorded() {
    let h100 = gpu("h100").unwrap();
    // A device no step here fills: the comparison is of the steps, not of where they fail.
    let settings =
        ReplaySettings { capacity: 1 << 40, config: AllocatorConfig::default(), policy: PolicyName::PyTorch };
    let (mut rows, mut met) = (0, 0);
    for model in models() {
        let name = model.name.clone();
        for precision in [Precision::Bf16, Precision::Amp, Precision::Fp32] {
            for (b, s) in [(1, 512), (4, 1024), (2, 4096)] {
                let cfg = |checkpointing| TrainConfig {
                    attention: Attention::Sdpa,
                    checkpointing,
                    ..TrainConfig::new(b, s, precision, Optimizer::AdamW)
                };
                let build = |c| hf::program(&model, &cfg(c), Device::Gpu(&h100), 2, &StateScale::default());
                let (Ok(plain), Ok(recorded)) = (build(Checkpointing::None), build(Checkpointing::Full)) else {
                    continue;
                };
                let ours = checkpoint_layers(&plain.program, Wrapped::Every).expect("the program names its layers");
                ours.check().expect("a well-formed program");
                assert_everything_made_is_freed(&ours, b, s);
                let (sz, sr) = (ours.sizes(b, s), recorded.program.sizes(b, s));
                let (lo, lr) = (ours.live_peak(&sz).bytes, recorded.program.live_peak(&sr).bytes);
                let (ro, rr) = (replay(&ours, &sz, &settings), replay(&recorded.program, &sr, &settings));
                let err = |a: u64, b: u64| (a as f64 - b as f64) / b as f64 * 100.0;
                let (el, ea, er) =
                    (err(lo, lr), err(ro.peak_allocated, rr.peak_allocated), err(ro.peak_reserved, rr.peak_reserved));
                eprintln!(
                    "{name:14} {precision:?} b{b} s{s}: live {el:+.2}%  allocated {ea:+.2}%  reserved {er:+.2}%  \
                     (recorded {} MiB allocated, {} allocations; ours {})",
                    rr.peak_allocated >> 20,
                    recorded.program.allocations(),
                    ours.allocations()
                );
                rows += 1;
                met += usize::from(el.abs() <= 3.0 && ea.abs() <= 3.0 && er.abs() <= 5.0);
            }
        }
    }
    eprintln!("{met} of {rows} within the tolerances");
    assert_eq!(rows, 72, "every family, precision and shape has both recordings");
    assert!(met >= MET, "{met} of {rows} rows within the tolerances, where {MET} were");
}

/// Rows within the tolerances on 2026-11-30, once every recording summed the residual's gradient
/// in place (63 before, 65 before GPT-2's dropout kept one-byte masks on a GPU; the misses are
/// all by reserved, docs/VALIDATION.md lists them).
const MET: usize = 61;

/// A transformed step frees every activation it makes, the recomputed ones included.
fn assert_everything_made_is_freed(p: &headroom_plan::program::Program, b: u64, s: u64) {
    use headroom_plan::program::{Op, Term};
    let mut live = vec![false; p.tensors.len()];
    for op in &p.ops {
        match *op {
            Op::Alloc(t) => live[t as usize] = true,
            Op::Free(t) => {
                assert!(live[t as usize], "tensor {t} freed while not live");
                live[t as usize] = false;
            }
            _ => {}
        }
    }
    let sizes = p.sizes(b, s);
    let left: u64 =
        (0..p.tensors.len()).filter(|&t| live[t] && p.tensors[t].term == Term::Activations).map(|t| sizes[t]).sum();
    assert_eq!(left, 0, "activations left live after the last step");
}

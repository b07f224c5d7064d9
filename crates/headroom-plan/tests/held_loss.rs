//! What a checkpointed QLoRA step's loss holds after its backward (peft's
//! `enable_input_require_grads` makes the input embeddings' output a leaf that requires a
//! gradient; the loss's graph keeps it and, after the backward, its `.grad`) lives as long as the
//! loop keeps its `loss` (`TrainConfig::loss_lives`). A loop body that keeps it (`inline`, as
//! `record --qlora` records it) holds it through the optimizer step, `zero_grad` and the next
//! forward, until the new loss replaces the old one (`loss = model(...).loss`) — between
//! micro-batches and between steps alike — and the last goes as the loop ends. A step function
//! that returns `loss.item()` (`function`) lets it go as it returns, after `zero_grad`;
//! transformers' `Trainer` (`trainer`) as each backward ends. The template holds the first step's
//! pair in `step1` (`step_programs.held_into_step2`: the recording frees it in the second step's
//! forward), so the plan's first step makes and holds it as every later step does; before
//! 2026-11-30 the recording left it out, and the first step held none.

use headroom_plan::builders::hf::program;
use headroom_plan::builders::{Device, StateScale};
use headroom_plan::job::{
    Attention, BaseWeights, Checkpointing, Finetune, LoraTargets, LossLife, Optimizer, Precision, TrainConfig,
};
use headroom_plan::program::TensorId;
use headroom_plan::program::{Op, Phase, Program, Term};

const STEPS: u32 = 3;

/// Llama-3-8B's QLoRA of every linear layer, checkpointed, at 2 × 256 tokens, with `accumulation`
/// micro-batches a step, its loop keeping the loss as `loss_lives` says: its program replayed as
/// the CPU runs it.
fn planned(accumulation: u64, loss_lives: LossLife) -> Program {
    let model = headroom_plan::model::preset("llama-3-8b").expect("preset");
    let cfg = TrainConfig {
        attention: Attention::Sdpa,
        checkpointing: Checkpointing::Full,
        finetune: Finetune::Lora { rank: 16, targets: LoraTargets::All, base: BaseWeights::Nf4 },
        double_quant: true,
        accumulation,
        loss_lives,
        ..TrainConfig::new(2, 256, Precision::Bf16, Optimizer::AdamW)
    };
    let p = program(&model, &cfg, Device::Cpu, STEPS, &StateScale::default()).expect("a template serves it").program;
    // `check` reads one forward a step: micro-batches mark theirs each.
    if accumulation == 1 {
        p.check().expect("well formed");
    }
    p
}

/// Where each op falls: (step, phase, micro-batch of the step), the micro-batch counted by the
/// step's forward marks.
fn places(p: &Program) -> Vec<(u32, Phase, u32)> {
    let (mut at, mut micro) = ((0, Phase::Setup), 0);
    p.ops
        .iter()
        .map(|op| {
            if let Op::Mark { step, phase } = *op {
                micro = match phase {
                    Phase::Forward if step == at.0 => micro + 1,
                    Phase::Forward => 1,
                    _ => micro,
                };
                at = (step, phase);
            }
            (at.0, at.1, micro)
        })
        .collect()
}

/// An activation made in one micro-batch and freed in a later one or after the optimizer step,
/// or never.
#[derive(Debug)]
struct Outliving {
    id: TensorId,
    /// (step, micro-batch) that made it, and that freed it.
    made: (u32, u32),
    freed: Option<(u32, u32)>,
    /// At 2 × 256.
    bytes: u64,
    /// Whether it was freed as a forward ends, before its backward begins, or at the program's end.
    at_edge: bool,
}

fn outliving(p: &Program) -> Vec<Outliving> {
    let at = places(p);
    let sizes = p.sizes(2, 256);
    let mut made = std::collections::HashMap::new();
    let mut out = Vec::new();
    for (i, op) in p.ops.iter().enumerate() {
        match *op {
            Op::Alloc(t) if p.tensors[t as usize].term == Term::Activations && at[i].0 > 0 => {
                made.insert(t, (at[i].0, at[i].2));
            }
            Op::Free(t) => {
                let Some(m) = made.remove(&t) else { continue };
                let f = (at[i].0, at[i].2);
                if f != m || at[i].1 == Phase::OptimizerStep {
                    let rest = &p.ops[i + 1..];
                    let next = rest.iter().find(|o| !matches!(o, Op::Free(_)));
                    let edge = match next {
                        Some(Op::Mark { phase, .. }) => *phase == Phase::Backward && at[i].1 == Phase::Forward,
                        None => true,
                        _ => false,
                    };
                    out.push(Outliving { id: t, made: m, freed: Some(f), bytes: sizes[t as usize], at_edge: edge });
                }
            }
            _ => {}
        }
    }
    out.extend(made.into_iter().map(|(t, m)| Outliving {
        id: t,
        made: m,
        freed: None,
        bytes: sizes[t as usize],
        at_edge: false,
    }));
    out.sort_by_key(|x| (x.made, x.bytes));
    out
}

#[test]
fn the_pair_lives_until_the_next_forward_s_loss_replaces_the_loss() {
    for accumulation in [1u64, 2] {
        let p = planned(accumulation, LossLife::Inline);
        let long = outliving(&p);
        let m = accumulation as u32;
        // The embeddings' output (fp32, 2 × 256 × 4096) and its gradient, once a micro-batch, the
        // first step's too.
        let pair = 2 * 2 * 256 * 4096 * 4;
        for step in 1..=STEPS {
            for micro in 1..=m {
                let mine: Vec<_> = long.iter().filter(|x| x.made == (step, micro)).collect();
                assert_eq!(mine.len(), 2, "accumulation {accumulation}, step {step}.{micro}: {mine:?}");
                assert_eq!(mine.iter().map(|x| x.bytes).sum::<u64>(), pair, "step {step}.{micro}");
                let next = if micro < m {
                    Some((step, micro + 1))
                } else if step < STEPS {
                    Some((step + 1, 1))
                } else {
                    None
                };
                for x in mine {
                    match next {
                        Some(n) => {
                            assert_eq!(x.freed, Some(n), "step {step}.{micro}: freed where the next loss replaces it");
                            assert!(x.at_edge, "step {step}.{micro}: freed as the next forward ends");
                        }
                        None => {
                            assert!(
                                x.freed == Some((step, micro)) && x.at_edge,
                                "the last pair goes as the loop ends: {x:?}"
                            )
                        }
                    }
                }
            }
        }
        // Step 2's forward holds step 1's pair as step 3's holds step 2's: the second step is steady.
        let sizes = p.sizes(2, 256);
        let (two, _) = p.step_peaks(&sizes, 2);
        let (three, _) = p.step_peaks(&sizes, 3);
        assert_eq!(three, two, "accumulation {accumulation}: the second step and the third");
    }
}

/// Where tensor `id` is freed: (step, phase, micro-batch), and whether at the edge of its phase
/// (no allocation between it and the next mark, or the program's end).
fn freed_at(p: &Program, id: TensorId) -> Option<((u32, Phase, u32), bool)> {
    let at = places(p);
    let i = p.ops.iter().position(|op| *op == Op::Free(id))?;
    let next = p.ops[i + 1..].iter().find(|o| !matches!(o, Op::Free(_)));
    Some((at[i], matches!(next, Some(Op::Mark { .. }) | None)))
}

#[test]
fn each_loop_frees_the_pair_where_its_loss_goes() {
    for accumulation in [1u64, 2] {
        let m = accumulation as u32;
        // The pair, found where a kept loss holds it past its micro-batch: the same tensors in
        // each loop's program, which differ only in where they are freed.
        let inline = planned(accumulation, LossLife::Inline);
        let pairs: Vec<(TensorId, (u32, u32))> = outliving(&inline).into_iter().map(|x| (x.id, x.made)).collect();
        assert_eq!(pairs.len() as u32, 2 * STEPS * m, "accumulation {accumulation}: {pairs:?}");
        let trainer = planned(accumulation, LossLife::Trainer);
        let function = planned(accumulation, LossLife::Function);
        assert_eq!(trainer.ops.len(), inline.ops.len());
        assert_eq!(function.ops.len(), inline.ops.len());
        for &(id, (step, micro)) in &pairs {
            // Trainer.training_step returns after each backward: the pair goes as it ends.
            let (place, edge) = freed_at(&trainer, id).expect("freed");
            assert_eq!(place, (step, Phase::Backward, micro), "trainer, step {step}.{micro}");
            assert!(edge, "trainer, step {step}.{micro}: freed as the backward ends");
            // A step function: the next micro-batch's loss replaces it, and the step's last goes
            // as the function returns, after the optimizer step and zero_grad.
            let (place, edge) = freed_at(&function, id).expect("freed");
            if micro < m {
                assert_eq!(place, (step, Phase::Forward, micro + 1), "function, step {step}.{micro}");
            } else {
                assert_eq!(place, (step, Phase::OptimizerStep, m), "function, step {step}.{micro}");
            }
            assert!(edge, "function, step {step}.{micro}: freed at the edge of its phase");
        }
        // The pair in each loop's phase peaks (2 × 256 × 4096 fp32, the leaf and its gradient).
        let pair = 2 * 2 * 256 * 4096 * 4;
        let sizes = inline.sizes(2, 256);
        let peaks = |p: &Program, step| p.step_peaks(&sizes, step).0;
        let (t, f, i) = (peaks(&trainer, 2), peaks(&function, 2), peaks(&inline, 2));
        assert_eq!(f.optimizer_step - t.optimizer_step, pair, "held through the optimizer step");
        assert_eq!(i.optimizer_step, f.optimizer_step);
        if accumulation == 1 {
            assert_eq!(f.forward, t.forward, "no loop but inline holds a pair through the next step's forward");
            assert_eq!(i.forward - f.forward, pair, "inline holds the step before's through its forward");
        }
    }
}

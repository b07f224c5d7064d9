//! The expansion of the recorded templates, against what the recorder saw and what a GPU does.

use super::*;
use crate::job::Checkpointing;
use crate::program_template::check_digest as digest;

/// The size at `batch` × `seq` of each allocation, in program order, of a tensor whose site
/// `at` accepts: what a GPU test reads of the tensors one operator chain makes.
pub(super) fn sizes_at(p: &crate::program::Program, batch: u64, seq: u64, at: impl Fn(&str) -> bool) -> Vec<u64> {
    let sizes = p.sizes(batch, seq);
    p.ops
        .iter()
        .filter_map(|op| match op {
            crate::program::Op::Alloc(id) if at(&p.sites[p.tensors[*id as usize].site as usize]) => {
                Some(sizes[*id as usize])
            }
            _ => None,
        })
        .collect()
}

/// Under autocast on a GPU, GPT-2's tanh GELU runs in fp32 from its `pow` on: autocast's
/// fp32 copy of `c_fc`'s output is made once a layer per forward (twice with checkpointing:
/// the recomputation), at the size the H200 recorded for GPT-2 medium at 8 × 888 tokens
/// (116,391,936 bytes), and the programs stay well formed; on the CPU, none.
#[test]
fn gpt2_autocast_runs_the_tanh_gelu_in_fp32_on_a_gpu() {
    use crate::job::Optimizer;
    let model = crate::model::preset("gpt2-medium").expect("preset");
    let h200 = crate::gpu::gpu("h200").expect("gpu");
    for (checkpointing, forwards) in [(Checkpointing::None, 1), (Checkpointing::Full, 2)] {
        let cfg = TrainConfig {
            attention: Attention::Sdpa,
            checkpointing,
            ..TrainConfig::new(8, 888, Precision::Amp, Optimizer::AdamW)
        };
        for (device, copies_per_step) in [(Device::Gpu(&h200), forwards * model.layers as usize), (Device::Cpu, 0)] {
            let p = program(&model, &cfg, device, 2, &StateScale::default()).expect("a template serves it").program;
            p.check().expect("well formed");
            let copies = sizes_at(&p, 8, 888, |site| site.starts_with("aten::pow > aten::to"));
            assert_eq!(copies.len(), 2 * copies_per_step, "{checkpointing:?}");
            assert!(copies.iter().all(|&b| b == 116_391_936), "{copies:?}");
        }
    }
}

/// On a GPU each thread's cuBLAS workspace comes right after its first matrix multiply's output,
/// as PyTorch makes it (`getCurrentCUDABlasHandle`): the forward's after the first product the
/// template records, the backward's after the output layer's weight gradient; once a process.
#[test]
fn the_workspaces_follow_each_threads_first_matrix_multiply() {
    use crate::job::Optimizer;
    let model = crate::model::preset("llama-2-7b").expect("preset");
    let h200 = crate::gpu::gpu("h200").expect("gpu");
    let cfg = TrainConfig { attention: Attention::Sdpa, ..TrainConfig::new(1, 512, Precision::Bf16, Optimizer::AdamW) };
    let p = program(&model, &cfg, Device::Gpu(&h200), 2, &StateScale::default()).expect("a template serves it").program;
    p.check().expect("well formed");
    let made = p.alloc_sites();
    let at: Vec<usize> = (0..made.len()).filter(|&i| made[i] == "cuBLAS workspace").collect();
    assert_eq!(at.len(), 2, "one workspace a thread");
    for &i in &at {
        assert!(matrix_multiply(made[i - 1]), "made after {}", made[i - 1]);
    }
    assert!(!made[..at[0] - 1].iter().any(|s| matrix_multiply(s)), "a matrix multiply before the forward's");
    assert!(made[at[1] - 1].contains("MmBackward0"), "the backward's after {}", made[at[1] - 1]);
}

/// Every template, expanded to the depth the recorder checked it at, reproduces what the
/// recorder saw at that depth: each event's kind and bytes, in order, and every free
/// frees a tensor the expansion made (the instance, not only one of the same size: a
/// free that names no tensor made would leave a layer's output live to the step's end).
#[test]
fn program_templates_expand_as_recorded() {
    let mut checked = 0;
    for key in program_template::keys() {
        let Some(parsed) = program_template::template(key) else { continue };
        // Inference templates are checked by `infer::recorded`'s tests.
        if parsed.template.inference.is_some() {
            continue;
        }
        let dims = parsed.template.dims.clone();
        let decoder = match parsed.template.check.target_seq {
            Some(t) => DecoderLength::Tokens(t as f64),
            None => DecoderLength::Encoder,
        };
        let t = parsed.resolved(&|u| if u == "one" { 1.0 } else { dims.get(u).copied().unwrap_or(1.0) }, decoder);
        let c = &t.check;
        let ex = Expander::new(&t, [c.layers, c.layers]);
        // The instances live, across the sections: a step frees what the setup made.
        let mut made: HashMap<(u32, Option<Concrete>), i64> = HashMap::default();
        let sections: [(&str, &[EventT], &program_template::SectionCheck); 3] = [
            ("setup", &t.setup, &c.setup),
            ("step1", t.step1.as_deref().unwrap_or(&t.step), c.step1.as_ref().expect("a training check")),
            ("step", &t.step, c.step.as_ref().expect("a training check")),
        ];
        for (name, events, want) in sections {
            let mut items = Vec::new();
            let (mut live, mut peak, mut n) = (0i64, 0i64, 0usize);
            let (mut by_instance, mut instance_peak) = (0i64, 0i64);
            for (e, j) in ex.expand(events) {
                let bytes = t.tensors[e.tensor as usize].law.bytes(c.batch as f64, c.seq as f64) as i64;
                live += if e.free { -bytes } else { bytes };
                peak = peak.max(live);
                let inst = ex.instance(e.tensor, t.tensors[e.tensor as usize].home, e.layer, j);
                if e.free {
                    let b = made.remove(&inst);
                    assert!(b.is_some(), "{key} {name}: a free of {inst:?}, which the expansion did not make");
                    by_instance -= b.unwrap_or(0);
                } else {
                    made.insert(inst, bytes);
                    by_instance += bytes;
                    instance_peak = instance_peak.max(by_instance);
                }
                items.push(if e.free { "f".to_string() } else { "a".to_string() });
                items.push(bytes.to_string());
                n += 1;
            }
            assert_eq!(n, want.events, "{key} {name}: events");
            assert_eq!(peak as u64, want.peak, "{key} {name}: peak");
            assert_eq!(instance_peak as u64, want.peak, "{key} {name}: peak, tensor by tensor");
            assert_eq!(digest(&items), want.digest, "{key} {name}: the events in order");
        }
        checked += 1;
    }
    assert!(checked > 0, "no template was checked");
}

//! vLLM's engine as a program: the pool its budget leaves ([`crate::engine`]), and the order
//! it allocates in — the weights loaded, the profile run's dummy step (its activations' peak),
//! `torch.cuda.empty_cache()`, the KV cache tensors one per layer, then a serving step within
//! what the budget set aside.

use super::{allocate_cache, kv_per_token, load_weights, InferConfig, Sized};
use crate::engine::{self, Engine};
use crate::gpu::GpuSpec;
use crate::model::Model;
use crate::program::{Law, Phase, Program, Term};

pub(super) fn sized(model: &Model, gpu: &GpuSpec, cfg: &InferConfig, e: &Engine) -> Sized {
    let weights = cfg.weights.weight_bytes(model) / cfg.tensor.max(1) as f64;
    let per_token = kv_per_token(model, cfg);
    let block = e.block_size.max(1);
    let per_sequence = model.cached_tokens(cfg.seq, block) * per_token;
    let activations = engine::profile_peak(model, e, cfg.tensor);
    let non_torch = engine::non_torch_bytes(cfg.tensor);
    let budget = e.gpu_memory_utilization * engine::reported_total(gpu);
    let pool = budget - weights - activations - non_torch;
    let room = pool.max(0.0);
    let max_sequences = (room / per_sequence) as u64;
    let mut p = Program::default();
    p.mark(0, Phase::Setup);
    load_weights(&mut p, model, weights);
    let site = p.site("the step's activations (the profile run's peak)");
    p.mark(1, Phase::Forward);
    let profile = p.alloc(Law::fixed(activations), Term::Activations, site);
    p.free(profile);
    p.empty_cache();
    // An engine whose budget leaves no pool refuses to start: it allocates none.
    if pool > 0.0 {
        allocate_cache(&mut p, model, pool, 1, "vLLM's KV cache");
        p.mark(2, Phase::Forward);
        let step = p.alloc(Law::fixed(activations), Term::Activations, site);
        p.free(step);
    }
    Sized {
        weights,
        kv_cache: pool,
        activations,
        logits: 0.0,
        outside: non_torch + gpu.arch.cuda_context_bytes() as f64,
        starts: pool > 0.0 && max_sequences >= 1,
        serves: pool > 0.0 && max_sequences >= cfg.batch.max(1),
        max_sequences,
        max_tokens: (room / per_token) as u64,
        program: p,
        source: super::InferSource::Engine,
    }
}

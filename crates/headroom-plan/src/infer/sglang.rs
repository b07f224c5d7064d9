//! SGLang's server as a program: the token pool its share leaves ([`crate::sglang`]), a key
//! and a value buffer per layer, and a step's activations within the rest of the free memory.

use super::{allocate_cache, kv_per_token, load_weights, InferConfig, Sized};
use crate::engine;
use crate::gpu::GpuSpec;
use crate::model::Model;
use crate::program::{Law, Phase, Program, Term};
use crate::sglang::{self as rules, Sglang};

pub(super) fn sized(model: &Model, gpu: &GpuSpec, cfg: &InferConfig, s: &Sglang) -> Sized {
    let weights = cfg.weights.weight_bytes(model) / cfg.tensor.max(1) as f64;
    let per_token = kv_per_token(model, cfg);
    let cached = model.cached_tokens(cfg.seq, 1);
    let free = rules::free_before_weights(gpu, cfg.tensor);
    let pool = rules::pool(s, gpu, cfg.tensor, weights);
    let room = pool.max(0.0);
    let max_sequences = (room / (cached * per_token)) as u64;
    // What the share leaves for activations and CUDA graphs: the server's own, up to the device.
    let reserve = (1.0 - s.mem_fraction_static) * free;
    let mut p = Program::default();
    p.mark(0, Phase::Setup);
    load_weights(&mut p, model, weights);
    // A share that leaves no pool: the server refuses to start.
    if pool > 0.0 {
        allocate_cache(&mut p, model, pool, 2, "SGLang's token pool");
        p.mark(1, Phase::Forward);
        let site = p.site("activations and CUDA graphs (the share's reserve)");
        let step = p.alloc(Law::fixed(reserve), Term::Activations, site);
        p.free(step);
    }
    Sized {
        weights,
        kv_cache: pool,
        activations: reserve,
        logits: 0.0,
        outside: engine::reported_total(gpu) - free,
        starts: pool > 0.0,
        serves: pool > 0.0 && max_sequences >= cfg.batch.max(1),
        max_sequences,
        max_tokens: (room / per_token) as u64,
        program: p,
        source: super::InferSource::Engine,
    }
}

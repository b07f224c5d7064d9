//! The serving simulator: continuous batching, step by step, as vLLM v1's
//! scheduler does it, over the paged block manager — and the same workload
//! with contiguous per-request reservation, for comparison.
//!
//! Each step has a token budget (`max_batched_tokens`). Running requests are
//! served first, in admission order: a request still in its prompt gets the
//! rest of it (chunked to the budget), a decoding request one token. When the
//! KV cache cannot hold a running request's next tokens, the most recently
//! admitted request is preempted by recompute (its blocks are freed, its full
//! blocks stay cached, it goes back to the front of the queue). Waiting
//! requests are admitted only in steps without preemption, while the budget,
//! `max_num_seqs` and the KV cache allow; a new request first looks up its
//! prompt in the prefix cache. A request whose prompt is computed emits one
//! token per step until its output length is reached, then frees its blocks.
//!
//! Time is estimated per step with the roofline of [`crate::roofline`]; all
//! requests arrive at the start (an offline throughput run).

use crate::block_pool::FreeOrder;
use crate::catalog::{GpuSpec, ModelSpec};
use crate::dist::LengthDist;
use crate::manager::{KvCacheManager, KvConfig, KvRequest};
use crate::roofline::{step_time, StepWork};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::VecDeque;

/// Everything a simulation needs.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub model: ModelSpec,
    pub gpu: GpuSpec,
    /// Fraction of device memory the server may use (vLLM's default 0.9).
    pub gpu_memory_utilization: f64,
    pub num_requests: usize,
    pub prompt_len: LengthDist,
    pub output_len: LengthDist,
    /// A prefix of this many tokens shared by this fraction of the requests.
    pub shared_prefix: Option<(usize, f64)>,
    pub block_size: usize,
    pub max_batched_tokens: usize,
    pub max_num_seqs: usize,
    pub max_model_len: usize,
    pub enable_caching: bool,
    /// Use exactly this many KV blocks instead of sizing from memory.
    pub num_gpu_blocks: Option<u32>,
    pub seed: u64,
}

/// How device memory divides (vLLM's profiling approach, estimated).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KvBudget {
    pub usable_bytes: u64,
    pub weight_bytes: u64,
    /// Peak activations of a step of `max_batched_tokens`, estimated.
    pub activation_bytes: u64,
    /// CUDA context, cuBLAS workspace and other non-PyTorch memory.
    pub overhead_bytes: u64,
    pub kv_bytes: u64,
    pub kv_bytes_per_token: u64,
    /// Usable blocks (the null block excluded).
    pub num_blocks: u32,
}

/// CUDA context plus library workspaces: vllm#11251's log shows 0.39 GiB of non-torch memory.
const OVERHEAD_BYTES: u64 = 400 << 20;

/// Sizes the KV pool: usable memory minus bf16 weights, one layer's
/// activations for a full step (16 values of 2 bytes per hidden unit per
/// token, EleutherAI's peak estimate) plus fp32 logits for the sampled
/// tokens, and the context overhead.
pub fn kv_budget(cfg: &SimConfig) -> Result<KvBudget, String> {
    let m = &cfg.model;
    let usable = (cfg.gpu.memory_bytes as f64 * cfg.gpu_memory_utilization) as u64;
    let weights = 2 * m.params();
    let activations = cfg.max_batched_tokens as u64 * m.hidden * 32 + cfg.max_num_seqs as u64 * m.vocab * 4;
    let per_token = m.kv_bytes_per_token(2.0) as u64;
    let block_bytes = per_token * cfg.block_size as u64;
    let (kv, blocks) = match cfg.num_gpu_blocks {
        Some(n) => (n as u64 * block_bytes, n),
        None => {
            let needed = weights + activations + OVERHEAD_BYTES;
            if needed >= usable {
                return Err(format!(
                    "{} does not leave room for a KV cache on {}: weights {:.2} GiB + activations {:.2} GiB + overhead {:.2} GiB \
                     exceed the {:.2} GiB usable ({} of {:.2} GiB)",
                    m.name,
                    cfg.gpu.name,
                    gib(weights),
                    gib(activations),
                    gib(OVERHEAD_BYTES),
                    gib(usable),
                    cfg.gpu_memory_utilization,
                    gib(cfg.gpu.memory_bytes)
                ));
            }
            let kv = usable - needed;
            (kv, (kv / block_bytes).min(u32::MAX as u64 - 2) as u32)
        }
    };
    if blocks < 2 {
        return Err(format!("the KV cache holds {blocks} blocks of {} tokens: too few to serve", cfg.block_size));
    }
    Ok(KvBudget {
        usable_bytes: usable,
        weight_bytes: weights,
        activation_bytes: activations,
        overhead_bytes: OVERHEAD_BYTES,
        kv_bytes: kv,
        kv_bytes_per_token: per_token,
        num_blocks: blocks,
    })
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

/// The requests of a run: prompt tokens and output lengths.
#[derive(Clone, Debug)]
pub struct Workload {
    pub requests: Vec<(Vec<u32>, usize)>,
    /// Requests dropped because they cannot fit the KV cache even alone.
    pub rejected: usize,
}

/// Draws the workload (deterministic for a seed). Prompts are capped at
/// `max_model_len − 1` tokens and outputs at what remains.
pub fn workload(cfg: &SimConfig, capacity_tokens: usize) -> Workload {
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let vocab = cfg.model.vocab as u32;
    let prefix: Vec<u32> = match cfg.shared_prefix {
        Some((n, _)) => (0..n).map(|_| rng.random_range(0..vocab)).collect(),
        None => Vec::new(),
    };
    let limit = cfg.max_model_len.min(capacity_tokens);
    let mut requests = Vec::with_capacity(cfg.num_requests);
    let mut rejected = 0;
    for _ in 0..cfg.num_requests {
        let plen = cfg.prompt_len.sample(&mut rng);
        let olen = cfg.output_len.sample(&mut rng);
        let shared = matches!(cfg.shared_prefix, Some((_, f)) if rng.random_bool(f.clamp(0.0, 1.0)));
        let mut prompt: Vec<u32> = if shared { prefix.clone() } else { Vec::new() };
        prompt.extend((0..plen).map(|_| rng.random_range(0..vocab)));
        prompt.truncate(cfg.max_model_len.saturating_sub(1).max(1));
        let olen = olen.min(cfg.max_model_len - prompt.len());
        if prompt.len() + olen > limit {
            rejected += 1;
            continue;
        }
        requests.push((prompt, olen));
    }
    Workload { requests, rejected }
}

/// What a run measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunReport {
    pub finished: usize,
    pub steps: u64,
    /// Most requests running at once.
    pub peak_running: usize,
    /// Mean running requests per step, weighted by step time.
    pub mean_running: f64,
    /// Token states stored / KV memory reserved, averaged over the run (weighted by step time).
    pub kv_utilization: f64,
    pub preemptions: u64,
    /// Prompt tokens found in the prefix cache / prompt tokens looked up,
    /// at first admission.
    pub prefix_hit_rate: f64,
    /// The same for preempted requests coming back (their own blocks, if still cached).
    pub preempted_prefix_hit_rate: f64,
    pub prefix_cache_evictions: u64,
    pub output_tokens: u64,
    /// Estimated time of the run (roofline), seconds.
    pub elapsed_s: f64,
    pub throughput_tokens_per_s: f64,
    pub requests_per_s: f64,
}

struct SimReq {
    kv: KvRequest,
    output_len: usize,
    generated: usize,
}

/// Accumulates per-step figures into a [`RunReport`].
#[derive(Default)]
struct Meter {
    r: RunReport,
    weighted_running: f64,
    stored: f64,
    reserved: f64,
}

impl Meter {
    fn step(&mut self, dt: f64, running: usize, stored: u64, reserved: u64) {
        self.r.steps += 1;
        self.r.elapsed_s += dt;
        self.r.peak_running = self.r.peak_running.max(running);
        self.weighted_running += dt * running as f64;
        self.stored += dt * stored as f64;
        self.reserved += dt * reserved as f64;
    }

    fn finish(mut self) -> RunReport {
        let t = self.r.elapsed_s;
        if t > 0.0 {
            self.r.mean_running = self.weighted_running / t;
            self.r.throughput_tokens_per_s = self.r.output_tokens as f64 / t;
            self.r.requests_per_s = self.r.finished as f64 / t;
        }
        if self.reserved > 0.0 {
            self.r.kv_utilization = self.stored / self.reserved;
        }
        self.r
    }
}

/// The paged scheduler's state; [`PagedScheduler::step`] runs one step.
pub struct PagedScheduler<'a> {
    cfg: &'a SimConfig,
    pub kv: KvCacheManager,
    reqs: Vec<SimReq>,
    waiting: VecDeque<usize>,
    running: Vec<usize>,
    scheduled: Vec<(usize, usize)>,
    rng: StdRng,
    meter: Meter,
}

impl<'a> PagedScheduler<'a> {
    pub fn new(cfg: &'a SimConfig, budget: &KvBudget, w: &Workload) -> Self {
        let kv = KvCacheManager::new(KvConfig {
            num_blocks: budget.num_blocks + 1,
            block_size: cfg.block_size,
            max_model_len: cfg.max_model_len,
            enable_caching: cfg.enable_caching,
            free_order: FreeOrder::PrependUnhashed,
            watermark: 0.0,
        });
        let reqs: Vec<SimReq> = w
            .requests
            .iter()
            .enumerate()
            .map(|(i, (p, o))| SimReq {
                kv: KvRequest::new(i as u64, p.clone(), cfg.block_size, b""),
                output_len: *o,
                generated: 0,
            })
            .collect();
        let waiting = (0..reqs.len()).collect();
        PagedScheduler {
            cfg,
            kv,
            reqs,
            waiting,
            running: Vec::new(),
            scheduled: Vec::new(),
            rng: StdRng::seed_from_u64(cfg.seed ^ 0x5eed),
            meter: Meter::default(),
        }
    }

    /// Requests running now.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Decides what runs this step (allocating KV slots, preempting if
    /// needed); returns the number of tokens scheduled.
    pub fn schedule(&mut self) -> usize {
        self.scheduled.clear();
        let mut budget = self.cfg.max_batched_tokens;
        let mut preempted = false;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let r = self.running[i];
            let req = &self.reqs[r].kv;
            let n = (req.num_tokens() - req.num_computed_tokens).min(budget);
            loop {
                if self.kv.allocate_slots(&self.reqs[r].kv, n, &[], 0, false).is_ok() {
                    self.scheduled.push((r, n));
                    budget -= n;
                    i += 1;
                    break;
                }
                // Preempt the most recently admitted request, by recompute.
                let victim = self.running.pop().expect("the request itself is running");
                self.kv.free(victim as u64);
                self.reqs[victim].kv.num_computed_tokens = 0;
                self.reqs[victim].kv.num_preemptions += 1;
                self.waiting.push_front(victim);
                self.meter.r.preemptions += 1;
                preempted = true;
                if victim == r {
                    break;
                }
            }
        }
        while !preempted && budget > 0 && self.running.len() < self.cfg.max_num_seqs {
            let Some(&r) = self.waiting.front() else { break };
            let (hits, hit_tokens) = self.kv.get_computed_blocks(&self.reqs[r].kv);
            let req = &self.reqs[r].kv;
            debug_assert_eq!(req.num_computed_tokens, 0, "waiting requests start from scratch");
            let n = (req.num_tokens() - hit_tokens).min(budget);
            if self.kv.allocate_slots(req, n, &hits, 0, !self.running.is_empty()).is_err() {
                break;
            }
            self.waiting.pop_front();
            self.reqs[r].kv.num_computed_tokens = hit_tokens;
            self.running.push(r);
            self.scheduled.push((r, n));
            budget -= n;
        }
        self.cfg.max_batched_tokens - budget
    }

    /// Runs the scheduled tokens: advances each request, emits a token for
    /// each request whose prompt is done, finishes requests, and accounts the step.
    pub fn execute(&mut self) {
        let mut work = StepWork::default();
        let mut finished = Vec::new();
        for &(r, n) in &self.scheduled {
            let s = &mut self.reqs[r];
            let before = s.kv.num_computed_tokens;
            work.new_tokens += n as u64;
            work.attention_token_pairs += (n * before + n * (n + 1) / 2) as u64;
            work.kv_tokens_read += (before + n) as u64;
            s.kv.num_computed_tokens += n;
            if s.kv.num_computed_tokens == s.kv.num_tokens() {
                s.generated += 1;
                self.meter.r.output_tokens += 1;
                if s.generated >= s.output_len {
                    finished.push(r);
                } else {
                    let t = self.rng.random_range(0..self.cfg.model.vocab as u32);
                    s.kv.append_tokens(&[t]);
                }
            }
        }
        let dt = step_time(&self.cfg.model, &self.cfg.gpu, &work);
        // Token states stored: every used slot but each running request's unfilled tail.
        let bs = self.cfg.block_size as u64;
        let reserved = self.kv.num_used_blocks() as u64 * bs;
        let unfilled: u64 = self
            .running
            .iter()
            .map(|&r| self.kv.blocks(r as u64).len() as u64 * bs - self.reqs[r].kv.num_computed_tokens as u64)
            .sum();
        self.meter.step(dt, self.running.len(), reserved - unfilled.min(reserved), reserved);
        for r in finished {
            self.kv.free(r as u64);
            self.running.retain(|&x| x != r);
            self.meter.r.finished += 1;
        }
    }

    fn done(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Runs to completion.
    pub fn run(mut self) -> Result<RunReport, String> {
        while !self.done() {
            if self.schedule() == 0 && self.running.is_empty() {
                return Err("no request can be scheduled: the KV cache is too small for the next request".into());
            }
            self.execute();
        }
        let stats = self.kv.stats();
        self.meter.r.prefix_hit_rate = stats.hit_rate();
        self.meter.r.preempted_prefix_hit_rate = stats.preempted_hit_rate();
        self.meter.r.prefix_cache_evictions = self.kv.pool().evictions();
        Ok(self.meter.finish())
    }
}

/// Runs the workload over the paged block manager.
pub fn simulate_paged(cfg: &SimConfig, budget: &KvBudget, w: &Workload) -> Result<RunReport, String> {
    PagedScheduler::new(cfg, budget, w).run()
}

/// Runs the workload with contiguous reservation: each admitted request
/// reserves `max_model_len` token slots up front (the most it may need; a
/// server does not know output lengths), so it never runs out and is never
/// preempted, and nothing is shared.
pub fn simulate_contiguous(cfg: &SimConfig, budget: &KvBudget, w: &Workload) -> Result<RunReport, String> {
    let capacity = budget.num_blocks as usize * cfg.block_size;
    let reserve = cfg.max_model_len;
    if reserve > capacity {
        return Err(format!(
            "contiguous reservation of max_model_len = {reserve} tokens exceeds the KV cache ({capacity} tokens)"
        ));
    }
    let mut rng = StdRng::seed_from_u64(cfg.seed ^ 0x5eed);
    let mut reqs: Vec<(usize, usize, usize, usize)> = w.requests.iter().map(|(p, o)| (p.len(), 0, *o, 0)).collect(); // (tokens, computed, output_len, generated)
    let mut waiting: VecDeque<usize> = (0..reqs.len()).collect();
    let mut running: Vec<usize> = Vec::new();
    let mut m = Meter::default();
    while !(waiting.is_empty() && running.is_empty()) {
        let mut budget = cfg.max_batched_tokens;
        let mut scheduled = Vec::new();
        for &r in &running {
            if budget == 0 {
                break;
            }
            let (tokens, computed, _, _) = reqs[r];
            let n = (tokens - computed).min(budget);
            scheduled.push((r, n));
            budget -= n;
        }
        while budget > 0 && running.len() < cfg.max_num_seqs && (running.len() + 1) * reserve <= capacity {
            let Some(r) = waiting.pop_front() else { break };
            let n = reqs[r].0.min(budget);
            running.push(r);
            scheduled.push((r, n));
            budget -= n;
        }
        if scheduled.is_empty() {
            return Err("no request can be scheduled".into());
        }
        let mut work = StepWork::default();
        let mut finished = Vec::new();
        for (r, n) in scheduled {
            let q = &mut reqs[r];
            work.new_tokens += n as u64;
            work.attention_token_pairs += (n * q.1 + n * (n + 1) / 2) as u64;
            work.kv_tokens_read += (q.1 + n) as u64;
            q.1 += n;
            if q.1 == q.0 {
                q.3 += 1;
                m.r.output_tokens += 1;
                if q.3 >= q.2 {
                    finished.push(r);
                } else {
                    q.0 += 1;
                    let _ = rng.random_range(0..cfg.model.vocab as u32);
                }
            }
        }
        let dt = step_time(&cfg.model, &cfg.gpu, &work);
        let stored: u64 = running.iter().map(|&r| reqs[r].1 as u64).sum();
        m.step(dt, running.len(), stored, (running.len() * reserve) as u64);
        for r in finished {
            running.retain(|&x| x != r);
            m.r.finished += 1;
        }
    }
    Ok(m.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{gpu, model};
    use crate::dist::Role;

    fn cfg() -> SimConfig {
        SimConfig {
            model: model("llama-2-13b").unwrap(),
            gpu: gpu("a100-40gb").unwrap(),
            gpu_memory_utilization: 0.9,
            num_requests: 300,
            prompt_len: LengthDist::parse("sharegpt", Role::Prompt).unwrap(),
            output_len: LengthDist::parse("sharegpt", Role::Output).unwrap(),
            shared_prefix: None,
            block_size: 16,
            max_batched_tokens: 8192,
            max_num_seqs: 256,
            max_model_len: 2048,
            enable_caching: true,
            num_gpu_blocks: None,
            seed: 7,
        }
    }

    #[test]
    fn budget_of_a_13b_model_on_a_40gb_gpu_matches_the_paper_scale() {
        let b = kv_budget(&cfg()).unwrap();
        // The paper: 26 GB of weights, ~12 GB of KV, 15.7K token slots on an A100-40GB.
        let slots = b.num_blocks as u64 * 16;
        assert!((8_000..16_000).contains(&slots), "{slots} slots, {b:?}");
        let mut too_big = cfg();
        too_big.model = model("llama-2-70b").unwrap();
        assert!(kv_budget(&too_big).unwrap_err().contains("does not leave room"));
    }

    #[test]
    fn every_request_finishes_with_its_output_length() {
        let c = cfg();
        let b = kv_budget(&c).unwrap();
        let w = workload(&c, b.num_blocks as usize * c.block_size);
        let total: usize = w.requests.iter().map(|r| r.1).sum();
        let paged = simulate_paged(&c, &b, &w).unwrap();
        let contiguous = simulate_contiguous(&c, &b, &w).unwrap();
        for r in [&paged, &contiguous] {
            assert_eq!(r.finished, w.requests.len());
            assert_eq!(r.output_tokens as usize, total);
        }
    }
}

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
//! requests arrive at the start (an offline throughput run). Requests are
//! drawn as they are admitted, so memory follows the requests in flight,
//! not the length of the run. As in vLLM, a prompt of `max_model_len` tokens
//! or more is rejected (it leaves no room for an output token) and an output
//! stops when the sequence reaches `max_model_len`; both are counted.

use crate::block_pool::FreeOrder;
use crate::catalog::{GpuSpec, ModelSpec};
use crate::dist::LengthDist;
use crate::manager::{KvCacheManager, KvConfig, KvRequest};
use crate::roofline::{step_time, StepWork};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rustc_hash::FxHashMap;
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

impl KvBudget {
    /// Tokens the KV cache holds.
    pub fn token_slots(&self, block_size: usize) -> u64 {
        self.num_blocks as u64 * block_size as u64
    }
}

/// CUDA context plus library workspaces: vllm#11251's log shows 0.39 GiB of non-torch memory.
const OVERHEAD_BYTES: u64 = 400 << 20;

/// Why a configuration cannot serve: the model, GPU and settings leave no
/// room for the KV cache a request needs (an answer, not bad input).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct NoRoom(pub String);

/// Sizes the KV pool: usable memory minus bf16 weights, one layer's
/// activations for a full step (16 values of 2 bytes per hidden unit per
/// token, EleutherAI's peak estimate) plus fp32 logits for the sampled
/// tokens, and the context overhead. Fails, as vLLM's start-up does, when no
/// block fits or when one request of `max_model_len` tokens would not.
pub fn kv_budget(cfg: &SimConfig) -> Result<KvBudget, NoRoom> {
    let m = &cfg.model;
    let usable = (cfg.gpu.memory_bytes as f64 * cfg.gpu_memory_utilization) as u64;
    let weights = m.params().saturating_mul(2);
    let step_activations = (cfg.max_batched_tokens as u64).saturating_mul(m.hidden).saturating_mul(32);
    let logits = (cfg.max_num_seqs as u64).saturating_mul(m.vocab).saturating_mul(4);
    let activations = step_activations.saturating_add(logits);
    let per_token = m.kv_bytes_per_token(2.0) as u64;
    if per_token == 0 {
        return Err(NoRoom(format!("{} keeps no KV cache (it has no decoder layers)", m.name)));
    }
    let block_bytes = per_token.saturating_mul(cfg.block_size as u64);
    let (kv, blocks) = match cfg.num_gpu_blocks {
        Some(n) => ((n as u64).saturating_mul(block_bytes), n),
        None => {
            let needed = weights.saturating_add(activations).saturating_add(OVERHEAD_BYTES);
            if needed >= usable {
                return Err(NoRoom(format!(
                    "{} does not leave room for a KV cache on {}: weights {:.2} GiB + activations {:.2} GiB \
                     (a step of --max-batched-tokens {} and the logits of --max-num-seqs {}) + overhead {:.2} GiB \
                     exceed the {:.2} GiB usable ({} of {:.2} GiB)",
                    m.name,
                    cfg.gpu.name,
                    gib(weights),
                    gib(activations),
                    cfg.max_batched_tokens,
                    cfg.max_num_seqs,
                    gib(OVERHEAD_BYTES),
                    gib(usable),
                    cfg.gpu_memory_utilization,
                    gib(cfg.gpu.memory_bytes)
                )));
            }
            let kv = usable - needed;
            (kv, (kv / block_bytes).min(u32::MAX as u64 - 2) as u32)
        }
    };
    if blocks < 2 {
        return Err(NoRoom(format!(
            "the KV cache ({:.2} GiB) holds {blocks} blocks of {} tokens: too few to serve",
            gib(kv),
            cfg.block_size
        )));
    }
    let budget = KvBudget {
        usable_bytes: usable,
        weight_bytes: weights,
        activation_bytes: activations,
        overhead_bytes: OVERHEAD_BYTES,
        kv_bytes: kv,
        kv_bytes_per_token: per_token,
        num_blocks: blocks,
    };
    let slots = budget.token_slots(cfg.block_size);
    if cfg.max_model_len as u64 > slots {
        return Err(NoRoom(format!(
            "max_model_len {} is more than the KV cache holds ({slots} tokens): one request of that length would \
             not fit (vLLM refuses to start); lower --max-model-len or raise --gpu-memory-utilization",
            cfg.max_model_len
        )));
    }
    Ok(budget)
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

/// One request: its prompt tokens (empty when drawn for lengths only) and lengths.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub prompt_len: usize,
    /// Output tokens, capped where the sequence reaches `max_model_len`.
    pub output_len: usize,
}

/// The requests of a run, drawn one at a time and the same for a seed
/// whatever order they are asked for: request i draws from stream i + 1 of a
/// ChaCha8 generator (stream 0 is the shared prefix), whose output is
/// documented not to change between versions.
pub struct Workload {
    seed: u64,
    num_requests: usize,
    prompt_len: LengthDist,
    output_len: LengthDist,
    sharing: f64,
    /// Tokens of the shared prefix (empty when drawing lengths only).
    prefix: Vec<u32>,
    prefix_len: usize,
    max_model_len: usize,
    vocab: u32,
    tokens: bool,
    next: usize,
    /// Requests drawn so far whose prompt reaches `max_model_len`, left out as vLLM rejects them.
    pub rejected: usize,
    /// Requests drawn so far whose output was cut where the sequence reaches `max_model_len`.
    pub capped: usize,
}

impl Workload {
    /// The requests of `cfg`, with their prompt tokens.
    pub fn new(cfg: &SimConfig) -> Workload {
        let vocab = cfg.model.vocab.clamp(1, u32::MAX as u64) as u32;
        let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
        let (n, sharing) = cfg.shared_prefix.unwrap_or((0, 0.0));
        // A prefix that leaves no room for a prompt of its own is rejected with every request that shares it.
        let prefix_len = n.min(cfg.max_model_len);
        let prefix = (0..prefix_len).map(|_| rng.random_range(0..vocab)).collect();
        Workload {
            seed: cfg.seed,
            num_requests: cfg.num_requests,
            prompt_len: cfg.prompt_len,
            output_len: cfg.output_len,
            sharing: sharing.clamp(0.0, 1.0),
            prefix,
            prefix_len,
            max_model_len: cfg.max_model_len,
            vocab,
            tokens: true,
            next: 0,
            rejected: 0,
            capped: 0,
        }
    }

    /// The same requests without their tokens (for a simulation that needs only lengths).
    pub fn lengths_only(cfg: &SimConfig) -> Workload {
        let mut w = Workload::new(&SimConfig { shared_prefix: None, ..cfg.clone() });
        w.tokens = false;
        (w.prefix_len, w.sharing) =
            cfg.shared_prefix.map_or((0, 0.0), |(n, f)| (n.min(cfg.max_model_len), f.clamp(0.0, 1.0)));
        w
    }

    /// Requests drawn so far, rejected ones included.
    pub fn drawn(&self) -> usize {
        self.next
    }
}

impl Iterator for Workload {
    type Item = Request;

    fn next(&mut self) -> Option<Request> {
        while self.next < self.num_requests {
            let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
            rng.set_stream(self.next as u64 + 1);
            self.next += 1;
            let plen = self.prompt_len.sample(&mut rng);
            let olen = self.output_len.sample(&mut rng);
            let shared = self.sharing > 0.0 && rng.random_bool(self.sharing);
            let prefix_len = if shared { self.prefix_len } else { 0 };
            let prompt_len = prefix_len.saturating_add(plen);
            if prompt_len >= self.max_model_len {
                self.rejected += 1;
                continue;
            }
            let output_len = olen.min(self.max_model_len - prompt_len);
            if output_len < olen {
                self.capped += 1;
            }
            let prompt = if self.tokens {
                let mut p = Vec::with_capacity(prompt_len);
                if shared {
                    p.extend_from_slice(&self.prefix);
                }
                p.extend((0..plen).map(|_| rng.random_range(0..self.vocab)));
                p
            } else {
                Vec::new()
            };
            return Some(Request { prompt, prompt_len, output_len });
        }
        None
    }
}

/// KV blocks a simulation needs at most: every request's longest sequence
/// at once. A larger pool behaves the same (its extra blocks are never
/// reached), so the pool is built no larger — a 100 TiB GPU does not need
/// a block table of billions of entries to serve a thousand requests.
fn blocks_needed(cfg: &SimConfig, budget: &KvBudget) -> u32 {
    let per_request = cfg.max_model_len.div_ceil(cfg.block_size) as u64 + 1;
    let needed = (cfg.num_requests as u64).saturating_mul(per_request).saturating_add(1);
    needed.min(budget.num_blocks as u64) as u32
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

/// The paged scheduler's state; [`PagedScheduler::schedule`] and
/// [`PagedScheduler::execute`] run one step.
pub struct PagedScheduler<'a, I: Iterator<Item = Request>> {
    cfg: &'a SimConfig,
    pub kv: KvCacheManager,
    /// Requests not yet admitted for the first time.
    source: I,
    /// Requests admitted or waiting, by id; finished ones are dropped.
    reqs: FxHashMap<usize, SimReq>,
    next_id: usize,
    /// Preempted requests, then at most one drawn from the source and not yet admitted.
    waiting: VecDeque<usize>,
    running: Vec<usize>,
    scheduled: Vec<(usize, usize)>,
    rng: ChaCha8Rng,
    meter: Meter,
    vocab: u32,
}

impl<'a, I: Iterator<Item = Request>> PagedScheduler<'a, I> {
    pub fn new(cfg: &'a SimConfig, budget: &KvBudget, requests: I) -> Self {
        Self::with_blocks(cfg, blocks_needed(cfg, budget), requests)
    }

    /// A scheduler over a pool of exactly `blocks` usable blocks.
    fn with_blocks(cfg: &'a SimConfig, blocks: u32, requests: I) -> Self {
        let kv = KvCacheManager::new(KvConfig {
            num_blocks: blocks + 1,
            block_size: cfg.block_size,
            max_model_len: cfg.max_model_len,
            enable_caching: cfg.enable_caching,
            free_order: FreeOrder::PrependUnhashed,
            watermark: 0.0,
        });
        PagedScheduler {
            cfg,
            kv,
            source: requests,
            reqs: FxHashMap::default(),
            next_id: 0,
            waiting: VecDeque::new(),
            running: Vec::new(),
            scheduled: Vec::new(),
            rng: ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x5eed),
            meter: Meter::default(),
            vocab: cfg.model.vocab.clamp(1, u32::MAX as u64) as u32,
        }
    }

    /// Requests running now.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Requests finished so far.
    pub fn num_finished(&self) -> usize {
        self.meter.r.finished
    }

    /// The next waiting request, drawing one from the source when none waits.
    fn front(&mut self) -> Option<usize> {
        if self.waiting.is_empty() {
            let r = self.source.next()?;
            let id = self.next_id;
            self.next_id += 1;
            let kv = KvRequest::new(id as u64, r.prompt, self.cfg.block_size, b"");
            self.reqs.insert(id, SimReq { kv, output_len: r.output_len, generated: 0 });
            self.waiting.push_back(id);
        }
        self.waiting.front().copied()
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
            let req = &self.reqs[&r].kv;
            let n = (req.num_tokens() - req.num_computed_tokens).min(budget);
            loop {
                if self.kv.allocate_slots(&self.reqs[&r].kv, n, &[], 0, false).is_ok() {
                    self.scheduled.push((r, n));
                    budget -= n;
                    i += 1;
                    break;
                }
                // Preempt the most recently admitted request, by recompute.
                let victim = self.running.pop().expect("the request itself is running");
                self.kv.free(victim as u64);
                let v = self.reqs.get_mut(&victim).expect("running requests are known");
                v.kv.num_computed_tokens = 0;
                v.kv.num_preemptions += 1;
                self.waiting.push_front(victim);
                self.meter.r.preemptions += 1;
                preempted = true;
                if victim == r {
                    break;
                }
            }
        }
        while !preempted && budget > 0 && self.running.len() < self.cfg.max_num_seqs {
            let Some(r) = self.front() else { break };
            let (hits, hit_tokens) = self.kv.get_computed_blocks(&self.reqs[&r].kv);
            let req = &self.reqs[&r].kv;
            debug_assert_eq!(req.num_computed_tokens, 0, "waiting requests start from scratch");
            let n = (req.num_tokens() - hit_tokens).min(budget);
            if self.kv.allocate_slots(req, n, &hits, 0, !self.running.is_empty()).is_err() {
                break;
            }
            self.waiting.pop_front();
            self.reqs.get_mut(&r).expect("waiting requests are known").kv.num_computed_tokens = hit_tokens;
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
            let s = self.reqs.get_mut(&r).expect("scheduled requests are known");
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
                    let t = self.rng.random_range(0..self.vocab);
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
            .map(|&r| self.kv.blocks(r as u64).len() as u64 * bs - self.reqs[&r].kv.num_computed_tokens as u64)
            .sum();
        self.meter.step(dt, self.running.len(), reserved - unfilled.min(reserved), reserved);
        for r in finished {
            self.kv.free(r as u64);
            self.running.retain(|&x| x != r);
            self.reqs.remove(&r);
            self.meter.r.finished += 1;
        }
    }

    /// Requests held in memory: running, preempted, or drawn and waiting.
    pub fn num_held(&self) -> usize {
        self.reqs.len()
    }

    /// One step; `Ok(false)` once every request has finished.
    pub fn step(&mut self) -> Result<bool, NoRoom> {
        if self.running.is_empty() && self.front().is_none() {
            return Ok(false);
        }
        if self.schedule() == 0 && self.running.is_empty() {
            return Err(NoRoom("no request can be scheduled: the KV cache is too small for the next request".into()));
        }
        self.execute();
        Ok(true)
    }

    /// Runs to completion; `progress` hears the number of finished requests now and then.
    pub fn run(mut self, progress: &mut dyn FnMut(usize)) -> Result<RunReport, NoRoom> {
        while self.step()? {
            if self.meter.r.steps.is_multiple_of(256) {
                progress(self.meter.r.finished);
            }
        }
        let stats = self.kv.stats();
        self.meter.r.prefix_hit_rate = stats.hit_rate();
        self.meter.r.preempted_prefix_hit_rate = stats.preempted_hit_rate();
        self.meter.r.prefix_cache_evictions = self.kv.pool().evictions();
        Ok(self.meter.finish())
    }
}

/// Runs the requests over the paged block manager.
pub fn simulate_paged(
    cfg: &SimConfig,
    budget: &KvBudget,
    requests: impl Iterator<Item = Request>,
    progress: &mut dyn FnMut(usize),
) -> Result<RunReport, NoRoom> {
    PagedScheduler::new(cfg, budget, requests).run(progress)
}

/// Runs the requests with contiguous reservation: each admitted request
/// reserves `max_model_len` token slots up front (the most it may need; a
/// server does not know output lengths), so it never runs out and is never
/// preempted, and nothing is shared. Only the requests' lengths are used.
pub fn simulate_contiguous(
    cfg: &SimConfig,
    budget: &KvBudget,
    requests: impl Iterator<Item = Request>,
    progress: &mut dyn FnMut(usize),
) -> Result<RunReport, NoRoom> {
    let capacity = blocks_needed(cfg, budget) as usize * cfg.block_size;
    let reserve = cfg.max_model_len;
    if reserve > capacity {
        return Err(NoRoom(format!(
            "contiguous reservation of max_model_len = {reserve} tokens exceeds the KV cache ({capacity} tokens)"
        )));
    }
    let mut source = requests;
    // (tokens, computed, output_len, generated) of the running requests.
    let mut running: Vec<(usize, usize, usize, usize)> = Vec::new();
    let mut m = Meter::default();
    let mut exhausted = false;
    loop {
        let mut budget = cfg.max_batched_tokens;
        let mut scheduled = Vec::new();
        for (k, &(tokens, computed, _, _)) in running.iter().enumerate() {
            if budget == 0 {
                break;
            }
            let n = (tokens - computed).min(budget);
            scheduled.push((k, n));
            budget -= n;
        }
        while !exhausted && budget > 0 && running.len() < cfg.max_num_seqs && (running.len() + 1) * reserve <= capacity
        {
            let Some(r) = source.next() else {
                exhausted = true;
                break;
            };
            let n = r.prompt_len.min(budget);
            running.push((r.prompt_len, 0, r.output_len, 0));
            scheduled.push((running.len() - 1, n));
            budget -= n;
        }
        if scheduled.is_empty() {
            if exhausted && running.is_empty() {
                break;
            }
            return Err(NoRoom("no request can be scheduled".into()));
        }
        let mut work = StepWork::default();
        let mut finished = Vec::new();
        for (k, n) in scheduled {
            let q = &mut running[k];
            work.new_tokens += n as u64;
            work.attention_token_pairs += (n * q.1 + n * (n + 1) / 2) as u64;
            work.kv_tokens_read += (q.1 + n) as u64;
            q.1 += n;
            if q.1 == q.0 {
                q.3 += 1;
                m.r.output_tokens += 1;
                if q.3 >= q.2 {
                    finished.push(k);
                } else {
                    q.0 += 1;
                }
            }
        }
        let dt = step_time(&cfg.model, &cfg.gpu, &work);
        let stored: u64 = running.iter().map(|q| q.1 as u64).sum();
        m.step(dt, running.len(), stored, (running.len() * reserve) as u64);
        // Finished requests leave in admission order, as `retain` kept it.
        for &k in finished.iter().rev() {
            running.remove(k);
            m.r.finished += 1;
        }
        if m.r.steps.is_multiple_of(256) {
            progress(m.r.finished);
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
        assert!(kv_budget(&too_big).unwrap_err().0.contains("does not leave room"));
    }

    #[test]
    fn every_request_finishes_with_its_output_length() {
        let c = cfg();
        let b = kv_budget(&c).unwrap();
        let total: usize = Workload::new(&c).map(|r| r.output_len).sum();
        let n = Workload::new(&c).count();
        let paged = simulate_paged(&c, &b, Workload::new(&c), &mut |_| {}).unwrap();
        let contiguous = simulate_contiguous(&c, &b, Workload::lengths_only(&c), &mut |_| {}).unwrap();
        for r in [&paged, &contiguous] {
            assert_eq!(r.finished, n);
            assert_eq!(r.output_tokens as usize, total);
        }
    }

    #[test]
    fn requests_are_the_same_drawn_lazily_with_or_without_tokens_and_long_prompts_are_rejected() {
        let c = SimConfig {
            prompt_len: LengthDist::parse("uniform:1-3000", Role::Prompt).unwrap(),
            shared_prefix: Some((100, 0.5)),
            ..cfg()
        };
        let with: Vec<Request> = Workload::new(&c).collect();
        let without: Vec<Request> = Workload::lengths_only(&c).collect();
        assert_eq!(with.len(), without.len());
        for (a, b) in with.iter().zip(&without) {
            assert_eq!((a.prompt.len(), a.prompt_len, a.output_len), (b.prompt_len, b.prompt_len, b.output_len));
            assert!(a.prompt_len < c.max_model_len && a.prompt_len + a.output_len <= c.max_model_len);
        }
        let mut w = Workload::new(&c);
        let kept = w.by_ref().count();
        assert_eq!(kept + w.rejected, c.num_requests);
        assert!(w.rejected > 0 && w.capped > 0, "{} rejected, {} capped", w.rejected, w.capped);
        // Prompts longer than the limit are never built: a billion-token prompt costs nothing.
        let huge = SimConfig { prompt_len: LengthDist::Fixed(1 << 40), ..cfg() };
        let mut w = Workload::new(&huge);
        assert_eq!(w.next(), None);
        assert_eq!(w.rejected, huge.num_requests);
    }

    /// Memory follows the requests in flight: a request is drawn when it is
    /// about to be admitted and dropped when it finishes, so however long the
    /// run, at most the running ones, the preempted ones and one more are held.
    #[test]
    fn requests_are_held_only_while_in_flight() {
        let c = SimConfig { num_requests: 3000, max_num_seqs: 24, ..cfg() };
        let b = kv_budget(&c).unwrap();
        let mut s = PagedScheduler::new(&c, &b, Workload::new(&c));
        let mut most = 0;
        while s.step().unwrap() {
            most = most.max(s.num_held());
            assert!(s.num_held() <= 2 * c.max_num_seqs + 1, "{} held", s.num_held());
        }
        assert_eq!(s.num_finished(), Workload::new(&c).count());
        assert!(most > c.max_num_seqs / 2, "{most}");
    }

    #[test]
    fn a_pool_larger_than_the_workload_gives_the_same_run() {
        let c = SimConfig { num_requests: 40, shared_prefix: Some((300, 0.7)), ..cfg() };
        let b = kv_budget(&c).unwrap();
        let big = KvBudget { num_blocks: 20_000, ..b };
        let capped = blocks_needed(&c, &big);
        assert!(capped < big.num_blocks / 3, "{capped}");
        let whole = PagedScheduler::with_blocks(&c, big.num_blocks, Workload::new(&c)).run(&mut |_| {}).unwrap();
        let built = simulate_paged(&c, &big, Workload::new(&c), &mut |_| {}).unwrap();
        assert_eq!(whole, built);
        assert!(whole.prefix_hit_rate > 0.0);
    }
}

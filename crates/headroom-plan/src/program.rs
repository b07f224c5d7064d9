//! The step program: what a training job allocates and frees, in order, as the caching
//! allocator sees it.
//!
//! A program is a list of operations over tensors. Each tensor carries the term of the
//! plan it belongs to ([`Term`]) and the law its size follows ([`Law`]): bytes fixed,
//! per token, per token and position (the s × s matrices of eager attention), per
//! sequence or per position. One program therefore serves every batch and sequence
//! length of its job: [`Program::sizes`] evaluates the laws at a shape, and the replay
//! ([`crate::replay`]) runs the operations through headroom's allocator at those sizes.
//!
//! Invariants (checked by [`Program::check`]): every tensor is allocated exactly once and
//! freed at most once, after its allocation; phase marks appear in step order.

use std::fmt;

/// The plan's terms: what a tensor is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Term {
    /// Parameters (and the 16-bit copies a framework keeps of them).
    Weights,
    /// Gradients of the parameters that train.
    Gradients,
    /// Optimizer state, with fp32 master weights where the precision keeps them.
    Optimizer,
    /// What the layers save for the backward, and their transients.
    Activations,
    /// The output layer's logits and the loss's tensors of the vocabulary's width.
    Logits,
    /// Everything else the step makes and drops: the optimizer step's temporaries, AMP's
    /// weight casts, gathered shards, communication buckets.
    Temporary,
    /// cuBLAS workspaces and other buffers only a GPU has.
    Workspace,
    /// Token ids, labels, masks.
    Inputs,
}

impl Term {
    pub const ALL: [Term; 8] = [
        Term::Weights,
        Term::Gradients,
        Term::Optimizer,
        Term::Activations,
        Term::Logits,
        Term::Temporary,
        Term::Workspace,
        Term::Inputs,
    ];

    /// Lower-case name, as `--json` and the dumped trace write it.
    pub fn name(self) -> &'static str {
        match self {
            Term::Weights => "weights",
            Term::Gradients => "gradients",
            Term::Optimizer => "optimizer",
            Term::Activations => "activations",
            Term::Logits => "logits",
            Term::Temporary => "temporary",
            Term::Workspace => "workspace",
            Term::Inputs => "inputs",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

// The planner's phases are those a recorded step is read by: a program marks setup and the
// three phases of a step, and a calibration compares them phase for phase.
pub use headroom_trace::phase::Phase;

/// The name the plan's `--json` and the dumped program give a phase: [`Phase::name`], but
/// `optimizer` for the optimizer step (`headroom inspect`'s `optimizer_step`), as these stable
/// keys and values have always spelled it and the CPU ground truth records it.
pub fn phase_name(phase: Phase) -> &'static str {
    match phase {
        Phase::OptimizerStep => "optimizer",
        other => other.name(),
    }
}

/// The peak of each phase of a step: its forward, its backward and its optimizer step.
pub type PhasePeaks = headroom_trace::phase::ByPhase<u64>;

/// How a tensor's bytes follow the micro-batch `b` and the sequence length `s`:
/// `fixed + per_token·b·s + per_token_position·b·s² + per_sequence·b + per_position·s
/// + per_position_square·s² + per_padded_token·b·⌈s/32⌉·32
/// + per_token_padded_position·b·s·⌈s/16⌉·16 + per_sequence_padded_position·b·⌈s/16⌉·16`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Law {
    pub fixed: f64,
    pub per_token: f64,
    /// The s × s matrices of eager attention (per token, per position it attends to).
    pub per_token_position: f64,
    pub per_sequence: f64,
    /// Tables the batch shares: rotary embeddings, position ids.
    pub per_position: f64,
    /// The same, s × s: a causal mask shared by the batch, T5's position bias.
    pub per_position_square: f64,
    /// Per token of each sequence rounded up to [`PADDED_POSITIONS`]: CUDA's memory-efficient
    /// attention keeps its softmax statistics (the logsumexp, fp32 a head) so padded.
    pub per_padded_token: f64,
    /// Per token and position it attends to, the positions rounded up to [`PADDED_COLUMNS`]:
    /// the gradient of the bias CUDA's memory-efficient attention was handed (T5's position
    /// bias, which trains), made with its last dimension so padded.
    pub per_token_padded_position: f64,
    /// Per sequence and position rounded up to [`PADDED_COLUMNS`]: the same gradient where the
    /// queries are a decoder of a length the job fixes (T5's cross-attention, b × t × s).
    pub per_sequence_padded_position: f64,
}

/// The multiple CUDA's memory-efficient attention pads the last dimension of its bias's
/// gradient to (`attention_backward.cu`).
pub const PADDED_COLUMNS: f64 = 16.0;

/// The multiple CUDA's memory-efficient attention pads its logsumexp's positions to
/// (`kAlignLSE` in PyTorch's `attention.cu`).
pub const PADDED_POSITIONS: f64 = 32.0;

/// Two laws' tensors together: each coefficient summed.
impl std::ops::Add for Law {
    type Output = Law;

    fn add(self, b: Law) -> Law {
        Law {
            fixed: self.fixed + b.fixed,
            per_token: self.per_token + b.per_token,
            per_token_position: self.per_token_position + b.per_token_position,
            per_sequence: self.per_sequence + b.per_sequence,
            per_position: self.per_position + b.per_position,
            per_position_square: self.per_position_square + b.per_position_square,
            per_padded_token: self.per_padded_token + b.per_padded_token,
            per_token_padded_position: self.per_token_padded_position + b.per_token_padded_position,
            per_sequence_padded_position: self.per_sequence_padded_position + b.per_sequence_padded_position,
        }
    }
}

impl Law {
    pub fn fixed(bytes: f64) -> Law {
        Law { fixed: bytes, ..Law::default() }
    }

    pub fn per_token(bytes: f64) -> Law {
        Law { per_token: bytes, ..Law::default() }
    }

    /// Bytes at micro-batch `b` and sequence `s`, never negative; saturates at `u64::MAX`.
    pub fn bytes(&self, b: f64, s: f64) -> u64 {
        let v = self.fixed
            + self.per_token * b * s
            + self.per_token_position * b * s * s
            + self.per_sequence * b
            + self.per_position * s
            + self.per_position_square * s * s
            + self.per_padded_token * b * (s / PADDED_POSITIONS).ceil() * PADDED_POSITIONS
            + (self.per_token_padded_position * s + self.per_sequence_padded_position)
                * b
                * (s / PADDED_COLUMNS).ceil()
                * PADDED_COLUMNS;
        if v.is_nan() || v <= 0.0 {
            0
        } else {
            v.round().min(u64::MAX as f64) as u64
        }
    }

    pub fn scaled(self, k: f64) -> Law {
        Law {
            fixed: self.fixed * k,
            per_token: self.per_token * k,
            per_token_position: self.per_token_position * k,
            per_sequence: self.per_sequence * k,
            per_position: self.per_position * k,
            per_position_square: self.per_position_square * k,
            per_padded_token: self.per_padded_token * k,
            per_token_padded_position: self.per_token_padded_position * k,
            per_sequence_padded_position: self.per_sequence_padded_position * k,
        }
    }

    /// Whether the size grows with the batch (what gradient accumulation and a smaller
    /// micro-batch shrink).
    pub fn grows_with_batch(&self) -> bool {
        self.per_token != 0.0
            || self.per_token_position != 0.0
            || self.per_sequence != 0.0
            || self.per_padded_token != 0.0
            || self.per_token_padded_position != 0.0
            || self.per_sequence_padded_position != 0.0
    }
}

/// A tensor of the program.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub law: Law,
    pub term: Term,
    /// Where the program makes it (an index into [`Program::sites`]): the module or
    /// operation, for the dumped trace and for explaining a peak.
    pub site: u32,
    /// The CUDA stream it is allocated on (0: the compute stream). The caching allocator
    /// gives a freed block back only to its own stream, so what FSDP2's communication
    /// streams allocate is cached apart from the compute stream's memory.
    pub stream: u64,
    /// The layer whose forward or backward makes it, numbered in forward order across the
    /// model's stacks, where the builder knows it: the spans [`crate::recompute`] checkpoints.
    pub layer: Option<u32>,
}

/// Index of a tensor in its program.
pub type TensorId = u32;

/// One operation of the program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Alloc(TensorId),
    Free(TensorId),
    /// A phase of step `step` (1-based; 0 for setup) begins.
    Mark {
        step: u32,
        phase: Phase,
    },
    /// `torch.cuda.empty_cache()`: the allocator gives its cached segments back (a serving
    /// engine does it after its profile run).
    EmptyCache,
}

/// A job's allocations and frees, in order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Program {
    pub tensors: Vec<Tensor>,
    pub ops: Vec<Op>,
    pub sites: Vec<String>,
}

/// Why a program is malformed: a bug in its synthesis, never a user's input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Malformed(pub String);

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed step program: {}", self.0)
    }
}

impl std::error::Error for Malformed {}

/// Live bytes by term.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ByTerm(pub [u64; 8]);

impl ByTerm {
    pub fn get(&self, t: Term) -> u64 {
        self.0[t.index()]
    }

    pub fn add(&mut self, t: Term, bytes: u64) {
        self.0[t.index()] += bytes;
    }

    pub fn sub(&mut self, t: Term, bytes: u64) {
        self.0[t.index()] -= bytes;
    }

    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
}

/// The most bytes live at once, with nothing rounded (what the program itself holds), and
/// where.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LivePeak {
    pub bytes: u64,
    pub by_term: ByTerm,
    /// Index of the operation after which the peak holds.
    pub at: usize,
    pub step: u32,
    pub phase: Option<Phase>,
}

impl Program {
    /// A site's index, added if new.
    pub fn site(&mut self, name: &str) -> u32 {
        if let Some(i) = self.sites.iter().position(|s| s == name) {
            return i as u32;
        }
        self.sites.push(name.to_string());
        (self.sites.len() - 1) as u32
    }

    /// The site of each allocation, in program order: where a tensor is made relative to
    /// its neighbours (a GPU's cuBLAS workspace right after a thread's first matrix
    /// multiply) is what a program's order promises and its sizes do not show.
    pub fn alloc_sites(&self) -> Vec<&str> {
        self.ops
            .iter()
            .filter_map(|op| match op {
                Op::Alloc(id) => Some(self.sites[self.tensors[*id as usize].site as usize].as_str()),
                _ => None,
            })
            .collect()
    }

    /// Adds a tensor (not yet allocated).
    pub fn tensor(&mut self, law: Law, term: Term, site: u32) -> TensorId {
        self.tensors.push(Tensor { law, term, site, stream: 0, layer: None });
        (self.tensors.len() - 1) as TensorId
    }

    /// Adds a tensor on `stream` and allocates it.
    pub fn alloc_on(&mut self, law: Law, term: Term, site: u32, stream: u64) -> TensorId {
        let id = self.alloc(law, term, site);
        self.tensors[id as usize].stream = stream;
        id
    }

    /// Adds a tensor and allocates it.
    pub fn alloc(&mut self, law: Law, term: Term, site: u32) -> TensorId {
        let id = self.tensor(law, term, site);
        self.ops.push(Op::Alloc(id));
        id
    }

    pub fn free(&mut self, id: TensorId) {
        self.ops.push(Op::Free(id));
    }

    pub fn mark(&mut self, step: u32, phase: Phase) {
        self.ops.push(Op::Mark { step, phase });
    }

    pub fn empty_cache(&mut self) {
        self.ops.push(Op::EmptyCache);
    }

    /// Each tensor's bytes at micro-batch `b` and sequence length `s`.
    pub fn sizes(&self, b: u64, s: u64) -> Vec<u64> {
        let (b, s) = (b as f64, s as f64);
        self.tensors.iter().map(|t| t.law.bytes(b, s)).collect()
    }

    /// Checks the invariants of the module documentation.
    pub fn check(&self) -> Result<(), Malformed> {
        let mut state = vec![0u8; self.tensors.len()];
        let mut last_mark = (0u32, Phase::Setup);
        for (i, op) in self.ops.iter().enumerate() {
            match *op {
                Op::Alloc(t) | Op::Free(t) if t as usize >= self.tensors.len() => {
                    return Err(Malformed(format!("operation {i} names tensor {t}, which does not exist")));
                }
                Op::Alloc(t) => {
                    if state[t as usize] != 0 {
                        return Err(Malformed(format!("operation {i} allocates tensor {t} a second time")));
                    }
                    state[t as usize] = 1;
                }
                Op::Free(t) => {
                    if state[t as usize] != 1 {
                        return Err(Malformed(format!("operation {i} frees tensor {t}, which is not live")));
                    }
                    state[t as usize] = 2;
                }
                Op::Mark { step, phase } => {
                    if (step, phase) < last_mark {
                        return Err(Malformed(format!(
                            "operation {i} begins step {step}'s {phase} after step {}'s {}",
                            last_mark.0, last_mark.1
                        )));
                    }
                    last_mark = (step, phase);
                }
                Op::EmptyCache => {}
            }
        }
        Ok(())
    }

    /// The peak of live bytes at `sizes`, exactly as the program holds them (no rounding,
    /// no allocator): the closed-form pass that searches use to prune before replaying.
    pub fn live_peak(&self, sizes: &[u64]) -> LivePeak {
        let mut live = ByTerm::default();
        let mut total = 0u64;
        let mut best = LivePeak::default();
        let (mut step, mut phase) = (0u32, None);
        for (i, op) in self.ops.iter().enumerate() {
            match *op {
                Op::Alloc(t) => {
                    let n = sizes[t as usize];
                    live.add(self.tensors[t as usize].term, n);
                    total += n;
                    if total > best.bytes {
                        best = LivePeak { bytes: total, by_term: live, at: i, step, phase };
                    }
                }
                Op::Free(t) => {
                    let n = sizes[t as usize];
                    live.sub(self.tensors[t as usize].term, n);
                    total -= n;
                }
                Op::Mark { step: st, phase: ph } => {
                    step = st;
                    phase = Some(ph);
                }
                Op::EmptyCache => {}
            }
        }
        best
    }

    /// The live peak of each phase of step `step`, and of the whole step, exactly as the
    /// program holds them (what the CPU ground truth measures).
    pub fn step_peaks(&self, sizes: &[u64], step: u32) -> (PhasePeaks, u64) {
        let mut total = 0u64;
        let mut peaks = PhasePeaks::default();
        let mut current: Option<Phase> = None;
        for op in &self.ops {
            match *op {
                Op::Alloc(t) => {
                    total += sizes[t as usize];
                    if let Some(ph) = current {
                        peaks.raise(ph, total);
                    }
                }
                Op::Free(t) => total -= sizes[t as usize],
                Op::Mark { step: st, phase } => {
                    current = (st == step).then_some(phase);
                    // A phase holds at least what it began with.
                    if let Some(ph) = current {
                        peaks.raise(ph, total);
                    }
                }
                Op::EmptyCache => {}
            }
        }
        (peaks, peaks.max())
    }

    /// Allocations in the program.
    pub fn allocations(&self) -> usize {
        self.ops.iter().filter(|o| matches!(o, Op::Alloc(_))).count()
    }

    /// The program at `sizes` as a headroom JSONL trace (docs/TRACE_FORMAT.md) that
    /// `headroom replay` reads: one line per allocation and free. The format has no room
    /// for anything but the operation, so each id says what the tensor is: its index, the
    /// step and phase that made it, its term and its site
    /// (`"17 step2.forward activations model.layers.3.mlp"`).
    pub fn to_jsonl(&self, sizes: &[u64]) -> String {
        let mut out = String::with_capacity(self.ops.len() * 64);
        let mut names: Vec<Option<String>> = vec![None; self.tensors.len()];
        let mut at = String::from("setup");
        for op in &self.ops {
            match *op {
                Op::Alloc(t) => {
                    let tensor = &self.tensors[t as usize];
                    let site = self.sites.get(tensor.site as usize).map(String::as_str).unwrap_or("");
                    let id = serde_json::Value::String(format!("{t} {at} {} {site}", tensor.term.name())).to_string();
                    let stream =
                        if tensor.stream == 0 { String::new() } else { format!(",\"stream\":{}", tensor.stream) };
                    out.push_str(&format!("{{\"op\":\"alloc\",\"id\":{id},\"size\":{}{stream}}}\n", sizes[t as usize]));
                    names[t as usize] = Some(id);
                }
                Op::Free(t) => {
                    if let Some(id) = &names[t as usize] {
                        out.push_str(&format!("{{\"op\":\"free\",\"id\":{id}}}\n"));
                    }
                }
                Op::Mark { step, phase } => {
                    at = if phase == Phase::Setup {
                        "setup".into()
                    } else {
                        format!("step{step}.{}", phase_name(phase))
                    };
                }
                Op::EmptyCache => out.push_str("{\"op\":\"empty_cache\"}\n"),
            }
        }
        out
    }
}

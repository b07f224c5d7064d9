//! A step program read from a file: the user's own step, recorded by `python -m headroom_gpu
//! record` under fake tensors, or a program `headroom plan --dump-program` wrote.
//!
//! The file is the JSONL trace `headroom replay` reads (docs/TRACE_FORMAT.md) whose ids follow
//! the step programs' convention: `"<index> <when> <term> <site>"`, where `<when>` is `setup`
//! or `step<N>.<phase>` (forward, backward, optimizer), `<term>` one of the plan's terms
//! ([`Term::name`]) and `<site>` the module or operation that made the tensor (it may hold
//! spaces). That is all a plan needs beyond the operations: what each tensor is for and when
//! it was made, for the breakdown at the peak and the phase that peaks. A recording holds the
//! sizes of the shape it was recorded at, which its first line may say
//! (`{"op":"shape","batch":B,"seq":S}`, as the recorder writes it); each tensor's law is its
//! fixed bytes. The same step recorded at two or three shapes gives each tensor the law its
//! sizes follow ([`crate::recorded_laws`]).
//!
//! A recording may also hold the kernels its step ran, one `kernel` line per operator that runs
//! one on a GPU (docs/TRACE_FORMAT.md): what it is, its FLOPs and bytes, and the shape of a
//! matrix multiply or of attention. A recording that holds them is timed from them
//! ([`crate::time::recorded`]); one that does not is planned without a step time.
//!
//! A step recorded compiled (`record --compile`) says so in a `{"op":"compiled"}` line before
//! its operations: its graphs ran operator by operator, not as Inductor's kernels, so it holds
//! no kernel lines, and the plan says why it has no step time.
//!
//! Every malformed line is refused with the file's name and the line's number, and says what
//! was expected: a plan made from a program that is not the one recorded would be wrong with
//! confidence.

use crate::kernel::Dtype;
use crate::model::{Family, Model};
use crate::program::{Law, Op, Phase, Program, TensorId, Term};
use serde::Deserialize;
use std::collections::HashMap;
use std::fmt;
use std::path::Path;

/// The `model_type` of a recording's stand-in model.
const STAND_IN: &str = "recording";

/// A recorded step program and where it came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Recording {
    /// The file, as the user named it (the files, joined by ", ", for laws fitted from several).
    pub path: String,
    pub program: Program,
    /// The shapes recorded, `(batch, seq)`: none where a single file does not say its shape,
    /// one for a file that does, and one per file for laws fitted from several.
    pub shapes: Vec<(u64, u64)>,
    /// Tensors whose fitted law does not give every recorded size to the byte.
    pub inexact: usize,
    /// Each operation's line in the file and what it is apart from its size: the same step
    /// recorded at another shape has the same keys in the same order.
    pub(crate) events: Vec<(usize, String)>,
    /// The kernels the recorded step ran, in the order it ran them (none where the recorder
    /// wrote none).
    pub kernels: Vec<Kernel>,
    /// The shape, `(batch, seq)`, the kernels were recorded at, where the file says it: they
    /// time that shape only.
    pub kernels_at: Option<(u64, u64)>,
    /// Whether the step was recorded compiled (`torch.compile` through Inductor's graphs, each
    /// operator run eagerly): no kernel of it is Inductor's, so none is timed.
    pub compiled: bool,
}

/// One kernel of the recorded step: an operator a GPU runs as a kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    /// The step and the phase that ran it.
    pub step: u32,
    pub phase: Phase,
    /// The ATen operator, as `aten::mm`.
    pub name: String,
    /// Its FLOPs, where PyTorch's flop counter has a formula for it (0 where not).
    pub flops: f64,
    /// The bytes of its inputs and outputs: what a kernel bound by memory moves.
    pub bytes: f64,
    /// The format it computes in, where it is one the kernel model knows.
    pub dtype: Option<Dtype>,
    pub shape: KernelShape,
    /// The operators the host dispatched for it since the kernel before, views and
    /// metadata among them, itself included (at least 1).
    pub ops: f64,
    /// The scalars the host read back since the kernel before (`.item()`: the optimizer's step
    /// counts).
    pub reads: f64,
    /// Whether a module's forward ran it again in the backward (checkpointing): dispatched
    /// from Python, as the forward's are.
    pub recompute: bool,
}

/// What a kernel's time is made of besides its bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KernelShape {
    /// `batch` products of an `m`×`k` matrix by a `k`×`n` one.
    Matmul { batch: f64, m: f64, n: f64, k: f64 },
    /// A fused attention kernel (`sdpa` names which: flash, efficient, cudnn), forward or
    /// backward: `b`×`heads` of `q` queries against `k` keys, `d` wide.
    Attention { b: f64, heads: f64, q: f64, k: f64, d: f64, causal: bool, backward: bool },
    /// Anything else: bound by the memory it moves.
    Memory,
}

/// A `kernel` line, as the recorder writes it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KernelLine {
    #[allow(dead_code)]
    op: String,
    at: String,
    name: String,
    #[serde(default)]
    flops: f64,
    bytes: f64,
    #[serde(default)]
    dtype: Option<String>,
    #[serde(default)]
    mnk: Option<[f64; 3]>,
    #[serde(default)]
    batch: Option<f64>,
    #[serde(default)]
    sdpa: Option<String>,
    #[serde(default)]
    bhqkd: Option<[f64; 5]>,
    #[serde(default)]
    causal: Option<bool>,
    #[serde(default)]
    ops: Option<f64>,
    #[serde(default)]
    reads: f64,
    #[serde(default)]
    recompute: bool,
}

impl KernelLine {
    fn kernel(self) -> Result<Kernel, String> {
        let (step, phase) = match parse_when(&self.at) {
            Some((step, phase)) if step > 0 => (step, phase),
            _ => {
                return Err(format!(
                    "a kernel's \"at\" is step<N>.<phase> (forward, backward, optimizer), not {:?}",
                    self.at
                ))
            }
        };
        if !(self.bytes >= 0.0 && self.flops >= 0.0) {
            return Err("a kernel's \"bytes\" and \"flops\" are not negative".into());
        }
        let dtype = match self.dtype.as_deref() {
            Some("bf16") => Some(Dtype::Bf16),
            Some("fp16") => Some(Dtype::Half),
            Some("fp32" | "fp64") => Some(Dtype::Fp32),
            Some("fp8") => Some(Dtype::Fp8),
            _ => None,
        };
        let shape = match (self.mnk, self.bhqkd) {
            (Some(_), Some(_)) => {
                return Err("a kernel is a matrix multiply (\"mnk\") or attention (\"bhqkd\"), not both".into())
            }
            (Some([m, n, k]), None) => KernelShape::Matmul { batch: self.batch.unwrap_or(1.0), m, n, k },
            (None, Some([b, heads, q, k, d])) => KernelShape::Attention {
                b,
                heads,
                q,
                k,
                d,
                causal: self.causal.unwrap_or(false),
                backward: self.name.ends_with("_backward"),
            },
            (None, None) => KernelShape::Memory,
        };
        let _ = self.sdpa;
        let ops = self.ops.unwrap_or(1.0).max(1.0);
        let (reads, recompute) = (self.reads.max(0.0), self.recompute);
        Ok(Kernel {
            step,
            phase,
            name: self.name,
            flops: self.flops,
            bytes: self.bytes,
            dtype,
            shape,
            ops,
            reads,
            recompute,
        })
    }
}

/// Why a recording cannot be read: the file, the line (0 for the file as a whole) and the
/// problem.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct RecordingError {
    pub path: String,
    pub line: usize,
    pub why: String,
}

impl fmt::Display for RecordingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.path, self.why)
        } else {
            write!(f, "{} line {}: {}", self.path, self.line, self.why)
        }
    }
}

/// One line of the file, as the trace format spells it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    op: String,
    #[serde(default)]
    id: Option<serde_json::Value>,
    #[serde(default)]
    size: Option<u64>,
    #[serde(default)]
    stream: Option<u64>,
    #[serde(default)]
    batch: Option<u64>,
    #[serde(default)]
    seq: Option<u64>,
}

/// What the id of an allocation says of its tensor.
struct Tag<'a> {
    step: u32,
    phase: Phase,
    term: Term,
    site: &'a str,
}

const ID_FORM: &str = "an allocation's id is \"<index> <when> <term> <site>\", e.g. \"17 step2.forward activations \
                       model.layers.3.mlp\" (<when>: setup or step<N>.forward, .backward, .optimizer)";

/// Reads an id of the step programs' convention.
fn tag(id: &str) -> Result<Tag<'_>, String> {
    let mut words = id.splitn(4, ' ');
    let (Some(_index), Some(when), Some(term)) = (words.next(), words.next(), words.next()) else {
        return Err(format!("id {id:?} is not a step program's: {ID_FORM}"));
    };
    let site = words.next().unwrap_or("");
    let (step, phase) =
        parse_when(when).ok_or_else(|| format!("id {id:?}: {when:?} is not setup or step<N>.<phase>: {ID_FORM}"))?;
    let term = Term::ALL.into_iter().find(|t| t.name() == term).ok_or_else(|| {
        let names: Vec<&str> = Term::ALL.iter().map(|t| t.name()).collect();
        format!("id {id:?}: {term:?} is not one of the plan's terms ({})", names.join(", "))
    })?;
    Ok(Tag { step, phase, term, site })
}

/// `setup` (step 0) or `step<N>.<phase>`, N from 1.
fn parse_when(when: &str) -> Option<(u32, Phase)> {
    if when == "setup" {
        return Some((0, Phase::Setup));
    }
    when.strip_prefix("step").and_then(|w| w.split_once('.')).and_then(|(n, p)| {
        let phase = match p {
            "forward" => Phase::Forward,
            "backward" => Phase::Backward,
            "optimizer" => Phase::OptimizerStep,
            _ => return None,
        };
        n.parse::<u32>().ok().filter(|&n| n > 0).map(|n| (n, phase))
    })
}

/// An id as the trace format reads it: numbers and strings are the same name by their text.
fn id_text(id: Option<&serde_json::Value>) -> Result<String, String> {
    match id {
        Some(serde_json::Value::String(s)) => Ok(s.clone()),
        Some(serde_json::Value::Number(n)) => Ok(n.to_string()),
        Some(_) => Err("\"id\" must be a string or a number".into()),
        None => Err("the operation needs an \"id\"".into()),
    }
}

/// Builds a program line by line.
#[derive(Default)]
struct Reader {
    program: Program,
    kernels: Vec<Kernel>,
    sites: HashMap<String, u32>,
    live: HashMap<String, TensorId>,
    /// The step and phase of the last mark.
    at: Option<(u32, Phase)>,
    /// Each layer met, by its list's path and index.
    layers: HashMap<(String, u32), u32>,
    shape: Option<(u64, u64)>,
    compiled: bool,
    /// Each operation read: its line and its key (see [`Recording::events`]).
    events: Vec<(usize, String)>,
}

impl Reader {
    fn line(&mut self, number: usize, text: &str) -> Result<(), String> {
        if text.contains("\"kernel\"") {
            // Rarely an allocation: its site names a module `kernel`.
            let value: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not a trace line: {e}"))?;
            if value.get("op").and_then(|o| o.as_str()) == Some("kernel") {
                let k: KernelLine = serde_json::from_value(value).map_err(|e| format!("not a kernel line: {e}"))?;
                self.kernels.push(k.kernel()?);
                return Ok(());
            }
        }
        let line: Line = serde_json::from_str(text).map_err(|e| format!("not a trace line: {e}"))?;
        let only = |fields: &[(&str, bool)]| match fields.iter().find(|(_, given)| *given) {
            Some((name, _)) => Err(format!("{:?} takes no \"{name}\"", line.op)),
            None => Ok(()),
        };
        if line.op != "shape" && line.op != "compiled" {
            let id = line.id.as_ref().map_or(String::new(), |v| id_text(Some(v)).unwrap_or_default());
            self.events.push((number, format!("{} {id:?} stream {}", line.op, line.stream.unwrap_or(0))));
        }
        let no_shape = [("batch", line.batch.is_some()), ("seq", line.seq.is_some())];
        if line.op != "shape" {
            only(&no_shape)?;
        }
        match line.op.as_str() {
            "shape" => {
                only(&[("id", line.id.is_some()), ("size", line.size.is_some()), ("stream", line.stream.is_some())])?;
                if !self.events.is_empty() || self.shape.is_some() {
                    return Err("a shape line comes first, before any operation, and once".into());
                }
                match (line.batch, line.seq) {
                    (Some(b), Some(s)) if b > 0 && s > 0 => {
                        self.shape = Some((b, s));
                        Ok(())
                    }
                    _ => Err("a shape line needs \"batch\" and \"seq\", whole numbers from 1: \
                              {\"op\":\"shape\",\"batch\":4,\"seq\":1024}"
                        .into()),
                }
            }
            "compiled" => {
                only(&[("id", line.id.is_some()), ("size", line.size.is_some()), ("stream", line.stream.is_some())])?;
                if !self.events.is_empty() || self.compiled {
                    return Err("a compiled line comes before any operation, and once".into());
                }
                self.compiled = true;
                Ok(())
            }
            "alloc" => {
                let id = id_text(line.id.as_ref())?;
                let size = line.size.ok_or("an alloc needs a \"size\" in bytes")?;
                self.alloc(id, size, line.stream.unwrap_or(0))
            }
            "free" => {
                only(&[("size", line.size.is_some()), ("stream", line.stream.is_some())])?;
                let id = id_text(line.id.as_ref())?;
                let t = self.live.remove(&id).ok_or_else(|| format!("frees {id:?}, which is not live"))?;
                self.program.free(t);
                Ok(())
            }
            "empty_cache" => {
                only(&[("id", line.id.is_some()), ("size", line.size.is_some()), ("stream", line.stream.is_some())])?;
                self.program.empty_cache();
                Ok(())
            }
            other => Err(format!(
                "{other:?}: a step program holds alloc, free, empty_cache and kernel, after its shape and compiled \
                 lines (replay other traces with `headroom replay`)"
            )),
        }
    }

    /// The layer a module path names — the first numbered module of a list, as
    /// `model.layers.3.mlp` or T5's `encoder.block.3` — numbered in the order the recording
    /// first meets each, which is the model's build order: the forward's.
    fn layer(&mut self, site: &str) -> Option<u32> {
        let path = site.split_whitespace().next()?;
        let mut parts = path.split('.');
        let mut prefix = 0;
        let index = parts.find_map(|p| {
            let n = p.parse::<u32>().ok().filter(|_| p.bytes().all(|b| b.is_ascii_digit()));
            if n.is_none() {
                prefix += p.len() + 1;
            }
            n
        })?;
        let key = (path[..prefix.min(path.len())].to_string(), index);
        let next = self.layers.len() as u32;
        Some(*self.layers.entry(key).or_insert(next))
    }

    fn alloc(&mut self, id: String, size: u64, stream: u64) -> Result<(), String> {
        if self.live.contains_key(&id) {
            return Err(format!("allocates {id:?}, which is still live"));
        }
        let tag = tag(&id)?;
        let when = (tag.step, tag.phase);
        if let Some((step, phase)) = self.at.filter(|&at| when < at) {
            return Err(format!(
                "{id:?} is made in step {}'s {} after step {step}'s {phase}: a step program's phases come in order",
                tag.step, tag.phase
            ));
        }
        if self.at != Some(when) {
            self.program.mark(tag.step, tag.phase);
            self.at = Some(when);
        }
        let site = match self.sites.get(tag.site) {
            Some(&s) => s,
            None => {
                self.program.sites.push(tag.site.to_string());
                let s = (self.program.sites.len() - 1) as u32;
                self.sites.insert(tag.site.to_string(), s);
                s
            }
        };
        let t = self.program.alloc_on(Law::fixed(size as f64), tag.term, site, stream);
        self.program.tensors[t as usize].layer = self.layer(tag.site);
        self.live.insert(id, t);
        Ok(())
    }
}

impl Recording {
    /// Reads `path`.
    pub fn read(path: &Path) -> Result<Recording, RecordingError> {
        let name = path.display().to_string();
        let bytes =
            std::fs::read(path).map_err(|e| RecordingError { path: name.clone(), line: 0, why: e.to_string() })?;
        Recording::parse(&bytes, &name)
    }

    /// Reads a recording's bytes; `path` names it in errors.
    pub fn parse(bytes: &[u8], path: &str) -> Result<Recording, RecordingError> {
        let err = |line: usize, why: String| RecordingError { path: path.to_string(), line, why };
        let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
        let mut reader = Reader::default();
        for (i, raw) in bytes.split(|&b| b == b'\n').enumerate() {
            let text = std::str::from_utf8(raw)
                .map_err(|e| err(i + 1, format!("not UTF-8 (byte {} is not)", e.valid_up_to() + 1)))?;
            let text = text.trim();
            if !text.is_empty() {
                reader.line(i + 1, text).map_err(|why| err(i + 1, why))?;
            }
        }
        let Reader { program, shape, events, kernels, compiled, .. } = reader;
        if program.allocations() == 0 {
            return Err(err(0, "holds no allocation: record a step (python -m headroom_gpu record) first".into()));
        }
        if !program.ops.iter().any(|o| matches!(o, Op::Mark { step, .. } if *step > 0)) {
            return Err(err(0, "holds no step: every allocation is tagged setup, so nothing is a forward, a backward or an optimizer step".into()));
        }
        Ok(Recording {
            path: path.to_string(),
            program,
            shapes: shape.into_iter().collect(),
            inexact: 0,
            kernels_at: shape.filter(|_| !kernels.is_empty()),
            events,
            kernels,
            compiled,
        })
    }

    /// The kernels of the last step that has any, in the order they ran: the step the time is
    /// of (the first makes the optimizer's state; later ones run alike).
    pub fn timed_kernels(&self) -> &[Kernel] {
        let Some(last) = self.kernels.iter().map(|k| k.step).max() else { return &[] };
        let first = self.kernels.iter().position(|k| k.step == last).unwrap_or(0);
        let end = self.kernels[first..].iter().position(|k| k.step != last).map_or(self.kernels.len(), |e| first + e);
        &self.kernels[first..end]
    }

    /// The model the recording is of, by name: the root module its weights' sites name (the
    /// recorder names each tensor's module from the model's class, `GPT2LMHeadModel.lm_head`),
    /// else the file's name without its extension.
    pub fn model_name(&self) -> String {
        let roots = self.program.tensors.iter().filter(|t| t.term == Term::Weights).filter_map(|t| {
            let site = self.program.sites[t.site as usize].split_whitespace().next()?;
            site.split('.').next().filter(|r| !r.is_empty())
        });
        let mut roots = roots.peekable();
        let first = roots.peek().copied();
        match first {
            Some(root) if roots.all(|r| r == root) => root.to_string(),
            _ => {
                let first_file = self.path.split(", ").next().unwrap_or(&self.path);
                let stem = Path::new(first_file).file_stem().map(|s| s.to_string_lossy().into_owned());
                stem.unwrap_or_else(|| first_file.to_string())
            }
        }
    }

    /// The layers the recording names (`model.layers.3.mlp`): what checkpointing by layers
    /// wraps, and what the step time spreads its per-layer figures over. 0 where it names none.
    pub fn layers(&self) -> u64 {
        self.program.tensors.iter().filter_map(|t| t.layer).max().map_or(0, |l| u64::from(l) + 1)
    }

    /// Whether the recorded step ran a checkpointed module's forward again in its backward, as
    /// its kernels say (`"recompute":true`); a recording without kernels does not say.
    pub fn recomputes(&self) -> bool {
        self.kernels.iter().any(|k| k.recompute)
    }

    /// The model a recording is planned as when no catalog model is named (`--program` without
    /// `--model`): its name ([`Recording::model_name`]) and its layers, and nothing else. A
    /// recording's plan reads no other figure of a model: its tensors are in the file and its
    /// time comes from its kernels. Where a figure would be read anyway — the parameter count,
    /// the model FLOPs of a utilization — it is 1, and the plan's output says the model is the
    /// recording's and shows none of them ([`Recording::is_stand_in`]).
    pub fn stand_in_model(&self) -> Model {
        let layers = self.layers().max(1);
        Model {
            name: self.model_name(),
            family: Family::GatedDecoder,
            model_type: STAND_IN,
            hidden: 1,
            layers,
            heads: 1,
            kv_heads: 1,
            head_dim: 1,
            intermediate: 1,
            vocab: 1,
            // No context limit the recording knows of: a sequence is the recording's business.
            max_position: 1 << 40,
            tied_embeddings: true,
            qkv_bias: false,
            experts: 1,
            experts_per_token: 1,
            shared_expert: 0,
            gated_mlp: false,
            decoder_layers: layers,
            sliding_window: None,
            global_layers: Vec::new(),
            relative_buckets: 0,
            rope_theta: Some(10_000.0),
            rope_scaling: None,
            norm_eps: 1e-5,
        }
    }

    /// Whether `model` is a recording's stand-in ([`Recording::stand_in_model`]), not a
    /// catalog model or a config.json's.
    pub fn is_stand_in(model: &Model) -> bool {
        model.model_type == STAND_IN
    }

    /// The steps the recording holds, numbered from 1 (`step<N>`).
    pub fn steps(&self) -> u32 {
        self.program
            .ops
            .iter()
            .filter_map(|o| if let Op::Mark { step, .. } = o { Some(*step) } else { None })
            .max()
            .unwrap_or(0)
    }

    /// Whether the recording is of inference: its steps are forwards with neither a backward
    /// nor an optimizer step, as `record --infer` and `--generate` write them (each forward one
    /// step). No gradients, no optimizer state: a training plan's levers do not apply.
    pub fn inference(&self) -> bool {
        !self.program.ops.iter().any(|o| matches!(o, Op::Mark { phase: Phase::Backward | Phase::OptimizerStep, .. }))
            && !self.kernels.iter().any(|k| k.phase != Phase::Forward)
    }

    /// Where the recording is inference as `generate` runs it — a first forward, the prefill,
    /// then forwards that each allocate at most half what it did, the decode steps of one token
    /// a sequence over the cache — how many decode steps; `None` for training, for a single
    /// forward and for forwards alike (`record --infer`: each the same as the first).
    pub fn decode_steps(&self) -> Option<u32> {
        let steps = self.steps();
        if !self.inference() || steps < 2 {
            return None;
        }
        let (b, s) = self.shapes.first().copied().unwrap_or((1, 1));
        let sizes = self.program.sizes(b, s);
        let mut made = vec![0u64; steps as usize + 1];
        let mut step = 0;
        for op in &self.program.ops {
            match *op {
                Op::Mark { step: st, .. } => step = st as usize,
                Op::Alloc(t) => made[step] += sizes[t as usize],
                _ => {}
            }
        }
        made[2..].iter().all(|&m| m.saturating_mul(2) <= made[1]).then_some(steps - 1)
    }

    /// A line on what the recording holds: its file, allocations and steps.
    pub fn describe(&self) -> String {
        let steps = self.steps();
        let kernels = match self.timed_kernels().len() {
            0 => String::new(),
            n => format!(", {n} kernels timed"),
        };
        format!(
            "{} ({} allocations, {} step{}{kernels}{})",
            self.path,
            self.program.allocations(),
            steps,
            if steps == 1 { "" } else { "s" },
            self.fitted_from().map_or(String::new(), |f| format!("; {f}"))
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A program written as `--dump-program` writes it reads back as the same operations.
    #[test]
    fn a_dumped_program_reads_back_as_itself() {
        let mut p = Program::default();
        let (w, m) = (p.site("model.embed"), p.site("model.layers.0 mlp"));
        p.mark(0, Phase::Setup);
        let weights = p.alloc(Law::fixed(4096.0), Term::Weights, w);
        p.mark(1, Phase::Forward);
        let act = p.alloc_on(Law::fixed(1000.0), Term::Activations, m, 7);
        p.mark(1, Phase::Backward);
        let grad = p.alloc(Law::fixed(4096.0), Term::Gradients, w);
        p.free(act);
        p.empty_cache();
        p.mark(1, Phase::OptimizerStep);
        let state = p.alloc(Law::fixed(8192.0), Term::Optimizer, w);
        p.free(grad);
        let sizes = p.sizes(1, 1);
        let text = p.to_jsonl(&sizes);
        let r = Recording::parse(text.as_bytes(), "step.jsonl").unwrap();
        assert_eq!(r.program.ops, p.ops);
        assert_eq!(r.program.sizes(3, 5), sizes);
        for t in [weights, act, grad, state] {
            let (a, b) = (&r.program.tensors[t as usize], &p.tensors[t as usize]);
            assert_eq!(
                (a.term, a.stream, &r.program.sites[a.site as usize]),
                (b.term, b.stream, &p.sites[b.site as usize])
            );
        }
        assert_eq!(r.describe(), "step.jsonl (4 allocations, 1 step)");
        assert!(!r.inference(), "a step with a backward and an optimizer step is training");
        // Its model is named by the root module of its weights' sites, and has the one layer named.
        assert_eq!((r.model_name(), r.layers()), ("model".to_string(), 1));
        assert_eq!(r.program.to_jsonl(&sizes), text);
    }

    /// A recording whose weights name no one root module is named after its file.
    #[test]
    fn a_recording_without_one_root_module_is_named_after_its_file() {
        let text = "{\"op\":\"alloc\",\"id\":\"0 setup weights a.x\",\"size\":8}\n\
                    {\"op\":\"alloc\",\"id\":\"1 setup weights b.y\",\"size\":8}\n\
                    {\"op\":\"alloc\",\"id\":\"2 step1.forward activations a.x\",\"size\":8}\n";
        let r = Recording::parse(text.as_bytes(), "runs/my-step.jsonl").unwrap();
        assert_eq!((r.model_name(), r.layers()), ("my-step".to_string(), 0));
        // Forwards alone are inference.
        assert!(r.inference() && r.steps() == 1);
        let m = r.stand_in_model();
        assert_eq!(m.layers, 1);
        assert!(m.check().is_ok() && Recording::is_stand_in(&m));
    }

    #[test]
    fn errors_name_the_file_and_the_line() {
        let e =
            Recording::parse(b"\n{\"op\":\"alloc\",\"id\":\"0 step1.forward activations\"}\n", "s.jsonl").unwrap_err();
        assert_eq!(e.to_string(), "s.jsonl line 2: an alloc needs a \"size\" in bytes");
        let e = Recording::parse(b"\xff\n", "s.jsonl").unwrap_err();
        assert_eq!(e.to_string(), "s.jsonl line 1: not UTF-8 (byte 1 is not)");
        let kernel = |fields: &str| {
            let text = format!("{{\"op\":\"kernel\",\"name\":\"aten::mm\",{fields}}}\n");
            Recording::parse(text.as_bytes(), "s.jsonl").unwrap_err().to_string()
        };
        assert!(kernel("\"at\":\"setup\",\"bytes\":1").contains("line 1: a kernel's \"at\" is step<N>.<phase>"));
        assert!(kernel("\"at\":\"step1.forward\"").contains("line 1: not a kernel line: missing field `bytes`"));
        assert!(kernel("\"at\":\"step1.forward\",\"bytes\":1,\"size\":2").contains("unknown field `size`"));
    }
}

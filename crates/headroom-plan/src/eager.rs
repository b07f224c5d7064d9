//! What transformers' eager training step asks of the GPU besides its matrix multiplies and
//! attention: the operators it dispatches and the kernels they launch, and the bytes its
//! memory-bound kernels move — recorded per family, precision and checkpointing in
//! `data/kernels/hf.json` by `scripts/validate/kernel_counts.py`.
//!
//! The recorder profiles one steady step of each family's code on the CPU (the profiler's
//! events name the same ATen operators a GPU runs) and counts, per layer and for the rest
//! of the step (embeddings, final norm, head, loss), for the forward, the backward and the
//! optimizer step: the operators dispatched from Python or the autograd engine (`ops`, the
//! host's work), autograd functions (`nodes`), operators that compute (`kernels`: not views,
//! allocations or composites; `matmuls` among them), SDPA calls (`attention`), `nn.Module`
//! calls and the tensors autograd saves (what non-reentrant checkpointing's hooks pack and
//! unpack). The bytes are laws in the model's dimensions — per token, per position, per
//! layer parameter (autocast's copies of the weights), per element of the embedding tables —
//! so the counts hold for any size of the family. The step time ([`crate::time`]) reads
//! them; a family without a recording takes Llama's, the plainest decoder.

use crate::job::Precision;
use crate::model::Model;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// Bytes per token (or per position) as a sum over the model's dimensions.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Units {
    pub one: f64,
    pub heads: f64,
    pub kv_heads: f64,
    pub head_dim: f64,
    pub hidden: f64,
    /// Heads × head dim.
    pub q: f64,
    /// Key-value heads × head dim.
    pub kv: f64,
    pub intermediate: f64,
    pub vocab: f64,
}

impl Units {
    /// Bytes for `model`.
    pub fn at(&self, model: &Model) -> f64 {
        self.one
            + self.heads * model.heads as f64
            + self.kv_heads * model.kv_heads as f64
            + self.head_dim * model.head_dim as f64
            + self.hidden * model.hidden as f64
            + self.q * (model.heads * model.head_dim) as f64
            + self.kv * (model.kv_heads * model.head_dim) as f64
            + self.intermediate * model.intermediate as f64
            + self.vocab * model.vocab as f64
    }

    /// Adds `bytes` per element of the recorder's unit `name` (`h`, `q/2`, `2f`, `q+2kv`, ...).
    fn add(&mut self, name: &str, bytes: f64) -> Result<(), String> {
        let (times, base) = match name {
            "d/2" | "q/2" | "kv/2" => (0.5, &name[..name.len() - 2]),
            "d/4" | "q/4" | "kv/4" => (0.25, &name[..name.len() - 2]),
            "d/8" | "q/8" | "kv/8" => (0.125, &name[..name.len() - 2]),
            "2f" | "2h" => (2.0, &name[1..]),
            "3h" => (3.0, "h"),
            "4h" => (4.0, "h"),
            "q+2kv" => {
                self.q += bytes;
                self.kv += 2.0 * bytes;
                return Ok(());
            }
            other => (1.0, other),
        };
        let slot = match base {
            "1" => &mut self.one,
            "a" => &mut self.heads,
            "k" => &mut self.kv_heads,
            "d" => &mut self.head_dim,
            "h" => &mut self.hidden,
            "q" => &mut self.q,
            "kv" => &mut self.kv,
            "f" => &mut self.intermediate,
            "V" => &mut self.vocab,
            _ => return Err(format!("unknown unit `{name}`")),
        };
        *slot += times * bytes;
        Ok(())
    }
}

/// What a part of the step moves through memory-bound kernels.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Traffic {
    pub per_token: Units,
    pub per_position: Units,
    /// Per parameter of the layer: autocast's 16-bit copies of the weights.
    pub per_param: f64,
    /// Per element of the token embedding table (vocabulary × hidden) and of the position
    /// table (positions × hidden): their gradients, zeroed and filled row by row.
    pub per_vocab_entry: f64,
    pub per_position_entry: f64,
    /// Bytes whatever the shape (norm weights, scalars).
    pub fixed: f64,
}

impl Traffic {
    /// Bytes for `tokens` tokens of sequences `seq` long (`sequences` of them), a layer of
    /// `layer_params` parameters.
    pub fn bytes(&self, model: &Model, tokens: f64, positions: f64, layer_params: f64) -> f64 {
        tokens * self.per_token.at(model)
            + positions * self.per_position.at(model)
            + layer_params * self.per_param
            + (model.vocab * model.hidden) as f64 * self.per_vocab_entry
            + (model.max_position * model.hidden) as f64 * self.per_position_entry
            + self.fixed
    }
}

/// One part of one phase: a layer, or the rest of the model.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Part {
    /// Operators dispatched from Python (the forward, the optimizer) or from the autograd
    /// engine (the backward, a checkpointed layer's recomputed forward).
    pub ops: f64,
    /// Autograd functions evaluated.
    pub nodes: f64,
    /// Operators that launch a kernel, matrix multiplies included, SDPA's own left out.
    pub kernels: f64,
    pub matmuls: f64,
    /// SDPA calls.
    pub attention: f64,
    /// `nn.Module` calls.
    pub modules: f64,
    /// Tensors autograd saves for the backward.
    pub saved: f64,
    /// Parameters (the optimizer's part).
    pub params: f64,
    pub traffic: Traffic,
}

/// A layer and the rest of the model, for one phase.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Phase {
    pub layer: Part,
    pub rest: Part,
}

/// One family's step at one precision and checkpointing.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Step {
    pub forward: Phase,
    pub backward: Phase,
    pub optimizer: Phase,
}

#[derive(Deserialize)]
struct RawPart {
    #[serde(default)]
    ops: f64,
    #[serde(default)]
    nodes: f64,
    #[serde(default)]
    kernels: f64,
    #[serde(default)]
    matmuls: f64,
    #[serde(default)]
    attention: f64,
    #[serde(default)]
    modules: f64,
    #[serde(default)]
    saved: f64,
    #[serde(default)]
    params: f64,
    #[serde(default)]
    bytes: BTreeMap<String, BTreeMap<String, f64>>,
}

impl RawPart {
    fn part(&self) -> Result<Part, String> {
        let mut t = Traffic::default();
        for (class, laws) in &self.bytes {
            for (unit, &b) in laws {
                match (class.as_str(), unit.as_str()) {
                    ("token", u) => t.per_token.add(u, b)?,
                    ("position", u) => t.per_position.add(u, b)?,
                    ("params", "param") => t.per_param += b,
                    ("table", "V*h") => t.per_vocab_entry += b,
                    ("table", "P*h") => t.per_position_entry += b,
                    ("fixed", "1") => t.fixed += b,
                    (c, u) => return Err(format!("unknown law {c}/{u}")),
                }
            }
        }
        Ok(Part {
            ops: self.ops,
            nodes: self.nodes,
            kernels: self.kernels,
            matmuls: self.matmuls,
            attention: self.attention,
            modules: self.modules,
            saved: self.saved,
            params: self.params,
            traffic: t,
        })
    }
}

#[derive(Deserialize)]
struct RawPhase {
    layer: RawPart,
    rest: RawPart,
}

#[derive(Deserialize)]
struct RawStep {
    forward: RawPhase,
    backward: RawPhase,
    optimizer: RawPhase,
}

#[derive(Deserialize)]
struct File {
    families: BTreeMap<String, RawStep>,
}

fn parse(text: &str) -> Result<BTreeMap<String, Step>, String> {
    let file: File = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let phase = |p: &RawPhase| -> Result<Phase, String> { Ok(Phase { layer: p.layer.part()?, rest: p.rest.part()? }) };
    file.families
        .iter()
        .map(|(k, s)| {
            let step =
                Step { forward: phase(&s.forward)?, backward: phase(&s.backward)?, optimizer: phase(&s.optimizer)? };
            Ok((k.clone(), step))
        })
        .collect()
}

fn recorded() -> &'static BTreeMap<String, Step> {
    static R: OnceLock<BTreeMap<String, Step>> = OnceLock::new();
    R.get_or_init(|| {
        parse(include_str!("../../../data/kernels/hf.json"))
            .unwrap_or_else(|e| panic!("the bundled kernel counts do not parse: {e}"))
    })
}

/// The code whose recording holds for `model`: its own family's; Gemma's for Gemma 2 (which
/// transformers runs with eager attention, its logits soft-capped: SDPA cannot record it);
/// Llama's, the plainest decoder, for a family not recorded (GPT-NeoX's partial rotary
/// and BLOOM's ALiBi make tensors no unit of the recorder names yet).
pub fn recorded_family(model: &Model) -> &'static str {
    match model.model_type {
        f @ ("llama" | "mistral" | "qwen2" | "qwen3" | "gemma" | "phi3" | "gpt2") => f,
        "gemma2" => "gemma",
        _ => "llama",
    }
}

/// The recorded step of `model`'s family at `precision` (fp8 is not transformers'), with
/// or without full checkpointing.
pub fn step(model: &Model, precision: Precision, checkpointed: bool) -> Option<&'static Step> {
    let precision = match precision {
        Precision::Fp32 => "fp32",
        Precision::Bf16 | Precision::Mixed => "bf16",
        Precision::Amp => "amp",
        Precision::Fp8 => return None,
    };
    let ckpt = if checkpointed { "full" } else { "none" };
    // Keys are few and fixed: look them up without building a string on every call (the
    // search asks for thousands of configurations).
    static KEYS: OnceLock<BTreeMap<(&'static str, &'static str, &'static str), &'static Step>> = OnceLock::new();
    let keys = KEYS.get_or_init(|| {
        recorded()
            .iter()
            .filter_map(|(k, s)| {
                let mut it = k.split('/');
                let (f, p, c) = (it.next()?, it.next()?, it.next()?);
                let leak = |x: &str| -> &'static str { Box::leak(x.to_string().into_boxed_str()) };
                Some(((leak(f), leak(p), leak(c)), s))
            })
            .collect()
    });
    keys.get(&(recorded_family(model), precision, ckpt)).copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::preset;

    #[test]
    fn every_recorded_family_parses_at_every_precision() {
        let all = recorded();
        for f in ["llama", "mistral", "qwen2", "qwen3", "gemma", "phi3", "gpt2"] {
            for p in ["fp32", "bf16", "amp"] {
                for c in ["none", "full"] {
                    let s = all.get(&format!("{f}/{p}/{c}")).unwrap_or_else(|| panic!("{f}/{p}/{c} not recorded"));
                    // One SDPA call a layer each way; the recomputed forward's too when checkpointed.
                    assert_eq!(s.forward.layer.attention, 1.0, "{f}/{p}/{c}");
                    let again = if c == "full" { 2.0 } else { 1.0 };
                    assert_eq!(s.backward.layer.attention, again, "{f}/{p}/{c}");
                    assert!(s.forward.layer.kernels > s.forward.layer.matmuls && s.backward.layer.nodes > 0.0);
                }
            }
        }
    }

    #[test]
    fn a_llama_layer_moves_more_per_token_in_the_backward_and_autocast_copies_weights() {
        let m = preset("llama-3-8b").unwrap();
        let at = |p| step(&m, p, false).unwrap();
        let per_token = |s: &Step, backward: bool| {
            let phase = if backward { &s.backward } else { &s.forward };
            phase.layer.traffic.per_token.at(&m)
        };
        let bf16 = at(Precision::Bf16);
        assert!(per_token(bf16, true) > per_token(bf16, false));
        // bf16 weights are used as they are; autocast copies each fp32 weight to bf16
        // (reads 4 bytes, writes 2) in the forward.
        assert!(bf16.forward.layer.traffic.per_param < 0.01);
        let amp = at(Precision::Amp).forward.layer.traffic.per_param;
        assert!((5.9..6.1).contains(&amp), "{amp}");
        // The loss reads and writes the logits in fp32: bytes per token grow with the vocabulary.
        assert!(bf16.forward.rest.traffic.per_token.vocab >= 8.0);
    }
}

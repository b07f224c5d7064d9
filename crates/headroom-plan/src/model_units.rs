//! A model's named dimensions, the units in which the recorded templates and recipes write
//! their tensors' sizes (`"h*f"`: hidden × intermediate), so that one recording scales to
//! every model of its family.

use crate::model::Model;

/// Every unit a template or recipe may name; anything else is refused where they are read.
/// `r` is a LoRA adapter's rank, which the job gives, not the model (1 here); `Er` the rank of
/// peft's one adapter over a stack of experts' weights, E × r (E here).
pub const UNITS: [&str; 18] =
    ["h", "f", "q", "kv", "kf", "kh", "heads", "kv_heads", "d", "V", "E", "k", "P", "one", "qkv", "fs", "r", "Er"];

/// The size of unit `name` in `model` (1 for `one`, and for a name outside [`UNITS`], which
/// the readers refuse before any size is taken).
pub fn unit(model: &Model, name: &str) -> f64 {
    let k = model.experts_per_token.max(1);
    (match name {
        "h" => model.hidden,
        "f" => model.intermediate,
        "q" => model.heads * model.head_dim,
        "kv" => model.kv_heads * model.head_dim,
        "qkv" => (model.heads + 2 * model.kv_heads) * model.head_dim,
        "kf" => k * model.intermediate,
        "kh" => k * model.hidden,
        "heads" => model.heads,
        "kv_heads" => model.kv_heads,
        "d" => model.head_dim,
        "V" => model.vocab,
        "E" | "Er" => model.experts.max(1),
        "k" => k,
        "P" => model.max_position,
        // Qwen2-MoE's shared expert's width.
        "fs" => model.shared_expert,
        _ => 1,
    }) as f64
}

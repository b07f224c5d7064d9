//! # headroom-plan
//!
//! Planning GPU memory before a run: the models ([`model`], from presets or a
//! Hugging Face `config.json`, with exact parameter counts), the GPUs
//! ([`gpu`]), the training and inference memory models ([`train`],
//! [`infer`], with transformers' measured activations in [`recipe`] and
//! [`forward_recipe`], and vLLM's start-up budget in [`engine`]), the recommendation search ([`search`]), engine configs
//! ([`emit`]), the optimal activation-checkpointing solver ([`checkpoint`]),
//! and the step's phases fitted to a snapshot of the user's own run
//! ([`calibrate`]).

// The catalogs live in their own crate, which the KV crate reaches without the planner.
pub use headroom_catalog::UnknownGpu;
pub use headroom_catalog::{gpu, json, model, names};
pub mod bnb;
pub mod calibrate;
pub mod checkpoint;
pub mod deepspeed;
pub mod eager;
mod error;
pub use error::{CannotEmit, InvalidConfig};
pub mod emit;
pub mod engine;
pub mod forward_recipe;
pub mod infer;
pub mod job;
pub mod kernel;
pub mod live;
pub mod parallel;
pub mod pipelining;
pub mod placement;
pub mod program;
pub mod program_template;
pub mod recipe;
pub mod replay;
pub mod search;
pub mod sglang;
pub mod step;
pub mod step_recipe;
pub mod synth;
pub mod time;
pub mod train;

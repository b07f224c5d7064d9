//! # headroom-plan
//!
//! Planning GPU memory before a run. A training job is planned along one spine, each stage
//! a module that imports only those above it:
//!
//! 1. the job ([`job`], [`request`]): a model ([`model`], from presets or a Hugging Face
//!    `config.json`) and a GPU ([`gpu`]) from the catalogs (`headroom-catalog`), and how it
//!    trains, resolved and checked once;
//! 2. where its parameters live ([`placement`], [`parallel`], [`pipelining`]);
//! 3. its step program ([`program`]): what it allocates and frees, in order;
//! 4. who builds that program ([`builders`]): a table of builders, one per framework's code,
//!    each saying whether it serves the job and why not; the closed form ([`closed_form`],
//!    with transformers' recorded activations in [`recipe`], [`step_recipe`] and [`phases`])
//!    is the closed-form builders' input;
//!    Checkpointing by layers is also a transform of a program ([`recompute`]), for programs
//!    that name their layers;
//! 5. the user's calibration ([`calibration`], fitted by [`calibrate`] to the steps
//!    `headroom_trace::recorded_step` finds in a snapshot of their run), a transform of the
//!    program;
//! 6. the replay ([`replay`]) through headroom's allocator;
//! 7. the step time ([`time`], [`kernel`], [`eager`]);
//! 8. the estimate ([`estimate`]), and over it the search ([`search`]) and the engine
//!    configs ([`emit`]).
//!
//! Inference ([`infer`]) plans vLLM's start-up budget ([`engine`]), SGLang's ([`sglang`]) and
//! transformers' forward ([`forward_recipe`], [`bnb`]). [`checkpoint`] is the optimal
//! activation-checkpointing solver.

// The catalogs live in their own crate, which the KV crate reaches without the planner.
pub use headroom_catalog::UnknownGpu;
pub use headroom_catalog::{gpu, json, model, names};
pub mod bnb;
pub mod builders;
pub mod calibrate;
pub mod calibration;
pub mod checkpoint;
pub mod closed_form;
pub mod deepspeed;
pub mod eager;
mod error;
pub use error::{CannotEmit, InvalidConfig};
pub mod emit;
pub mod engine;
pub mod estimate;
pub mod forward_recipe;
pub mod infer;
pub mod job;
pub mod job_file;
pub mod kernel;
mod law_fit;
pub mod model_units;
pub mod parallel;
pub mod phases;
pub mod pipelining;
pub mod placement;
pub mod program;
pub mod program_template;
pub mod recipe;
pub mod recompute;
pub mod recorded_laws;
pub mod recording;
pub mod remedy;
pub mod replay;
pub mod request;
pub mod search;
pub mod sglang;
pub mod step_recipe;
mod template_file;
pub mod time;

//! # headroom-catalog
//!
//! What headroom knows by name, for the planner (`headroom-plan`) and the serving simulator
//! (`headroom-kv`) alike, so that neither needs the other to name a model or a GPU:
//!
//! - [`model`]: transformers as memory and time see them (widths, layers, heads, which layers
//!   slide, parameter counts), read from a Hugging Face `config.json`, and the presets users
//!   name, which are such files read by the same reader;
//! - [`gpu`]: the GPU catalog: memory, bandwidth, dense peaks, links and the measured
//!   matrix-multiply efficiencies, each figure with its source;
//! - [`json`]: JSON input files read strictly (a key given twice is an error);
//! - [`names`]: the stable names of enumerated choices, which command lines accept and JSON
//!   prints.

pub mod gpu;
pub mod json;
pub mod model;
pub mod names;

pub use gpu::UnknownGpu;

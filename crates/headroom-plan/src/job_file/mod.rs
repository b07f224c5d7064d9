//! The job as the files users already have describe it: torchtitan's job TOML, a DeepSpeed
//! JSON (with transformers' `TrainingArguments` for its `"auto"` values), accelerate's config
//! YAML, a torchtune recipe YAML, or a `vllm serve` / SGLang `launch_server` command line.
//! Each reader turns its format into the planner's request ([`TrainRequest`] or
//! [`InferRequest`]), the same one the command line's flags make, and names every field it
//! does not honour ([`Ignored`]) rather than drop it: a setting the planner cannot express,
//! one it reads differently, or one with no bearing on memory.

mod accelerate;
mod deepspeed;
mod fields;
mod serve_args;
pub(crate) mod torchtitan;
mod torchtune;

use crate::names::{named, Named};
use crate::request::{InferRequest, TrainRequest};
pub(crate) use fields::Fields;

/// The formats `--config` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Torchtitan,
    DeepSpeed,
    Accelerate,
    Torchtune,
    Serve,
}

named!(Format {
    Torchtitan => ("torchtitan", "torchtitan's job TOML"),
    DeepSpeed => ("deepspeed", "a DeepSpeed config JSON (with --hf-args: transformers' TrainingArguments)"),
    Accelerate => ("accelerate", "accelerate's config YAML"),
    Torchtune => ("torchtune", "a torchtune recipe YAML"),
    Serve => ("serve", "a `vllm serve` or SGLang `launch_server` command line"),
});

/// A field of the file the plan does not follow, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ignored {
    /// Its path in the file (`training.max_norm`, `--enforce-eager`).
    pub field: String,
    pub why: String,
}

/// Why a field whose setting has no bearing on the memory of a step is left out.
pub const NO_BEARING: &str = "no bearing on memory";

/// The job a file asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Asked {
    Train(TrainRequest),
    Infer(InferRequest),
}

/// The model a file names: a preset, a Hugging Face id or a path, and the field that names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelName {
    pub name: String,
    pub field: String,
}

/// What a job file says.
#[derive(Clone, Debug, PartialEq)]
pub struct Read {
    pub format: Format,
    /// `None` where the file names no model (DeepSpeed's and accelerate's do not).
    pub model: Option<ModelName>,
    pub asked: Asked,
    pub ignored: Vec<Ignored>,
}

impl Read {
    /// The training job the file asks for, if it asks for one.
    pub fn train(&self) -> Option<&TrainRequest> {
        match &self.asked {
            Asked::Train(r) => Some(r),
            Asked::Infer(_) => None,
        }
    }

    /// The serving job the file asks for, if it asks for one.
    pub fn infer(&self) -> Option<&InferRequest> {
        match &self.asked {
            Asked::Infer(r) => Some(r),
            Asked::Train(_) => None,
        }
    }
}

/// A file `--config` cannot read, naming the file and the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {why}")]
pub struct Refused {
    pub file: String,
    pub why: String,
}

/// The format of `file` (its name) holding `text`: by its extension, and where that says
/// YAML, by its keys; a serve command line by its program.
pub fn detect(file: &str, text: &str) -> Result<Format, String> {
    let lower = file.to_ascii_lowercase();
    let ext = lower.rsplit_once('.').map(|(_, e)| e).unwrap_or("");
    match ext {
        "toml" => Ok(Format::Torchtitan),
        "json" => Ok(Format::DeepSpeed),
        "yaml" | "yml" => {
            let v: serde_json::Value = serde_norway::from_str(text).map_err(|e| format!("not YAML: {e}"))?;
            if accelerate::looks_like(&v) {
                Ok(Format::Accelerate)
            } else if torchtune::looks_like(&v) {
                Ok(Format::Torchtune)
            } else {
                Err("a YAML file that is neither accelerate's config (no distributed_type or num_processes) nor a \
                     torchtune recipe (no model._component_)"
                    .into())
            }
        }
        _ if serve_args::looks_like(text) => Ok(Format::Serve),
        _ => Err(format!(
            "an unknown format: --config reads {}: a .toml, .json, .yaml or .yml file, or a file holding a `vllm \
             serve` or `python -m sglang.launch_server` line",
            Format::ALL.iter().map(|f| f.help()).collect::<Vec<_>>().join("; ")
        )),
    }
}

/// Reads `text`, the contents of `file`; `hf_args`, with a DeepSpeed file, is transformers'
/// `TrainingArguments` as JSON (its name and its text), which fill the DeepSpeed file's
/// `"auto"` values.
pub fn read(file: &str, text: &str, hf_args: Option<(&str, &str)>) -> Result<Read, Refused> {
    let refused = |why: String| Refused { file: file.to_string(), why };
    let format = detect(file, text).map_err(refused)?;
    if hf_args.is_some() && format != Format::DeepSpeed {
        return Err(refused(format!(
            "--hf-args fills a DeepSpeed config's \"auto\" values; this is {}",
            format.help()
        )));
    }
    let read = match format {
        Format::Torchtitan => torchtitan::read(text),
        Format::DeepSpeed => deepspeed::read(text, hf_args),
        Format::Accelerate => accelerate::read(text),
        Format::Torchtune => torchtune::read(text),
        Format::Serve => serve_args::read(text),
    };
    read.map_err(refused)
}

/// A share in (0, 1], as the engines' memory fractions are.
pub(crate) fn share(field: &str, x: f64) -> Result<f64, String> {
    if x > 0.0 && x <= 1.0 {
        Ok(x)
    } else {
        Err(format!("{field}: {x} is not in (0, 1]"))
    }
}

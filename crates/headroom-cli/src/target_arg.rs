//! The model and the GPU a command is about: `--model`, `--gpu`, `--gpu-memory`.

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use headroom_alloc::units::parse_size;
use headroom_plan::gpu::{gpu, GpuSpec};
use headroom_plan::model::{preset, Model};
use std::path::Path;

#[derive(Args, Debug)]
pub struct Target {
    /// Model preset (llama-3-8b, mistral-7b, qwen2.5-7b, gpt2, ...) or the Hugging Face id
    /// of the repository a preset mirrors (meta-llama/Meta-Llama-3-8B), or a Hugging Face
    /// config.json, or a model directory that holds one.
    #[arg(long, required = true)]
    pub model: Option<String>,
    /// GPU (a100-80gb, h100-sxm, h200, l4, rtx-4090, ...), or a cloud name: AWS's instance
    /// families (g5 / a10g, g6, p4d, p4de, p5, ...; p4d.24xlarge too) and GCP's machine types
    /// (a2-highgpu, a2-ultragpu, a3, g2).
    #[arg(long)]
    pub gpu: String,
    /// Override the GPU's memory (bytes, or e.g. 24GiB).
    #[arg(long, value_name = "BYTES")]
    pub gpu_memory: Option<String>,
}

/// The least `--gpu-memory` taken as meant: below it, a unit was most likely left out.
const MIN_GPU_MEMORY: u64 = 1 << 20;

impl Target {
    /// The model and the GPU, with the memory override applied.
    pub fn resolve(&self) -> Result<(Model, GpuSpec)> {
        let Some(name) = self.model.as_deref() else { bail!("--model: give the model") };
        self.resolve_as(name)
    }

    /// `model` (a preset, a preset's Hub id, a config.json or a model directory) on the GPU.
    pub fn resolve_as(&self, model: &str) -> Result<(Model, GpuSpec)> {
        let model = Self::model(model)?;
        Ok((model, self.gpu()?))
    }

    /// The GPU, with the memory override applied.
    pub fn gpu(&self) -> Result<GpuSpec> {
        let mut g = gpu(&self.gpu).map_err(|e| anyhow!(e))?;
        if let Some(m) = &self.gpu_memory {
            let bytes = parse_size(m).map_err(|e| anyhow!("--gpu-memory: {e}"))?;
            if bytes < MIN_GPU_MEMORY {
                bail!("--gpu-memory {m:?} is less than 1 MiB; give a unit, e.g. 24GiB");
            }
            g.memory_bytes = bytes;
        }
        Ok(g)
    }

    pub fn model(arg: &str) -> Result<Model> {
        let path = Path::new(arg);
        let file = if path.is_dir() {
            let inner = path.join("config.json");
            if !inner.is_file() {
                bail!("--model {arg}: the directory has no config.json");
            }
            inner
        } else if path.is_file() {
            path.to_path_buf()
        } else {
            return match preset(arg) {
                Ok(m) => Ok(m),
                // Something that looks like a path is a file that is not there, not an unknown preset.
                Err(e) if arg.contains(['/', '\\']) || arg.ends_with(".json") => {
                    bail!(
                        "--model {arg}: no such file (a preset name, a preset's Hugging Face id, a config.json or a \
                         model directory): {e}"
                    )
                }
                Err(e) => Err(anyhow!(e)),
            };
        };
        let bytes = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
        let text = String::from_utf8(bytes).map_err(|e| {
            anyhow!("reading {}: not UTF-8 text (byte {} is not)", file.display(), e.utf8_error().valid_up_to() + 1)
        })?;
        // `llama-3-8b/config.json` is named after its directory; `cs336-medium.json` after itself.
        let named_by = if file.file_name().is_some_and(|n| n == "config.json") {
            file.parent().and_then(|p| p.file_name())
        } else {
            file.file_stem()
        };
        let name = named_by.and_then(|n| n.to_str()).unwrap_or(arg);
        Model::from_hf_config(&text, name).with_context(|| format!("reading {}", file.display()))
    }
}

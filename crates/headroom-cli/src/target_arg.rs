//! The model and the GPU a command is about: `--model`, `--gpu`, `--gpu-memory`.

use crate::bytes_arg::parse_bytes;
use anyhow::{anyhow, Context, Result};
use clap::Args;
use headroom_plan::gpu::{gpu, GpuSpec};
use headroom_plan::model::{preset, Model};
use std::path::Path;

#[derive(Args, Debug)]
pub struct Target {
    /// Model preset (llama-3-8b, mistral-7b, qwen2.5-7b, gpt2, ...) or the path of a Hugging Face config.json.
    #[arg(long)]
    pub model: String,
    /// GPU (a100-80gb, h100-sxm, h200, l4, rtx-4090, ...).
    #[arg(long)]
    pub gpu: String,
    /// Override the GPU's memory (bytes, or e.g. 24GiB).
    #[arg(long, value_name = "BYTES")]
    pub gpu_memory: Option<String>,
}

impl Target {
    /// The model and the GPU, with the memory override applied.
    pub fn resolve(&self) -> Result<(Model, GpuSpec)> {
        let path = Path::new(&self.model);
        let model = if path.is_file() {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", self.model))?;
            let name = path.parent().and_then(|p| p.file_name()).and_then(|n| n.to_str()).unwrap_or(&self.model);
            Model::from_hf_config(&text, name).with_context(|| format!("reading {}", self.model))?
        } else {
            preset(&self.model).map_err(|e| anyhow!(e))?
        };
        let mut g = gpu(&self.gpu).map_err(|e| anyhow!(e))?;
        if let Some(m) = &self.gpu_memory {
            g.memory_bytes = parse_bytes(m).context("--gpu-memory")?;
        }
        Ok((model, g))
    }
}

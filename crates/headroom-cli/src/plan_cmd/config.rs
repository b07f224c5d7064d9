//! `--config FILE`: the job file read by the library's reader ([`job_file`]), the model it
//! names, and what the plan did not honour of it, named in the output.

use super::PlanArgs;
use anyhow::{anyhow, bail, Context, Result};
use headroom_plan::gpu::GpuSpec;
use headroom_plan::job::Framework;
use headroom_plan::job_file::{self, Asked, Format, Read, NO_BEARING};
use headroom_plan::model::Model;
use headroom_plan::names::Named;
use headroom_plan::request::{InferRequest, TrainRequest};
use headroom_plan::search::Held;
use serde_json::{json, Value};
use std::path::Path;

/// A `--config` file, read.
pub(super) struct Loaded {
    pub path: String,
    pub read: Read,
}

impl Loaded {
    pub fn train(&self) -> Option<&TrainRequest> {
        self.read.train()
    }

    pub fn infer(&self) -> Option<&InferRequest> {
        self.read.infer()
    }
}

fn text(path: &Path, flag: &str) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("{flag} {}", path.display()))?;
    String::from_utf8(bytes).map_err(|e| {
        anyhow!("{flag} {}: not UTF-8 text (byte {} is not)", path.display(), e.utf8_error().valid_up_to() + 1)
    })
}

/// The `--config` file (and `--hf-args`), read; `None` without `--config`.
pub(super) fn load(a: &PlanArgs) -> Result<Option<Loaded>> {
    let Some(path) = &a.config else { return Ok(None) };
    let name = path.display().to_string();
    let body = text(path, "--config")?;
    let hf = a.hf_args.as_deref().map(|p| Ok::<_, anyhow::Error>((p.display().to_string(), text(p, "--hf-args")?)));
    let hf = hf.transpose()?;
    let read = job_file::read(&name, &body, hf.as_ref().map(|(n, t)| (n.as_str(), t.as_str())))?;
    match read.asked {
        Asked::Train(_) if a.infer => {
            bail!("{name}: {} is a training job: leave out --infer", read.format.help())
        }
        Asked::Infer(_) if a.train => bail!("{name}: a serving command line plans inference: leave out --train"),
        _ => {}
    }
    Ok(Some(Loaded { path: name, read }))
}

/// The model (`--model`, else the file's) and the GPU.
pub(super) fn target(a: &PlanArgs, file: Option<&Loaded>) -> Result<(Model, GpuSpec)> {
    if a.target.model.is_none() && file.is_none() {
        bail!(
            "give --model (a preset such as llama-3-8b, a Hugging Face config.json or a model directory), or \
             --program FILE to plan a step you recorded (python -m headroom_gpu record), or --config FILE"
        );
    }
    let Some(f) = file.filter(|_| a.target.model.is_none()) else { return a.target.resolve() };
    let Some(m) = &f.read.model else {
        bail!("{}: {} names no model: give --model", f.path, f.read.format.help());
    };
    crate::target_arg::Target::model(&m.name).with_context(|| format!("{}: {}", f.path, m.field))?;
    a.target.resolve_as(&m.name)
}

/// What `--recommend` holds: what the flags fixed, and beside them the precision and the
/// framework a training job's file says, since the file describes the job the user runs.
pub(super) fn held(a: &PlanArgs, file: Option<&Loaded>) -> Held {
    let mut held = a.held();
    if let Some(t) = file.and_then(Loaded::train) {
        held.precision.get_or_insert(t.precision);
        if t.framework != Framework::Auto {
            held.framework.get_or_insert(t.framework);
        }
    }
    held
}

/// Whether the file's job fine-tunes a pretrained model (torchtune's recipes do).
pub(super) fn fine_tuning(file: Option<&Loaded>) -> bool {
    file.is_some_and(|f| f.read.format == Format::Torchtune)
}

/// `--json`'s `config` record: the file, its format and what was not honoured.
pub(super) fn json(file: Option<&Loaded>, out: &mut Value) {
    let Some(f) = file else { return };
    let ignored: Vec<Value> = f.read.ignored.iter().map(|i| json!({"field": i.field, "why": i.why})).collect();
    out["config"] = json!({
        "file": f.path,
        "format": f.read.format.name(),
        "model": f.read.model.as_ref().map(|m| json!({"name": m.name, "field": m.field})),
        "not_honoured": ignored,
    });
}

/// The text's closing lines: the file, what of it the plan does not follow and why, and the
/// fields with no bearing on memory in one line.
pub(super) fn text_lines(file: Option<&Loaded>) -> String {
    let Some(f) = file else { return String::new() };
    let mut out = format!("\nJob file: {} ({})\n", f.path, f.read.format.help());
    let (quiet, loud): (Vec<_>, Vec<_>) = f.read.ignored.iter().partition(|i| i.why == NO_BEARING);
    if !loud.is_empty() {
        out.push_str("  not honoured:\n");
        for i in loud {
            out.push_str(&format!("    {}: {}\n", i.field, i.why));
        }
    }
    if !quiet.is_empty() {
        let names: Vec<&str> = quiet.iter().map(|i| i.field.as_str()).collect();
        out.push_str(&format!("  {NO_BEARING}: {}\n", names.join(", ")));
    }
    out
}

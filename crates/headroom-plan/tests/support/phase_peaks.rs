//! A replayed step's live peaks held to a recorded case's (`peak_bytes`, and `phases`:
//! `forward`, `backward`, `optimizer`): the table row docs/VALIDATION.md shows, printed, and
//! whether the step's peak and every phase's are within the tolerance.

use headroom_plan::builders::hf::{cpu_peaks, cpu_peaks_of};
use headroom_plan::job::TrainConfig;
use headroom_plan::model::Model;
use serde_json::Value;

/// `Err` names the case where no template serves it or a peak is outside `tolerance`. `key`
/// names the template replayed where it is not the one the CPU's job picks (SDPA's math path).
/// `cfg.loss_lives` is the loop the truth's script ran: it picks the steady step compared.
pub fn within(
    label: &str,
    case: &Value,
    model: &Model,
    cfg: &TrainConfig,
    key: Option<&str>,
    tolerance: f64,
) -> Result<(), String> {
    let peaks = match key {
        Some(k) => cpu_peaks_of(model, cfg, k),
        None => cpu_peaks(model, cfg),
    };
    let Some((phases, peak)) = peaks else {
        return Err(format!("{label}: no template serves it"));
    };
    let recorded = case["peak_bytes"].as_f64().expect("peak");
    let err = |p: u64, key: &str| p as f64 / case["phases"][key].as_f64().expect("phase") - 1.0;
    let e = peak as f64 / recorded - 1.0;
    let errs =
        [err(phases.forward, "forward"), err(phases.backward, "backward"), err(phases.optimizer_step, "optimizer")];
    println!(
        "| {label} | {:.3} MiB | {:.3} MiB | {:+.3}% | {:+.3}% | {:+.3}% | {:+.3}% |",
        recorded / 1048576.0,
        peak as f64 / 1048576.0,
        100.0 * e,
        100.0 * errs[0],
        100.0 * errs[1],
        100.0 * errs[2]
    );
    if e.abs() > tolerance || errs.iter().any(|x| x.abs() > tolerance) {
        return Err(label.to_string());
    }
    Ok(())
}

//! The inference templates against transformers' `generate` and forward run for real on the
//! CPU (`data/validation/infer_truth.json`, `scripts/validate/infer_truth.py`): configs,
//! depths and shapes no template was recorded at. The planner's program for each, on the
//! CPU (no GPU's workspace), its live peak against the measured one. Rows over bitsandbytes'
//! layers ran under what its CUDA kernels allocate (`quant_infer.py`'s `CudaPath`), as their
//! templates were recorded.

use headroom_plan::infer::recorded;
use headroom_plan::model::Model;
use serde_json::Value;

/// Declared with the measurements, before the first run: the inference forwards' tolerance.
const TOLERANCE: f64 = 0.03;

#[test]
fn inference_templates_match_real_cpu_runs() {
    let text = include_str!("../../../data/validation/infer_truth.json");
    let doc: Value = serde_json::from_str(text).expect("the ground truth parses");
    let rows = doc["rows"].as_array().expect("rows");
    let mut out = Vec::new();
    for r in rows {
        let family = r["family"].as_str().unwrap();
        let m = Model::from_hf_config(&r["config"].to_string(), family).expect("a model");
        let (batch, seq, new_tokens) =
            (r["batch"].as_u64().unwrap(), r["seq"].as_u64().unwrap(), r["new_tokens"].as_u64().unwrap());
        let mode = r["mode"].as_str().unwrap();
        // The CPU runs its fused SDPA kernel at every precision unless the math path is asked
        // for (`sdpa-math`, a GPU's for fp32 with grouped key-value heads): the template
        // recorded there; eager attention (BLOOM's, Gemma-2's, and Llama's asked for) its own.
        let attn = r["attn"].as_str().unwrap_or("sdpa");
        // T5 v1.1 (its MLP gated) under keys of its own.
        let mlp = if m.gated_mlp && m.model_type == "t5" { "/gated" } else { "" };
        // Over bitsandbytes' layers (`quant`: nf4, int8), the templates under keys ending so.
        let quant = r["quant"].as_str().map(|q| format!("/{q}")).unwrap_or_default();
        let key = format!("{}/{mode}/{}/{attn}{mlp}{quant}", m.model_type, r["precision"].as_str().unwrap());
        let pasts = if mode == "generate" { recorded::generate_pasts(&key, seq, new_tokens) } else { Vec::new() };
        let p = recorded::program(&m, &key, seq, &pasts, None);
        p.check().expect("well formed");
        let planned = recorded::call_peak(&p, &p.sizes(batch, 1)) as f64;
        // Over bitsandbytes' layers, the peak less the CPU kernels' scratch, which the templates
        // leave out (`infer_truth.py`'s `scratch_free_peak`: declared after BERT's NF4 rows).
        let measured = r["peak_without_cpu_scratch"].as_f64().unwrap_or_else(|| r["peak_bytes"].as_f64().unwrap());
        let error = planned / measured - 1.0;
        let label = format!(
            "{key} {batch}×{seq}{}",
            if mode == "generate" { format!(" +{new_tokens}") } else { String::new() }
        );
        let raw = r["peak_bytes"].as_f64().unwrap();
        out.push((label, r["split"].as_str().unwrap().to_string(), measured, planned, error, planned / raw - 1.0));
    }
    if std::env::var_os("GROUND_TRUTH_TABLE").is_some() {
        println!("| job | split | measured | planned | error | error against the raw peak |");
        println!("|---|---|---:|---:|---:|---:|");
        for (label, split, measured, planned, error, raw) in &out {
            println!(
                "| {label} | {split} | {:.2} MiB | {:.2} MiB | {:+.2}% | {:+.2}% |",
                measured / 1048576.0,
                planned / 1048576.0,
                error * 100.0,
                raw * 100.0
            );
        }
    }
    assert!(out.len() >= 180, "{} rows", out.len());
    let outside: Vec<_> = out.iter().filter(|r| r.4.abs() > TOLERANCE).map(|r| (&r.0, r.4)).collect();
    assert!(outside.is_empty(), "outside ±{}%: {outside:?}", TOLERANCE * 100.0);
}

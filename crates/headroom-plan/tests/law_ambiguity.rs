//! No shipped template holds a size law its recording cannot tell from another
//! (`headroom_plan::program_template::law_ambiguity`, `scripts/validate/law_ambiguity.py`'s
//! rule): such a law is right at the recording's heads and wrong on a model with other head
//! ratios. The recorders refuse one, and every bundled template was recorded at heads whose
//! ratios no element widths share (15 over 5, `step_programs.GQA`).

use headroom_plan::program_template::{keys, template};

#[test]
fn no_shipped_template_holds_a_law_its_recording_cannot_tell_from_another() {
    let mut held = Vec::new();
    for key in keys() {
        let Some(parsed) = template(key) else { continue };
        let found = parsed.rival_laws();
        if let Some(r) = found.first() {
            held.push(format!(
                "{key}: {} tensor(s), the first tensor {}: {} {:?} or {:?}",
                found.len(),
                r.tensor,
                r.kind,
                r.mine,
                r.rivals
            ));
        }
    }
    assert!(
        held.is_empty(),
        "templates with a law that reads two ways at their recording (record them at 15 heads over 5):\n{}",
        held.join("\n")
    );
}

/// A recording where a query, key or head is as wide as another of the model's widths cannot
/// tell which one a tensor follows: LLM.int8() inference of Gemma-2, first recorded again at 15
/// heads of 128 on a hidden size of 1,920, planned Gemma's query weights as `h*h` and its CPU
/// rows 5.5–6.3% over.
#[test]
fn no_shipped_template_was_recorded_where_a_head_width_is_another_width() {
    let shared: Vec<String> = keys()
        .filter_map(|key| {
            let family = key.split('/').next()?;
            let found = template(key)?.shared_widths(family);
            (!found.is_empty()).then(|| format!("{key}: {found:?}"))
        })
        .collect();
    assert!(shared.is_empty(), "recorded where a head-tied width is another width:\n{}", shared.join("\n"));
}

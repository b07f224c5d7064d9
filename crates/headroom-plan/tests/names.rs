//! The planner's choices keep the names docs/JSON.md publishes, and each reads back as itself.

use headroom_plan::emit::Engine;
use headroom_plan::infer::WeightFormat;
use headroom_plan::job::{Attention, Framework, LoraTargets, LossLife, Offload, Optimizer, PipelineStage, Precision};
use headroom_plan::model::Head;
use headroom_plan::names::Named;

fn round_trips<T: Named + PartialEq + std::fmt::Debug>() {
    for &v in T::ALL {
        assert_eq!(T::from_name(v.name()), Some(v), "{v:?}");
        assert_eq!(T::from_arg(v.arg()), Some(v), "{v:?}");
    }
    let mut names: Vec<&str> = T::ALL.iter().map(|v| v.name()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), T::ALL.len(), "names are distinct");
}

#[test]
fn every_name_reads_back_as_its_value() {
    round_trips::<Precision>();
    round_trips::<Optimizer>();
    round_trips::<Attention>();
    round_trips::<Framework>();
    round_trips::<Head>();
    round_trips::<Offload>();
    round_trips::<LoraTargets>();
    round_trips::<PipelineStage>();
    round_trips::<Engine>();
    round_trips::<WeightFormat>();
    round_trips::<LossLife>();
}

/// The names docs/JSON.md publishes.
#[test]
fn published_names_stay() {
    assert_eq!(Precision::Mixed.name(), "mixed");
    assert_eq!(Optimizer::Adam8bit.name(), "adam8bit");
    assert_eq!(Optimizer::SgdMomentum.name(), "sgd-momentum");
    assert_eq!(Attention::Sdpa.name(), "sdpa");
    assert_eq!(Framework::HuggingFace.name(), "hf");
    assert_eq!(Offload::OptimizerAndParams.name(), "optimizer+params");
    assert_eq!(Offload::OptimizerAndParams.arg(), "params");
    assert_eq!(PipelineStage::Only.name(), "only");
    assert_eq!(Head::SeqCls.name(), "seq-cls");
    let loops: Vec<&str> = LossLife::ALL.iter().map(|l| l.name()).collect();
    assert_eq!(loops, ["trainer", "function", "inline"]);
    assert_eq!(LossLife::default(), LossLife::Trainer);
}

/// The plan's `--json` keeps its phase names (`peak_phase`, `phases`): the optimizer step is
/// `optimizer` there, where `headroom inspect` writes the shared vocabulary's `optimizer_step`.
#[test]
fn the_plan_names_phases_as_docs_json_publishes() {
    use headroom_plan::program::{phase_name, Phase};
    let names: Vec<&str> = [Phase::Setup].into_iter().chain(Phase::STEP).map(phase_name).collect();
    assert_eq!(names, ["setup", "forward", "backward", "optimizer"]);
    assert_eq!(Phase::OptimizerStep.name(), "optimizer_step");
}

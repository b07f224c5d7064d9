//! The snapshot the repository ships (data/snapshots/qwen3-1.7b-train.pickle.gz:
//! Qwen3-1.7B built on an H200 under `torch.device("cuda")`, two AdamW steps,
//! C++ and Python frames) says what its memory is.

use headroom_inspect::frames::{Phase, Role};
use headroom_inspect::{inspect_device, DeviceReport, InspectOptions};
use headroom_trace::snapshot::{read_snapshot_file, TraceAction};
use std::path::PathBuf;

fn report() -> DeviceReport {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/snapshots/qwen3-1.7b-train.pickle.gz");
    let snap = read_snapshot_file(&path).unwrap();
    inspect_device(&snap, 0, &InspectOptions::default())
}

fn role_bytes(r: &DeviceReport, role: Role) -> u64 {
    r.roles.iter().filter(|x| x.role == role).map(|x| x.bytes).sum()
}

/// The weights `nn.Linear` and `nn.Embedding` allocate in their `__init__`
/// are parameters, not activations of a forward; what the peak holds besides
/// is each weight's gradient, AdamW's two moments per weight, and the
/// optimizer step's temporaries.
#[test]
fn weights_built_by_module_init_are_parameters() {
    let r = report();
    let weights = 3_441_688_576; // 310 bf16 tensors of Qwen3-1.7B
                                 // With the rotary embedding's two `inv_freq` buffers of 512 bytes.
    assert_eq!(role_bytes(&r, Role::ParametersAndBuffers), weights + 1024, "{:#?}", r.roles);
    assert_eq!(role_bytes(&r, Role::Gradients), weights, "{:#?}", r.roles);
    assert_eq!(role_bytes(&r, Role::OptimizerState), 2 * weights, "{:#?}", r.roles);
    assert_eq!(role_bytes(&r, Role::Temporaries), weights, "{:#?}", r.roles);
    // The peak is in the optimizer step: the forward's activations were freed by the backward,
    // and only the loss is kept.
    assert!(role_bytes(&r, Role::Activations) <= 1024, "{:#?}", r.roles);
    for line in [76, 77, 78, 225, 352] {
        let s = r
            .top_sites
            .iter()
            .find(|s| s.site.site == format!("models/qwen3/modeling_qwen3.py:{line} in __init__"))
            .expect("a layer's __init__ among the top sites");
        assert_eq!((s.role, s.phase), (Role::ParametersAndBuffers, Phase::Setup), "{s:?}");
    }
    let sum: u64 = r.roles.iter().map(|x| x.bytes).sum();
    assert_eq!(sum, r.peak_allocated_bytes);
}

/// Backward allocations are named by the autograd node whose `apply` made
/// them, not by the namespace of the formulas it calls
/// (`torch::autograd::generated::details`).
#[test]
fn backward_sites_are_named_by_their_autograd_node() {
    let r = report();
    let names: Vec<&str> = r.top_sites.iter().map(|s| s.site.site.as_str()).collect();
    assert!(!names.iter().any(|n| n.contains("details")), "{names:?}");
    let mm = r.top_sites.iter().find(|s| s.site.site == "autograd MmBackward0").expect("MmBackward0's gradients");
    assert_eq!((mm.role, mm.phase), (Role::Gradients, Phase::Backward));
    // The tied embedding's gradient is the sum of its two uses' gradients.
    let sum = r.top_sites.iter().find(|s| s.site.site == "autograd InputBuffer::add").expect("the summed gradient");
    assert_eq!(sum.role, Role::Gradients);
    assert!(sum.bytes >= 151_936 * 2048 * 2 && sum.blocks == 1, "one vocabulary × hidden bf16 gradient: {sum:?}");
}

/// Building the model's 28 layers repeats per layer, but it is no step of the
/// workload: no leak note reads the layers' weights as activations.
#[test]
fn building_the_model_is_not_a_repetition_of_the_workload() {
    let r = report();
    assert!(!r.unavailable.iter().any(|l| l.contains("__init__") || l.contains("activations")), "{:#?}", r.unavailable);
    assert!(r.repetitions.as_ref().is_none_or(|reps| !reps.marker_site.contains("__init__")));
}

/// The HTML report holds each allocation for its per-allocation view: one for
/// every `alloc` of the trace and every block live when it began, those still
/// live at the end the snapshot's allocated bytes, each site named; and the
/// page stays small.
#[test]
fn the_html_report_holds_each_allocation() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/snapshots/qwen3-1.7b-train.pickle.gz");
    let snap = read_snapshot_file(&path).unwrap();
    let report = headroom_inspect::inspect("qwen3-1.7b-train.pickle.gz", &snap, &[0], &InspectOptions::default());
    let page = headroom_inspect::html::render(std::slice::from_ref(&report), None);
    let start = page.find("<script type=\"application/json\" class=\"hr-data\">").unwrap();
    let data = &page[start..];
    let data = &data[data.find('>').unwrap() + 1..data.find("</script>").unwrap()];
    let v: serde_json::Value = serde_json::from_str(data).unwrap();
    let a = &v["allocs"];
    let allocs = snap.device_traces[0].iter().filter(|e| e.action == TraceAction::Alloc).count();
    let n = a["t"].as_array().unwrap().len();
    assert_eq!(n, allocs + a["before"].as_u64().unwrap() as usize, "each alloc, and each block live at the start");
    for col in ["d", "s", "k"] {
        assert_eq!(a[col].as_array().unwrap().len(), n, "{col}");
    }
    let unit = a["unit"].as_u64().unwrap();
    let live: u64 =
        (0..n).filter(|&j| a["d"][j].as_i64() == Some(-1)).map(|j| a["s"][j].as_u64().unwrap() * unit).sum();
    assert_eq!(live, report.devices[0].now.allocated_bytes, "those live at the end hold what the snapshot holds");
    for k in a["k"].as_array().unwrap() {
        let id = k.to_string();
        assert!(v["sites"].get(&id).is_some() || a["sites"].get(&id).is_some(), "site {id} is named");
    }
    // 665 kB without the allocations; they add about 280 kB for 10,628 allocations.
    assert!(page.len() < 1_000_000, "{} bytes", page.len());
}

//! A training run with frames: made with headroom's allocator, written as
//! the JSON snapshot PyTorch's viewer reads, with the frames each call site
//! would have recorded added to its entries.

#![allow(dead_code)]

use headroom_alloc::{AllocatorConfig, DeviceCachingAllocator, SimDevice};
use headroom_trace::snapshot::{read_snapshot, MemorySnapshot};
use headroom_trace::snapshot_file::{write_snapshot, SnapshotFormat};
use serde_json::{json, Value};

const MIB: u64 = 1 << 20;
const TORCH: &str = "/venv/lib/python3.12/site-packages/torch";

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Site {
    Activation(u32),
    Gradient,
    OptimizerState,
    Leak,
    Eval,
    Temp,
}

impl Site {
    pub fn file(self) -> &'static str {
        match self {
            Site::Leak => "/home/me/proj/metrics.py",
            _ => "/home/me/proj/train.py",
        }
    }

    /// Frames innermost first, as PyTorch records them.
    fn frames(self) -> Value {
        let f = |file: &str, line: u32, name: &str| json!({"filename": file, "line": line, "name": name});
        match self {
            Site::Activation(layer) => json!([
                f(&format!("{TORCH}/nn/functional.py"), 2300, "linear"),
                f("/home/me/proj/model.py", 10, &format!("forward{}", ["", "", "", ""][layer as usize])),
                f(&format!("{TORCH}/nn/modules/module.py"), 1750, "_call_impl"),
                f("/home/me/proj/train.py", 20, "train_step"),
            ]),
            Site::Gradient => json!([
                f("??", 0, "torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor>&&)"),
                f("??", 0, "torch::autograd::Engine::evaluate_function(...)"),
            ]),
            Site::OptimizerState => json!([
                f(&format!("{TORCH}/optim/adamw.py"), 400, "_init_group"),
                f(&format!("{TORCH}/optim/optimizer.py"), 500, "wrapper"),
                f("/home/me/proj/train.py", 30, "train_step"),
            ]),
            Site::Leak => {
                json!([f("/home/me/proj/metrics.py", 7, "record"), f("/home/me/proj/train.py", 40, "train_step"),])
            }
            Site::Eval => json!([f("/home/me/proj/train.py", 50, "evaluate")]),
            Site::Temp => json!([f("/home/me/proj/train.py", 22, "train_step")]),
        }
    }
}

/// `steps` training steps (4 layers of 8 MiB activations, backward, an
/// optimizer state made at the first step, 2 MiB kept every step by a
/// metrics list); with `oom`, then an evaluation that fragments a cached
/// segment and fails to get 100 MiB on a 256 MiB device.
pub fn training_run(steps: usize, oom: bool) -> MemorySnapshot {
    read_snapshot(std::io::Cursor::new(training_run_json(steps, oom))).unwrap()
}

/// [`training_run`] as the JSON file's bytes.
pub fn training_run_json(steps: usize, oom: bool) -> Vec<u8> {
    run_json(steps, oom, 8 * MIB, 256 * MIB)
}

/// The same run without the evaluation, each layer's activation (and gradient) `activation`
/// bytes, on an 80 GiB device: a small training run of a model of that size.
pub fn training_run_sized_json(steps: usize, activation: u64) -> Vec<u8> {
    run_json(steps, false, activation, 80 << 30)
}

fn run_json(steps: usize, oom: bool, activation: u64, device: u64) -> Vec<u8> {
    let mut a = DeviceCachingAllocator::new(SimDevice::new(device), AllocatorConfig::default());
    a.record_history(Some(usize::MAX));
    // The site of each call, in order: one per alloc, one per free, one per failed request.
    let mut sites: Vec<Site> = Vec::new();
    let mut by_ptr = std::collections::HashMap::new();
    let mut alloc = |a: &mut DeviceCachingAllocator<SimDevice>, sites: &mut Vec<Site>, size: u64, site: Site| {
        sites.push(site);
        match a.malloc(size, 0) {
            Ok(b) => {
                by_ptr.insert(b.ptr, site);
                Some(b.ptr)
            }
            Err(_) => None,
        }
    };
    let free = |a: &mut DeviceCachingAllocator<SimDevice>, sites: &mut Vec<Site>, ptr: u64, site: Site| {
        sites.push(site);
        a.free(ptr).unwrap();
    };
    let mut optimizer = Vec::new();
    for step in 0..steps {
        let acts: Vec<u64> =
            (0..4).map(|l| alloc(&mut a, &mut sites, activation, Site::Activation(l)).unwrap()).collect();
        let t = alloc(&mut a, &mut sites, MIB / 2, Site::Temp).unwrap();
        free(&mut a, &mut sites, t, Site::Temp);
        alloc(&mut a, &mut sites, 2 * MIB, Site::Leak).unwrap();
        for &p in acts.iter().rev() {
            let g = alloc(&mut a, &mut sites, activation, Site::Gradient).unwrap();
            free(&mut a, &mut sites, p, Site::Gradient);
            free(&mut a, &mut sites, g, Site::Gradient);
        }
        if step == 0 {
            for _ in 0..2 {
                optimizer.push(alloc(&mut a, &mut sites, 4 * MIB, Site::OptimizerState).unwrap());
            }
        }
    }
    if oom {
        a.empty_cache().unwrap();
        let big = alloc(&mut a, &mut sites, 150 * MIB, Site::Eval).unwrap();
        free(&mut a, &mut sites, big, Site::Eval);
        let small: Vec<u64> = (0..10).map(|_| alloc(&mut a, &mut sites, 12 * MIB, Site::Eval).unwrap()).collect();
        for &p in small.iter().step_by(2) {
            free(&mut a, &mut sites, p, Site::Eval);
        }
        assert!(alloc(&mut a, &mut sites, 100 * MIB, Site::Eval).is_none(), "the evaluation must run out of memory");
    }
    let mut buf = Vec::new();
    write_snapshot(&a.snapshot(), SnapshotFormat::Json, &mut buf).unwrap();
    let mut v: Value = serde_json::from_slice(&buf).unwrap();
    // Frames on the entries, in call order; segment entries share their request's.
    let mut calls = sites.into_iter();
    let mut current = Site::Temp;
    for e in v["device_traces"][0].as_array_mut().unwrap() {
        let action = e["action"].as_str().unwrap().to_string();
        if matches!(action.as_str(), "alloc" | "free_requested" | "oom") {
            current = calls.next().expect("a call for each entry");
        }
        e["frames"] = current.frames();
    }
    for s in v["segments"].as_array_mut().unwrap() {
        for b in s["blocks"].as_array_mut().unwrap() {
            let addr = b["address"].as_u64().unwrap();
            if let Some(site) = by_ptr.get(&addr) {
                b["frames"] = site.frames();
            }
        }
    }
    drop(optimizer);
    serde_json::to_vec(&v).unwrap()
}

//! What a recorded stack says about an allocation: the user's own call site,
//! the phase of the step it happened in, and the role of the memory.
//!
//! PyTorch records Python frames (and, with `context="all"`, C++ frames
//! interleaved with them), innermost first. Frames inside torch, the Python
//! standard library and C++ say little to the user: a call site is the
//! innermost frame of the user's own code. The autograd engine runs backward
//! on its own thread, so its allocations carry no Python frames at all: they
//! are named after the autograd node that made them. Phases are inferred
//! from the frames alone; the role they suggest is settled by what the block
//! became ([`crate::roles`]).

// The phase frames name is the one the recorded step and the planner read too.
pub use headroom_trace::phase::Phase;
// What a block became is told by its lifetime too: frames give its first guess.
pub use crate::role::Role;
use headroom_trace::snapshot::{StackId, Stacks};
use serde::Serialize;

/// Where an allocation came from, as the user would look for it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Site {
    /// One line: `path/to/file.py:LINE in function`, or the autograd node or
    /// operator when no Python frame was recorded.
    pub site: String,
    /// The frame's file, line and function (absent for sites without a Python frame).
    pub file: Option<String>,
    pub line: Option<i64>,
    pub function: Option<String>,
}

/// What a stack says, computed once per interned stack.
#[derive(Clone, Debug)]
pub struct StackInfo {
    pub site: Site,
    pub phase: Phase,
    pub role: Role,
}

/// Classifies the stacks of one snapshot, each once.
#[derive(Clone)]
pub struct Classifier<'a> {
    stacks: &'a Stacks,
    cpp: bool,
    cache: Vec<Option<StackInfo>>,
}

impl<'a> Classifier<'a> {
    /// With `cpp`, a site also names the innermost ATen operator under the user's frame.
    pub fn new(stacks: &'a Stacks, cpp: bool) -> Classifier<'a> {
        Classifier { stacks, cpp, cache: vec![None; stacks.stacks.len()] }
    }

    pub fn info(&mut self, stack: StackId) -> &StackInfo {
        let i = stack as usize;
        if i >= self.cache.len() {
            self.cache.resize(i + 1, None);
        }
        if self.cache[i].is_none() {
            self.cache[i] = Some(classify(self.stacks, stack, self.cpp));
        }
        self.cache[i].as_ref().expect("filled above")
    }
}

/// A Python frame rather than a C++ one. Python frames name a source file
/// (`.py`) or a pseudo-file (`<frozen runpy>`, `<string>`, `<stdin>`). C++
/// frames name a `.cpp` file, `??`, nothing, or — symbolized in PyTorch's
/// fast mode (`TORCH_SYMBOLIZE_MODE=fast`) — the binary or shared library with
/// the offset in it as the "line" (`/usr/bin/python3.12:5775726`, whose
/// interpreter frames are named `_PyEval_EvalFrameDefault`).
pub(crate) fn is_python(file: &str) -> bool {
    file.ends_with(".py") || (file.starts_with('<') && file.ends_with('>'))
}

/// Torch itself and the Python standard library: frames the user did not write.
pub(crate) fn is_framework(file: &str) -> bool {
    file.contains("-packages/torch/")
        || file.contains("/pytorch/torch/")
        || file.starts_with("<frozen")
        || (file.contains("/lib/python3") && !file.contains("-packages/"))
}

/// The last `n` components of a path: enough to find the file, short enough to read.
fn short_path(file: &str, n: usize) -> &str {
    let mut cut = file.len();
    for _ in 0..n {
        match file[..cut].rfind('/') {
            Some(p) => cut = p,
            None => return file,
        }
    }
    &file[cut + 1..]
}

/// The autograd node whose backward made an allocation, from its C++ frames.
///
/// A generated node's frames name it three ways, innermost first: the formula
/// it calls (`torch::autograd::generated::details::mm_mat2_backward`, a
/// namespace of helpers shared by many nodes, so no name), the node's
/// function (`MmBackward0_apply_functional`, `SliceBackward0_copy_apply_functional`)
/// and its `apply` (`torch::autograd::generated::MmBackward0::apply`). The
/// `apply` is the node; the function stands in where the frames stop short of
/// it. `AccumulateGrad` is not generated. Gradients of one tensor used twice
/// are summed by the engine's `InputBuffer` before any node runs.
fn autograd_node(frames: &[(&str, i64, &str)]) -> Option<String> {
    const GENERATED: &str = "torch::autograd::generated::";
    let generated = |name: &str| -> Option<(String, bool)> {
        let rest = name.split(GENERATED).nth(1)?;
        let ident: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        if ident == "details" || ident.is_empty() {
            return None;
        }
        if rest[ident.len()..].starts_with("::apply") {
            return Some((ident, true));
        }
        let node = ident.strip_suffix("_apply_functional")?;
        Some((node.strip_suffix("_copy").unwrap_or(node).to_string(), false))
    };
    let mut function = None;
    for (_, _, name) in frames {
        if name.contains("torch::autograd::AccumulateGrad") {
            return Some("AccumulateGrad".into());
        }
        match generated(name) {
            Some((node, true)) => return Some(node),
            Some((node, false)) => function = function.or(Some(node)),
            None if function.is_none() && name.contains("torch::autograd::InputBuffer::add") => {
                return Some("InputBuffer::add".into());
            }
            None => {}
        }
    }
    function
}

fn classify(stacks: &Stacks, stack: StackId, cpp: bool) -> StackInfo {
    let frames: Vec<(&str, i64, &str)> = stacks.frames_of(stack).collect();
    if frames.is_empty() {
        return StackInfo {
            site: Site { site: "(no frames recorded)".into(), file: None, line: None, function: None },
            phase: Phase::Unknown,
            role: Role::Other,
        };
    }
    let python: Vec<&(&str, i64, &str)> = frames.iter().filter(|(f, _, _)| is_python(f)).collect();
    let user = python.iter().find(|(f, _, _)| !is_framework(f)).or(python.first()).copied();
    // The innermost ATen operator (`at::_ops::bmm::call` -> `aten::bmm`).
    let op = frames.iter().find_map(|(_, _, name)| {
        let rest = name.split("at::_ops::").nth(1)?;
        Some(format!("aten::{}", rest.split("::").next()?))
    });
    let node = autograd_node(&frames);
    let site = match user {
        Some(&(file, line, function)) => {
            let mut s = format!("{}:{line} in {function}", short_path(file, 3));
            if cpp {
                if let Some(op) = &op {
                    s.push_str(&format!(" > {op}"));
                }
            }
            Site { site: s, file: Some(file.to_string()), line: Some(line), function: Some(function.to_string()) }
        }
        None => {
            let s = match (&node, &op) {
                (Some(n), Some(op)) if cpp => format!("autograd {n} > {op}"),
                (Some(n), _) => format!("autograd {n}"),
                (None, Some(op)) => format!("{op} (no Python frames)"),
                (None, None) => {
                    format!("{} (no Python frames)", frames.last().map_or("?", |f| f.2))
                }
            };
            Site { site: s, file: None, line: None, function: None }
        }
    };

    let any_name = |pred: &dyn Fn(&str) -> bool| frames.iter().any(|(_, _, n)| pred(n));
    let any_py = |pred: &dyn Fn(&str, &str) -> bool| python.iter().any(|(f, _, n)| pred(f, n));
    let user_named = |words: &[&str]| {
        python.iter().filter(|(f, _, _)| !is_framework(f)).any(|(_, _, n)| {
            let n = n.to_ascii_lowercase();
            words.iter().any(|w| n.contains(w))
        })
    };
    let backward = node.is_some()
        || any_name(&|n| n.contains("torch::autograd::Engine::"))
        || any_py(&|f, n| (f.contains("torch/autograd/") || f.ends_with("torch/_tensor.py")) && n.contains("backward"));
    let optimizer = any_py(&|f, _| f.contains("torch/optim/"))
        || any_py(&|f, n| !is_framework(f) && (n == "step" && f.contains("optim") || n == "zero_grad"));
    let data = any_py(&|f, _| f.contains("torch/utils/data/"));
    let calling = any_py(&|_, n| matches!(n, "forward" | "_call_impl" | "_wrapped_call_impl"));
    // Building a model: a module's `__init__` (nn.Linear's weight, under `torch.device("cuda")`),
    // its initialisers, moving it and loading weights. An `__init__` under a module's call is
    // an object the forward makes, not the model being built.
    let setup = any_py(&|f, n| {
        (f.ends_with("torch/nn/modules/module.py") && matches!(n, "_apply" | "to" | "cuda" | "load_state_dict"))
            || f.ends_with("torch/nn/parameter.py")
            || f.ends_with("torch/nn/init.py")
            || (f.contains("torch/nn/") && n == "reset_parameters")
            || f.ends_with("torch/serialization.py")
    }) || (!calling && any_py(&|_, n| n == "__init__"));
    let evaluation = user_named(&["eval", "valid", "generate", "predict", "infer"]);
    let forward = calling || any_py(&|f, _| f.contains("torch/nn/"));
    let phase = if backward {
        Phase::Backward
    } else if optimizer {
        Phase::OptimizerStep
    } else if data {
        Phase::DataLoading
    } else if setup {
        Phase::Setup
    } else if evaluation {
        Phase::Evaluation
    } else if forward {
        Phase::Forward
    } else {
        Phase::Other
    };
    StackInfo { site, phase, role: Role::from_phase(phase) }
}

/// Stacks holding one stack of `frames` (innermost first), as stack 1: for tests of what
/// frames say.
#[cfg(test)]
pub(crate) fn one_stack(frames: &[(&str, i64, &str)]) -> Stacks {
    let mut s = Stacks { strings: Vec::new(), frames: Vec::new(), stacks: vec![Box::new([])] };
    let mut ids = Vec::new();
    for &(file, line, name) in frames {
        s.strings.push(file.into());
        s.strings.push(name.into());
        let n = s.strings.len() as u32;
        s.frames.push(headroom_trace::snapshot::Frame { filename: n - 2, line, name: n - 1 });
        ids.push(s.frames.len() as u32 - 1);
    }
    s.stacks.push(ids.into_boxed_slice());
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stacks(frames: &[(&str, i64, &str)]) -> Stacks {
        one_stack(frames)
    }

    const TORCH: &str = "/venv/lib/python3.12/site-packages/torch";

    #[test]
    fn the_site_is_the_innermost_frame_of_user_code() {
        let s = stacks(&[
            ("??", 0, "at::detail::empty_cuda(...)"),
            ("??", 0, "at::_ops::bmm::call(at::Tensor const&, at::Tensor const&)"),
            (&format!("{TORCH}/nn/functional.py"), 2300, "linear"),
            ("/home/me/proj/model/attention.py", 54, "forward"),
            (&format!("{TORCH}/nn/modules/module.py"), 1750, "_call_impl"),
            ("/home/me/proj/train.py", 10, "main"),
        ]);
        let mut c = Classifier::new(&s, false);
        let i = c.info(1).clone();
        assert_eq!(i.site.site, "proj/model/attention.py:54 in forward");
        assert_eq!(i.site.line, Some(54));
        assert_eq!(i.phase, Phase::Forward);
        assert_eq!(i.role, Role::Activations);
        let mut c = Classifier::new(&s, true);
        assert_eq!(c.info(1).site.site, "proj/model/attention.py:54 in forward > aten::bmm");
    }

    #[test]
    fn backward_allocations_are_named_after_their_autograd_node() {
        let s = stacks(&[
            ("??", 0, "at::_ops::bmm::call(at::Tensor const&, at::Tensor const&)"),
            ("Functions.cpp", 0, "torch::autograd::generated::BmmBackward0_apply_functional(...)"),
            ("??", 0, "torch::autograd::Engine::evaluate_function(...)"),
        ]);
        let i = Classifier::new(&s, false).info(1).clone();
        assert_eq!(i.site.site, "autograd BmmBackward0");
        assert_eq!((i.phase, i.role), (Phase::Backward, Role::Gradients));
    }

    /// With C++ frames the formula a node calls comes first, in the namespace
    /// `torch::autograd::generated::details` that many nodes share; the node is
    /// the one whose `apply` ran.
    #[test]
    fn the_node_is_the_one_whose_apply_ran() {
        let s = stacks(&[
            ("??", 0, "at::_ops::mm::call(at::Tensor const&, at::Tensor const&)"),
            ("libtorch_cpu.so", 1, "torch::autograd::generated::details::mm_mat2_backward(at::Tensor const&)"),
            ("libtorch_cpu.so", 2, "torch::autograd::generated::MmBackward0_apply_functional(...)"),
            ("libtorch_cpu.so", 3, "torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor>&&)"),
            ("libtorch_cpu.so", 4, "torch::autograd::Engine::evaluate_function(...)"),
        ]);
        assert_eq!(Classifier::new(&s, false).info(1).site.site, "autograd MmBackward0");
        let s = stacks(&[
            ("libtorch_cpu.so", 1, "torch::autograd::generated::details::slice_backward_wrapper(...)"),
            ("libtorch_cpu.so", 2, "torch::autograd::generated::SliceBackward0_copy_apply_functional(...)"),
        ]);
        assert_eq!(Classifier::new(&s, false).info(1).site.site, "autograd SliceBackward0");
        let s = stacks(&[
            ("libtorch_cpu.so", 1, "at::_ops::add_Tensor::call(at::Tensor const&, at::Tensor const&)"),
            ("libtorch_cpu.so", 2, "torch::autograd::accumulate(std::vector<at::Tensor>&, unsigned long)"),
            ("libtorch_cpu.so", 3, "torch::autograd::InputBuffer::add(unsigned long, at::Tensor&&)"),
            ("libtorch_cpu.so", 4, "torch::autograd::Engine::evaluate_function(...)"),
        ]);
        let i = Classifier::new(&s, true).info(1).clone();
        assert_eq!((i.site.site.as_str(), i.phase), ("autograd InputBuffer::add > aten::add_Tensor", Phase::Backward));
    }

    /// `nn.Linear` built under `torch.device("cuda")` allocates its weight in its
    /// `__init__`, inside torch/nn: building the model, not a forward.
    #[test]
    fn a_module_init_is_setup() {
        let s = stacks(&[
            (&format!("{TORCH}/utils/_device.py"), 116, "__torch_function__"),
            (&format!("{TORCH}/nn/modules/linear.py"), 109, "__init__"),
            ("/venv/lib/python3.12/site-packages/transformers/models/qwen3/modeling_qwen3.py", 77, "__init__"),
            ("/w/train.py", 69, "build"),
        ]);
        let i = Classifier::new(&s, false).info(1).clone();
        assert_eq!((i.phase, i.role), (Phase::Setup, Role::ParametersAndBuffers));
        // An object made inside a module's call is the forward's.
        let s = stacks(&[
            ("/w/cache.py", 5, "__init__"),
            (&format!("{TORCH}/nn/modules/module.py"), 1750, "_call_impl"),
            ("/w/model.py", 40, "forward"),
        ]);
        assert_eq!(Classifier::new(&s, false).info(1).phase, Phase::Forward);
    }

    #[test]
    fn optimizer_setup_and_unknown_phases() {
        let s =
            stacks(&[(&format!("{TORCH}/optim/adamw.py"), 400, "_single_tensor_adamw"), ("/w/train.py", 80, "train")]);
        let i = Classifier::new(&s, false).info(1).clone();
        assert_eq!((i.phase, i.role), (Phase::OptimizerStep, Role::OptimizerState));
        assert_eq!(i.site.site, "/w/train.py:80 in train");
        let s = stacks(&[(&format!("{TORCH}/nn/modules/module.py"), 1300, "_apply"), ("/w/train.py", 20, "main")]);
        assert_eq!(Classifier::new(&s, false).info(1).role, Role::ParametersAndBuffers);
        let s = stacks(&[]);
        assert_eq!(Classifier::new(&s, false).info(0).phase, Phase::Unknown);
        let s = stacks(&[("/w/eval.py", 9, "evaluate_model"), ("/w/m.py", 3, "forward")]);
        assert_eq!(Classifier::new(&s, false).info(1).phase, Phase::Evaluation);
    }

    /// Frames recorded with `stacks="all"` and symbolized in fast mode, as on the
    /// H200 (`../shared/gpu/snapshots/oom-cpp-qwen2-0.5b-b4`): the interpreter's
    /// own frames carry the binary's path and an offset, and are named
    /// `_PyEval_EvalFrameDefault`, which is no evaluation loop of the user's.
    #[test]
    fn symbolized_cpp_frames_are_neither_call_sites_nor_phases() {
        let lib = format!("{TORCH}/lib/libtorch_cpu.so");
        let s = stacks(&[
            (&lib, 47342144, "at::_ops::mm::call(at::Tensor const&, at::Tensor const&)"),
            ("/usr/bin/python3.12", 5775726, "??"),
            ("/usr/bin/python3.12", 5541812, "_PyObject_MakeTpCall"),
            (&format!("{TORCH}/nn/modules/linear.py"), 134, "forward"),
            ("/usr/bin/python3.12", 6123790, "_PyEval_EvalFrameDefault"),
            (&format!("{TORCH}/nn/modules/module.py"), 1790, "_call_impl"),
            ("/venv/lib/python3.12/site-packages/transformers/models/qwen2/modeling_qwen2.py", 465, "forward"),
            ("/usr/bin/python3.12", 6116842, "PyEval_EvalCode"),
            ("/lib/x86_64-linux-gnu/libc.so.6", 172682, "__libc_start_main"),
            ("/home/me/train.py", 36, "<module>"),
        ]);
        let i = Classifier::new(&s, true).info(1).clone();
        assert_eq!(i.site.site, "models/qwen2/modeling_qwen2.py:465 in forward > aten::mm");
        assert_eq!((i.phase, i.role), (Phase::Forward, Role::Activations));
        // Python's pseudo-files are Python frames.
        let s = stacks(&[("<frozen runpy>", 88, "_run_code"), ("<stdin>", 3, "validate")]);
        let i = Classifier::new(&s, false).info(1).clone();
        assert_eq!((i.site.site.as_str(), i.phase), ("<stdin>:3 in validate", Phase::Evaluation));
    }

    #[test]
    fn short_paths_keep_the_last_components() {
        assert_eq!(short_path("/a/b/c/d.py", 3), "b/c/d.py");
        assert_eq!(short_path("d.py", 3), "d.py");
        assert_eq!(short_path("/d.py", 3), "/d.py");
    }
}

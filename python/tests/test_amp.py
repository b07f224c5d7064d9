"""CUDA's autocast on the recorder's CPU tensors (headroom_gpu.amp), against the installed torch's
own CUDA autocast kernels: they run on fake CUDA tensors without a GPU as far as a forward goes,
so each cast, and a transformers forward's every allocation, is compared with theirs. Skipped,
saying so, where torch, transformers or peft is not installed, or torch was built without CUDA.

    PYTHONPATH=python HEADROOM_BIN=target/debug/headroom python3 -m unittest python/tests/test_amp.py
"""

import contextlib
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))

from test_recorder import MISSING, TINY_LLAMA, _model_dir, assert_replays_and_plans, record_command  # noqa: E402

if not MISSING:
    import torch
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

CUDA_MISSING = MISSING or (None if torch.backends.cuda.is_built() else
                           "CUDA's autocast kernels are compared on fake CUDA tensors: install torch's CUDA wheel "
                           "(no GPU needed)")


@contextlib.contextmanager
def _cuda_autocast_kernels(dtype):
    """CUDA's own autocast, switched on by hand: `torch.autocast("cuda")` switches itself off
    where no GPU is (and, under the recorder, becomes the emulation under test)."""
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", dtype)
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        torch.set_autocast_enabled("cuda", False)


class _HostTensors(TorchDispatchMode if not MISSING else object):
    """The recorder's records of the CPU tensors a step on fake CUDA tensors makes: host memory
    on a GPU (the constants `torch.tensor(x, device="cuda")` builds on the host, then copies),
    where a step on CPU tensors throughout has the device's copy alone."""

    def __init__(self, rec):
        super().__init__()
        self.rec, self.records = rec, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))  # the recorder's mode, below this one, records it
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                r = self.rec._storages.get(t.untyped_storage())
                if r is not None:
                    self.records.add(id(r))
        return out


def _ops(device):
    """Output dtypes of the operators a transformer's step runs, and one of each policy."""
    x = torch.randn(4, 8, device=device)
    w = torch.randn(16, 8, device=device, requires_grad=True)
    xb = x.bfloat16()
    return {
        "linear": F.linear(x, w), "matmul": x @ w.t(), "einsum": torch.einsum("ij,kj->ik", x, w),
        "mv": torch.mv(x, x[0]), "baddbmm": torch.baddbmm(torch.zeros(1, 4, 4, device=device), x[None], x.t()[None]),
        "softmax": torch.softmax(xb, -1), "log_softmax": F.log_softmax(xb, -1),
        "layer_norm": F.layer_norm(xb, (8,)), "rms_norm": F.rms_norm(xb, (8,)), "pow": xb.pow(2),
        "rsqrt": xb.rsqrt(), "exp": xb.exp(), "sum": xb.sum(), "cumsum": xb.cumsum(0), "norm": xb.norm(),
        "mse_loss": F.mse_loss(xb, xb), "cross_entropy": F.cross_entropy(xb, torch.zeros(4, dtype=torch.long,
                                                                                           device=device)),
        "addcmul fp32": torch.addcmul(x, xb, xb), "addcmul bf16": torch.addcmul(xb, xb, xb), "add": xb + x,
        "gelu": F.gelu(xb),
    }


@unittest.skipIf(MISSING, MISSING)
class Policy(unittest.TestCase):
    def test_the_policy_is_the_installed_torchs(self):
        from headroom_gpu import amp

        policy = amp.cuda_policy()
        if torch.backends.cuda.is_built():
            # The header's lists are what the dispatcher registers for AutocastCUDA, no more, no less.
            self.assertEqual(set(policy), amp.cuda_registered())
        self.assertEqual(policy["aten::mm"], amp.LOWER_PRECISION_FP)
        self.assertEqual(policy["aten::softmax.int"], amp.FP32_SET_OPT_DTYPE)
        self.assertEqual(policy["aten::layer_norm"], amp.FP32)

    @unittest.skipIf(CUDA_MISSING, CUDA_MISSING)
    def test_each_operator_casts_as_cuda_autocast_does(self):
        from torch._subclasses.fake_tensor import FakeTensorMode

        from headroom_gpu import amp

        with FakeTensorMode(), _cuda_autocast_kernels(torch.bfloat16):
            cuda = {k: v.dtype for k, v in _ops("cuda").items()}
        with amp.cuda_autocast(), torch.autocast("cuda", torch.bfloat16):
            emulated = {k: v.dtype for k, v in _ops("cpu").items()}
        with torch.autocast("cpu", torch.bfloat16):
            cpu = {k: v.dtype for k, v in _ops("cpu").items()}
        self.assertEqual(emulated, cuda)
        # CPU autocast alone is not CUDA's: it keeps softmax's and layer_norm's input dtype.
        pick = ("softmax", "layer_norm", "mv")
        self.assertEqual([cpu[k] for k in pick], [torch.bfloat16, torch.bfloat16, torch.float32])
        self.assertEqual([cuda[k] for k in pick], [torch.float32, torch.float32, torch.bfloat16])

    def test_refused_where_cuda_refuses_and_switched_off_after(self):
        from headroom_gpu import amp

        x = torch.rand(4)
        with amp.cuda_autocast(), torch.autocast("cuda", torch.bfloat16):
            with self.assertRaisesRegex(RuntimeError, "unsafe to autocast"):
                F.binary_cross_entropy(x, x)
        # Outside the context CPU autocast is PyTorch's own again: softmax keeps bf16.
        with torch.autocast("cpu", torch.bfloat16):
            self.assertEqual(torch.softmax(x.bfloat16(), 0).dtype, torch.bfloat16)
            self.assertEqual(F.binary_cross_entropy(x, x).dtype, torch.float32)

    def test_a_weight_is_cast_once_a_region(self):
        from headroom_gpu.recorder import StepRecorder

        with StepRecorder(route_sdpa=False) as rec:
            layer = torch.nn.Linear(64, 256, bias=False)
            x = torch.randn(8, 64)
            with rec.step():
                with torch.autocast("cuda", torch.bfloat16):
                    for _ in range(3):
                        layer(x)
        casts = [r for op, r in rec.events if op == "alloc" and r.when != "setup" and r.size == 64 * 256 * 2]
        self.assertEqual(len(casts), 1)  # the bf16 copy, kept in autocast's cache for the region
        frees = [r for op, r in rec.events if op == "free" and r is casts[0]]
        self.assertEqual(len(frees), 1)  # and dropped with it: nothing saved it for a backward


# torch 2.11's AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE (ATen/autocast_mode.h), which lists
# norm's named-dimension overload as well, with a named-dimension softmax besides.
_TORCH_2_11_HEADER = r"""
#define AT_FORALL_LOWER_PRECISION_FP(_)  \
  _(_convolution, deprecated)           \
  _(mm)

#define AT_FORALL_FP32(_)             \
  _(layer_norm)

#define AT_FORALL_FP32_SET_OPT_DTYPE(_) \
  _(softmax, int)                       \
  _(softmax, Dimname)

#define AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(_)                         \
  _(ADD_NS(norm),                                                           \
    "norm.Scalar",                                                          \
    Tensor(const Tensor&, const Scalar&),                                   \
    Tensor(const Tensor&, const std::optional<Scalar>&, ScalarType),        \
    fp32_append_dtype)                                                      \
  _(ADD_NS(norm),                                                           \
    "norm.names_ScalarOpt_dim",                                             \
    Tensor(const Tensor&, const std::optional<Scalar>&, DimnameList, bool), \
    Tensor(                                                                 \
        const Tensor&,                                                      \
        const std::optional<Scalar>&,                                       \
        DimnameList,                                                        \
        bool,                                                               \
        ScalarType),                                                        \
    fp32_append_dtype)

#define AT_FORALL_PROMOTE(_) \
  _(addcmul)
"""


@unittest.skipIf(MISSING, MISSING)
class Header(unittest.TestCase):
    def test_torch_2_11s_header_is_read(self):
        from headroom_gpu import amp

        policy = amp._policy_of_header(_TORCH_2_11_HEADER)
        self.assertEqual(policy["aten::norm.names_ScalarOpt_dim"], amp.FP32_APPEND_DTYPE)
        self.assertEqual(policy["aten::softmax.Dimname"], amp.FP32_SET_OPT_DTYPE)
        self.assertEqual(policy["aten::_convolution.deprecated"], amp.LOWER_PRECISION_FP)
        self.assertEqual(policy["aten::addcmul"], amp.PROMOTE)

    def test_each_redispatch_target_is_its_source_with_a_dtype(self):
        """Where the installed torch has a listed overload (the named-dimension ones are gone after
        torch 2.14), the overload its kernel redispatches to takes the same arguments and a dtype."""
        from headroom_gpu import amp

        checked = 0
        for source, target in amp._APPEND_DTYPE_TARGET.items():
            op, _, overload = source.partition(".")
            if overload not in getattr(torch.ops.aten, op).overloads():
                continue
            arguments = [a.name for a in amp._op(f"aten::{source}")._schema.arguments]
            into = amp._op(f"aten::{target}")._schema.arguments
            self.assertEqual([a.name for a in into], arguments + ["dtype"], source)
            checked += 1
        self.assertGreaterEqual(checked, 2)

    def test_an_unknown_redispatch_is_refused_naming_it(self):
        from headroom_gpu import amp

        text = _TORCH_2_11_HEADER.replace("norm.names_ScalarOpt_dim", "norm.names_newer")
        with self.assertRaisesRegex(RuntimeError, "norm.names_newer .*_APPEND_DTYPE_TARGET"):
            amp._policy_of_header(text)


def _installed(name):
    try:
        __import__(name)
        return None
    except ImportError as e:
        return f"{name} is not installed: {e}"


_LIBRARY = []


def _library():
    """Operators of a library of the test's own (namespace `headroom_amp_test`), one for each
    way a library can give autocast kernels: `cuda_cast` casts to fp32 and back in its CUDA
    kernel and has a fake kernel; `cuda_opaque` has a CUDA kernel and no fake one; `cpu_only`
    casts to fp16 in a CPU kernel alone. Defined once a process, as the dispatcher allows."""
    if _LIBRARY:
        return _LIBRARY[0]
    lib = torch.library.Library("headroom_amp_test", "DEF")
    for name in ("cuda_cast", "cuda_opaque", "cpu_only"):
        lib.define(f"{name}(Tensor x, Tensor w) -> Tensor")
        lib.impl(name, lambda x, w: x * w.to(x.dtype), "CPU")
    for name in ("cuda_cast", "cpu_only"):
        torch.library.register_fake(f"headroom_amp_test::{name}", lambda x, w: torch.empty_like(x), lib=lib)
    ops = torch.ops.headroom_amp_test

    def autocast(op, key, to, back):
        def kernel(x, w):
            with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(key)):
                out = op(x.to(to), w.to(to))
            return out.to(x.dtype) if back else out
        return kernel

    lib.impl("cuda_cast", autocast(ops.cuda_cast.default, torch._C.DispatchKey.AutocastCUDA, torch.float32, True),
             "AutocastCUDA")
    lib.impl("cuda_opaque", autocast(ops.cuda_opaque.default, torch._C.DispatchKey.AutocastCUDA, torch.float32,
                                     False), "AutocastCUDA")
    lib.impl("cpu_only", autocast(ops.cpu_only.default, torch._C.DispatchKey.AutocastCPU, torch.float16, False),
             "AutocastCPU")
    _LIBRARY.append((lib, ops))
    return _LIBRARY[0]


class _Calls(TorchDispatchMode if not MISSING else object):
    """The dtypes each operator of `namespace` is called with and returns, in order."""

    def __init__(self, namespace):
        super().__init__()
        self.namespace, self.calls = namespace, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.namespace == self.namespace:
            dtypes = [t.dtype for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            self.calls.append((func.__name__, dtypes, [t.dtype for t in tree_flatten(out)[0]]))
        return out


@unittest.skipIf(MISSING, MISSING)
class Libraries(unittest.TestCase):
    """Other libraries' operators, cast by their own autocast kernels on a GPU."""

    @unittest.skipIf(CUDA_MISSING, CUDA_MISSING)
    def test_a_cuda_kernels_casts_are_read_from_it(self):
        from headroom_gpu import amp

        _, ops = _library()
        x, w = torch.randn(4, 8).bfloat16(), torch.randn(4, 8)
        notes = []
        with amp.cuda_autocast(notes.append), torch.autocast("cuda", torch.bfloat16), \
                _Calls("headroom_amp_test") as calls:
            self.assertEqual(ops.cuda_cast(x, w).dtype, torch.bfloat16)
            self.assertEqual(ops.cuda_cast(x, w).dtype, torch.bfloat16)  # read once, applied again
        # The operator itself runs on fp32 copies, as the CUDA kernel hands it them on a GPU.
        self.assertEqual(calls.calls, [("cuda_cast.default", [torch.float32, torch.float32], [torch.float32])] * 2)
        self.assertEqual(notes, [])

    def test_a_cuda_kernel_that_does_not_run_on_fake_tensors_is_stated(self):
        from headroom_gpu import amp

        _, ops = _library()
        x, w = torch.randn(4, 8).bfloat16(), torch.randn(4, 8)
        notes = []
        with amp.cuda_autocast(notes.append), torch.autocast("cuda", torch.bfloat16):
            self.assertEqual(ops.cuda_opaque(x, w).dtype, torch.bfloat16)  # uncast
            ops.cuda_opaque(x, w)
        self.assertEqual(len(notes), 1, notes)
        self.assertIn("headroom_amp_test::cuda_opaque: run without its library's CUDA autocast casts", notes[0])

    def test_a_cpu_kernel_alone_is_not_run_as_a_gpu_has_none(self):
        from headroom_gpu import amp

        _, ops = _library()
        x, w = torch.randn(4, 8).bfloat16(), torch.randn(4, 8)
        with torch.autocast("cpu", torch.bfloat16):
            self.assertEqual(ops.cpu_only(x, w).dtype, torch.float16)  # the CPU's own kernel
        with amp.cuda_autocast(), torch.autocast("cuda", torch.bfloat16):
            self.assertEqual(ops.cpu_only(x, w).dtype, torch.bfloat16)  # a GPU's fallthrough
        with torch.autocast("cpu", torch.bfloat16):
            self.assertEqual(ops.cpu_only(x, w).dtype, torch.float16)  # and the CPU's own again after

    def test_a_recorder_that_fails_to_start_leaves_nothing_on(self):
        """A recorder whose CUDA autocast cannot be entered (as torchvision's operators once made
        it) raises, and leaves no fake mode, hook or patch behind for later recordings."""
        from unittest import mock

        from torch._guards import detect_fake_mode

        from headroom_gpu import amp
        from headroom_gpu.recorder import StepRecorder

        module = torch.nn.modules.module
        hooks, sdpa = len(module._global_forward_pre_hooks), F.scaled_dot_product_attention
        with mock.patch.object(amp, "cuda_autocast", side_effect=RuntimeError("no policy")), \
                self.assertRaisesRegex(RuntimeError, "no policy"):
            with StepRecorder():
                pass
        self.assertIsNone(detect_fake_mode())
        self.assertEqual(len(module._global_forward_pre_hooks), hooks)
        self.assertIs(F.scaled_dot_product_attention, sdpa)
        with StepRecorder(route_sdpa=False) as rec:
            layer = torch.nn.Linear(8, 8)
            with rec.step():
                layer(torch.randn(2, 8)).sum().backward()
        self.assertGreater(rec.peak, 0)

    @unittest.skipIf(CUDA_MISSING or _installed("torchvision"), CUDA_MISSING or _installed("torchvision"))
    def test_torchvisions_operators_are_cast_as_its_cuda_kernels_cast(self):
        """Each torchvision operator with a CUDA autocast kernel (`roi_align` and `nms` with a CPU
        one besides, left to run), called under the emulation on CPU tensors, against CUDA's own
        kernels on fake CUDA tensors: the same dtypes in and out of each operator."""
        import torchvision
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        from headroom_gpu import amp

        def run(device):
            x = torch.randn(2, 8, 16, 16, device=device).bfloat16()
            rois = torch.tensor([[0, 1, 1, 8, 8], [1, 0, 0, 4, 4.]], device=device)
            boxes, scores = torch.rand(6, 4, device=device).bfloat16(), torch.rand(6, device=device).bfloat16()
            offset = torch.zeros(2, 18, 14, 14, device=device)
            weight, mask = torch.randn(4, 8, 3, 3, device=device), torch.ones(2, 9, 14, 14, device=device)
            with _Calls("torchvision") as calls:
                torchvision.ops.roi_align(x, rois, 2)
                torchvision.ops.roi_pool(x, rois, 2)
                torchvision.ops.ps_roi_align(x, rois, 2)
                torchvision.ops.ps_roi_pool(x, rois, 2)
                torchvision.ops.deform_conv2d(x, offset, weight, mask=mask)
                torchvision.ops.nms(boxes, scores, 0.5)
            return calls.calls

        with FakeTensorMode(shape_env=ShapeEnv()), _cuda_autocast_kernels(torch.bfloat16):
            cuda = run("cuda")
        notes = []
        with amp.cuda_autocast(notes.append), torch.autocast("cuda", torch.bfloat16):
            emulated = run("cpu")
        self.assertEqual(emulated, cuda)
        self.assertEqual(notes, [])
        self.assertEqual(len(cuda), 6)
        # roi_pool's operator runs on fp32 copies; CPU autocast alone would hand it bf16 features
        # and fp32 boxes, which its CPU kernel refuses.
        self.assertEqual(dict((n, d) for n, d, _ in cuda)["roi_pool.default"], [torch.float32] * 2)

    @unittest.skipIf(_installed("torchvision"), _installed("torchvision"))
    def test_a_step_with_torchvisions_operators_records(self):
        import torchvision

        from headroom_gpu.recorder import StepRecorder

        with StepRecorder(route_sdpa=False) as rec:
            conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            images, rois = torch.randn(2, 3, 32, 32), torch.tensor([[0, 1, 1, 20, 20], [1, 4, 4, 30, 30.]])
            with rec.step():
                with torch.autocast("cuda", torch.bfloat16):
                    pooled = torchvision.ops.roi_align(conv(images), rois, 7)
                pooled.float().square().mean().backward()
        self.assertEqual(pooled.dtype, torch.bfloat16)  # the convolution's bf16, as on a GPU
        self.assertGreater(rec.peak, 0)
        self.assertEqual(rec.assumptions, [])


@unittest.skipIf(MISSING, MISSING)
class Step(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp()

    @unittest.skipIf(CUDA_MISSING, CUDA_MISSING)
    def test_a_forward_allocates_what_cuda_autocast_allocates(self):
        """A transformers forward and loss under CUDA's own autocast kernels on fake CUDA tensors,
        against the recorder's CPU tensors under the emulation: the same allocations, in order."""
        import transformers

        from headroom_gpu.recorder import StepRecorder

        config = transformers.LlamaConfig(**{k: v for k, v in TINY_LLAMA.items() if k != "architectures"})

        def forward(device):
            with StepRecorder(route_sdpa=False) as rec:
                model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").to(device)
                ids = torch.randint(0, 256, (2, 64), device=device)
                host = _HostTensors(rec)
                with rec.step():
                    cast = torch.autocast("cuda", torch.bfloat16) if device == "cpu" else \
                        _cuda_autocast_kernels(torch.bfloat16)
                    with cast, (host if device == "cuda" else contextlib.nullcontext()):
                        model(input_ids=ids, labels=ids).loss
            # A GPU's dropout of p=0 makes empty tensors a CPU's does not: bytes are compared.
            return rec, [(r.size, r.site) for op, r in rec.events
                         if op == "alloc" and r.when != "setup" and r.size and id(r) not in host.records]

        cpu, cpu_allocs = forward("cpu")
        cuda, cuda_allocs = forward("cuda")
        self.assertEqual(cpu_allocs, cuda_allocs)
        self.assertEqual(cpu.peak, cuda.peak)

    def test_fake_against_real(self):
        from headroom_gpu.transformers_step import StepSpec, record

        for spec in ({}, {"lora": 4}, {"attention": "eager"}, {"checkpoint": True}):
            s = StepSpec(model=_model_dir(self.tmp), batch=2, seq=64, steps=2, dtype="amp", **spec)
            fake, real = record(s, fake=True, route_sdpa=False), record(s, fake=False, route_sdpa=False)
            self.assertEqual(fake.peak, real.peak, spec)

    def test_attention_routed_for_the_dtype_autocast_gives_it(self):
        from headroom_gpu.transformers_step import StepSpec, record

        rec = record(StepSpec(model=_model_dir(self.tmp), batch=2, seq=64, steps=1, dtype="amp"))
        self.assertEqual(rec.sdpa_kernels, {"flash": 2})  # bf16 after autocast, not fp32's math path
        # Checkpointing's recomputation runs under the autocast state of the forward it repeats.
        ckpt = record(StepSpec(model=_model_dir(self.tmp), batch=2, seq=64, steps=1, dtype="amp", checkpoint=True))
        self.assertEqual(ckpt.sdpa_kernels, {"flash": 4})
        fp32 = record(StepSpec(model=_model_dir(self.tmp), batch=2, seq=64, steps=1, dtype="fp32"))
        self.assertEqual(fp32.sdpa_kernels, {"math": 2})

    def test_the_command_records_and_plan_replays(self):
        out = os.path.join(self.tmp, "amp.jsonl")
        r = record_command(self, _model_dir(self.tmp), out, "--batch", "2", "--seq", "64", "--steps", "2",
                           "--dtype", "amp")
        self.assertIn("flash 4 calls", r.stdout)
        with open(out) as f:
            self.assertEqual(json.loads(f.readline()), {"op": "shape", "batch": 2, "seq": 64})
        assert_replays_and_plans(self, out)

if __name__ == "__main__":
    unittest.main()

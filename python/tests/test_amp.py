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
                with rec.step():
                    cast = torch.autocast("cuda", torch.bfloat16) if device == "cpu" else \
                        _cuda_autocast_kernels(torch.bfloat16)
                    with cast:
                        model(input_ids=ids, labels=ids).loss
            # A GPU's dropout of p=0 makes empty tensors a CPU's does not: bytes are compared.
            return rec, [(r.size, r.site) for op, r in rec.events if op == "alloc" and r.when != "setup" and r.size]

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

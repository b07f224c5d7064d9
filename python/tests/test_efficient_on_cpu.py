"""The memory-efficient kernel's CPU stand-in (`scripts/validate/efficient_on_cpu.py`), which T5's
SDPA steps are recorded on: it computes what SDPA's math path computes, allocates what the CUDA
kernel returns (the output, a log-sum-exp padded to 32 positions where a gradient is wanted,
and in the backward the query's, key's, value's and bias's gradients), and the recording
leaves everything else it makes out as scratch (`step_programs.cpu_scratch`). A T5 full
fine-tuning with SDPA, whose mask (the position bias) requires a gradient, runs it alone, where
the CPU's own SDPA would take its math path and keep the s × s probabilities.

    cd python && python3 -m unittest tests/test_efficient_on_cpu.py
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_recorders import NeedsRecorders  # noqa: E402  (scripts/validate on the path too)

B, H, S, D = 2, 4, 40, 16


class EfficientOnCpu(NeedsRecorders):
    def inputs(self, dtype):
        import torch

        torch.manual_seed(0)
        q, k, v = (torch.randn(B, S, H, D, dtype=dtype).transpose(1, 2).requires_grad_() for _ in range(3))
        bias = torch.randn(1, H, S, S, dtype=dtype, requires_grad=True)
        return q, k, v, bias

    def test_it_computes_what_the_math_path_computes(self):
        import efficient_on_cpu
        import torch

        for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
            with self.subTest(dtype=dtype):
                q, k, v, bias = self.inputs(dtype)
                want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
                want.float().square().sum().backward()
                grads = [t.grad for t in (q, k, v, bias)]
                for t in (q, k, v, bias):
                    t.grad = None
                with efficient_on_cpu.registered():
                    got = torch.ops.aten._scaled_dot_product_efficient_attention(
                        q, k, v, bias.expand(B, H, S, S), True, 0.0, False)[0]
                    got.float().square().sum().backward()
                torch.testing.assert_close(got, want, atol=tol, rtol=tol)
                for g, t in zip(grads, (q, k, v, bias)):
                    torch.testing.assert_close(t.grad, g, atol=tol, rtol=tol)

    def test_it_keeps_what_the_cuda_kernel_keeps(self):
        import efficient_on_cpu
        import step_programs as sp
        import torch
        from torch.profiler import ProfilerActivity, profile

        q, k, v, bias = self.inputs(torch.bfloat16)
        with efficient_on_cpu.registered(), \
                profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            out = torch.ops.aten._scaled_dot_product_efficient_attention(
                q, k, v, bias.expand(B, H, S, S), True, 0.0, False)[0]
            out.sum().backward()
        made, kept, left = {}, [], []
        for _, ptr, size, ops in sp.allocations(prof):
            if size > 0:
                made[ptr] = (size, ops)
            elif ptr in made:
                size, at = made.pop(ptr)
                (left if sp.cpu_scratch(at, ops) else kept).append(size)
        kept += [size for size, _ in made.values()]
        self.assertTrue(left, "the math path's scratch")
        # The output (bf16), the log-sum-exp (fp32, 40 positions padded to 64), the three
        # gradients and the bias's (b x h x s x s, bf16, its 40 columns padded to 48), then
        # autograd's sum of it to the bias's (1, h, s, s), and the loss and its gradient (a bf16
        # scalar each).
        elements = B * H * S * D
        expected = [2 * elements, 4 * B * H * 64, 2 * elements, 2 * elements, 2 * elements,
                    2 * B * H * S * 48, 2 * H * S * S, 2, 2]
        self.assertEqual(sorted(kept), sorted(expected))

    def test_a_t5_full_fine_tuning_runs_the_kernel_alone(self):
        """Through `step_programs.gpu_sdpa`, as `Job` records T5's SDPA: every call is routed
        to the memory-efficient kernel (its mask requires a gradient), and the step trains."""
        import measure
        import step_programs as sp
        import torch

        cfg = sp.config("t5", 2)
        model = measure.build(cfg, "seq2seq-lm", "sdpa", torch.float32)
        inputs = measure.inputs(cfg, "seq2seq-lm", 2, 24, 16)
        from headroom_gpu import sdpa

        calls = []
        original = sdpa.routed

        def counted(fn, chosen, count=True):
            calls.append(chosen)
            return original(fn, chosen, count)

        sdpa.routed = counted
        try:
            with sp.gpu_sdpa("t5"):
                model(**inputs).loss.backward()
        finally:
            sdpa.routed = original
        self.assertEqual(len(calls), 1)
        # Two encoder layers' self-attention, two decoder layers' self- and cross-attention.
        self.assertEqual(calls[0], {sdpa.EFFICIENT: 6})
        self.assertIsNotNone(model.get_encoder().block[0].layer[0].SelfAttention.relative_attention_bias.weight.grad)


if __name__ == "__main__":
    unittest.main()

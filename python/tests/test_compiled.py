"""A `torch.compile`d step recorded under fake tensors (headroom_gpu.compiled): the recording
keeps at the end of the forward what Inductor's partitioner says the forward saves, which is
less than the eager step keeps, and the same partition as Inductor's own on real tensors.
Skipped, saying so, where torch or its Inductor is not installed:

    pip install torch
    PYTHONPATH=python python3 -m unittest python/tests/test_compiled.py
"""

import shutil
import unittest

try:
    import torch
    import torch._inductor.compile_fx  # noqa: F401
    from torch import nn

    MISSING = None
except ImportError as e:  # pragma: no cover - depends on the environment
    MISSING = f"recording a compiled step needs torch with Inductor (pip install torch): {e}"

BATCH, WIDTH, HIDDEN = 16, 64, 256

if MISSING is None:

    class Block(nn.Module):
        """Two linears around a chain of pointwise operators: eager PyTorch keeps each pointwise
        output for the backward, Inductor's partitioner keeps the first linear's output and
        recomputes the chain."""

        def __init__(self):
            super().__init__()
            self.up = nn.Linear(WIDTH, HIDDEN)
            self.down = nn.Linear(HIDDEN, WIDTH)

        def forward(self, x):
            h = self.up(x)
            h = torch.sin(h) * torch.cos(h) + torch.tanh(h)
            return self.down(h).float().pow(2).mean()


def _record(compile: bool):
    from headroom_gpu.recorder import StepRecorder

    with StepRecorder(compile=compile) as rec:
        torch.manual_seed(0)
        model = Block()
        opt = torch.optim.AdamW(model.parameters(), foreach=True)
        step = torch.compile(model) if compile else model
        x = torch.randn(BATCH, WIDTH)
        for _ in range(2):
            with rec.step():
                loss = step(x)
                loss.backward()
                del loss
                opt.step()
                opt.zero_grad(set_to_none=True)
    return rec


def _kept_at_backward(rec, step: int) -> int:
    """The bytes the step's forward made that are live when its backward begins, less the loss."""
    live = {}
    for op, r in rec.events:
        if op == "alloc" and r.when == f"step{step}.backward":
            break
        if op == "alloc" and r.when == f"step{step}.forward":
            live[r.index] = r.size
        elif op == "free":
            live.pop(r.index, None)
    return sum(live.values()) - 4  # the fp32 loss


@unittest.skipIf(MISSING, MISSING)
class CompiledStep(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.compiled = _record(True)
        cls.eager = _record(False)

    def test_the_forward_keeps_what_the_partitioner_saves(self):
        graphs = self.compiled.compiled_graphs
        self.assertEqual(len(graphs), 1, "one graph, no recompilation at the second step")
        saved = graphs[0].saved_bytes
        self.assertGreater(saved, 0)
        self.assertEqual(_kept_at_backward(self.compiled, 2), saved)
        # The partitioner recomputes the pointwise chain: fewer bytes than eager keeps.
        self.assertLess(saved, _kept_at_backward(self.eager, 2))

    def test_the_graphs_operators_and_the_parameters_are_recorded(self):
        terms = {r.term for op, r in self.compiled.events if op == "alloc"}
        self.assertTrue({"weights", "gradients", "optimizer", "activations"} <= terms, terms)
        grads = sum(r.size for op, r in self.compiled.events if op == "alloc" and r.term == "gradients"
                    and r.when == "step2.backward")
        self.assertEqual(grads, sum(p.numel() * 4 for p in Block().parameters()))
        self.assertEqual([r.site for op, r in self.compiled.events if op == "alloc" and r.term == "weights"][:2],
                         ["Block.up", "Block.up"])
        # Each fused kernel's intermediates are operators here: the forward's transient peak is at least eager's.
        self.assertGreaterEqual(self.compiled.peak, self.eager.peak - _kept_at_backward(self.eager, 2)
                                + _kept_at_backward(self.compiled, 2))
        self.assertTrue(any("min_cut_rematerialization_partition" in a for a in self.compiled.assumptions))
        self.assertTrue(any("upper bound" in a for a in self.compiled.assumptions))

    def test_the_partition_is_inductors_on_real_tensors(self):
        """The same block compiled by Inductor itself, kernels generated, on real tensors: its
        forward saves tensors of the same sizes."""
        if shutil.which("g++") is None and shutil.which("c++") is None:
            self.skipTest("Inductor's CPU kernels need a C++ compiler (g++), and there is none")
        import torch._functorch.config as functorch_config
        import torch._inductor.config as inductor_config
        from functools import partial
        from torch._inductor.compile_fx import compile_fx, compile_fx_inner

        from headroom_gpu.compiled import _user_outputs, forward_saves

        inductor_saves = []

        def inner(gm, example_inputs, **kwargs):
            if not kwargs.get("is_backward", False):
                inductor_saves.extend(size for _, size in forward_saves(gm, _user_outputs(gm)))
            return compile_fx_inner(gm, example_inputs, **kwargs)

        torch._dynamo.reset()
        cached = inductor_config.fx_graph_cache, functorch_config.enable_autograd_cache
        inductor_config.fx_graph_cache = functorch_config.enable_autograd_cache = False
        try:
            torch.manual_seed(0)
            model = Block()
            loss = torch.compile(model, backend=partial(compile_fx, inner_compile=inner))(torch.randn(BATCH, WIDTH))
            loss.backward()
        finally:
            inductor_config.fx_graph_cache, functorch_config.enable_autograd_cache = cached
            torch._dynamo.reset()
        recorded = sorted(size for _, size in self.compiled.compiled_graphs[0].saved)
        self.assertEqual(sorted(inductor_saves), recorded)


@unittest.skipIf(MISSING, MISSING)
class Command(unittest.TestCase):
    def test_record_compile_then_plan(self):
        """`record --compile` on a tiny Llama: the compiled step's notes, a recording marked
        compiled that `headroom plan --program` plans (without a step time, saying why), and the
        flags it is not recorded with refused."""
        import json
        import os
        import subprocess
        import sys
        import tempfile

        sys.path.insert(0, os.path.dirname(__file__))
        from test_recorder import _model_dir, assert_replays_and_plans, record_command

        tmp = tempfile.mkdtemp()
        model = _model_dir(tmp)
        out = os.path.join(tmp, "compiled.jsonl")
        run = record_command(self, model, out, "--batch", "2", "--seq", "64", "--compile")
        self.assertIn("assumed: torch.compile: 1 forward graphs", run.stdout)
        self.assertIn("upper bound", run.stdout)
        with open(out, encoding="utf-8") as f:
            lines = [json.loads(line) for line in f]
        self.assertFalse([line for line in lines if line["op"] == "kernel"])
        self.assertEqual(lines[1], {"op": "compiled"})
        text = assert_replays_and_plans(self, out)
        self.assertIn("step time: not estimated (the step was recorded compiled", text)
        self.assertIn("record the step without --compile", text)
        r = subprocess.run([sys.executable, "-m", "headroom_gpu", "record", "--model", model, "--compile",
                            "--generate", "4", "--out", os.devnull], capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--compile with --generate", r.stderr)


if __name__ == "__main__":
    unittest.main()

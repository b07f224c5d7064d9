"""FSDP2 recorded over a fake process group (headroom_gpu.fsdp): rank 0's step under fake tensors
against the same step with real tensors on the CPU, and the bytes it keeps against
`fully_shard`'s rules. Skipped, saying so, where torch, transformers or peft is not installed.

    PYTHONPATH=python HEADROOM_BIN=target/debug/headroom python3 -m unittest python/tests/test_fsdp.py
"""

import collections
import dataclasses
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))

from test_recorder import MISSING, _model_dir, assert_replays_and_plans, record_command  # noqa: E402

WORLD = 4


@unittest.skipIf(MISSING, MISSING)
class Fsdp(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp()

    def spec(self, **changes):
        from headroom_gpu.transformers_step import StepSpec

        return StepSpec(model=_model_dir(self.tmp), **{"batch": 2, "seq": 64, "steps": 2, "fsdp": WORLD, **changes})

    def test_fake_against_real(self):
        from headroom_gpu.transformers_step import record

        for changes in ({}, {"lora": 4}, {"dtype": "amp"}, {"dtype": "mixed", "lora": 4, "checkpoint": True}):
            s = self.spec(**changes)
            fake, real = record(s, fake=True, route_sdpa=False), record(s, fake=False, route_sdpa=False)
            self.assertEqual(fake.peak, real.peak, changes)

    def test_the_bytes_fully_shard_keeps(self):
        import torch
        import transformers

        from headroom_gpu import fsdp
        from headroom_gpu.transformers_step import record

        rec = record(self.spec(dtype="fp32", steps=1))
        config = transformers.AutoConfig.from_pretrained(_model_dir(self.tmp))
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
        params = dict(model.named_parameters())
        allocs = [r for op, r in rec.events if op == "alloc"]

        # AdamW's two moments of each parameter's shard, and no more.
        moments = sum(r.size for r in allocs if r.term == "optimizer" and r.size > 4)
        self.assertEqual(moments, 2 * sum(fsdp.shard_bytes(p, WORLD) for p in params.values()))

        # The shards are the weights the rank keeps (with rotary's inverse frequencies, a buffer
        # fully_shard leaves whole: head_dim / 2 fp32 twice), though no module holds them while it runs.
        kept = sum(r.size for r in allocs if r.when == "setup" and r.term == "weights")
        head_dim = config.hidden_size // config.num_attention_heads
        self.assertEqual(kept, sum(fsdp.shard_bytes(p, WORLD) for p in params.values()) + 2 * head_dim // 2 * 4)

        # Each layer's all-gather: every rank's padded shard of its parameters, in its forward.
        layer = [p for n, p in params.items() if n.startswith("model.layers.0.")]
        gathered = WORLD * sum(fsdp.shard_bytes(p, WORLD) for p in layer)
        forward = [r for r in allocs if r.when == "step1.forward" and r.site.endswith("model.layers.0")]
        self.assertIn(gathered, [r.size for r in forward])

        # Where the weights outweigh the activations, more ranks keep less.
        wide = _model_dir(tempfile.mkdtemp(), hidden_size=256, intermediate_size=512)
        peaks = [record(dataclasses.replace(self.spec(dtype="fp32", steps=1), model=wide, fsdp=world)).peak
                 for world in (None, 2, 4)]
        self.assertEqual(peaks, sorted(peaks, reverse=True))
        self.assertLess(peaks[2], 0.7 * peaks[0])

    def test_each_layer_is_freed_after_it_runs(self):
        """FSDP2 frees a layer's unsharded parameters by resizing their storage to nothing (no
        operator a dispatch sees) and makes them again for the backward: the recording holds at
        most the model's own (the root's: embedding, final norm, output layer) and two layers'
        (the one running, and the next one prefetched in the backward) at once, of six."""
        import torch
        import transformers

        from headroom_gpu import fsdp
        from headroom_gpu.transformers_step import record

        layers = 6
        model_dir = _model_dir(tempfile.mkdtemp(), num_hidden_layers=layers)
        rec = record(dataclasses.replace(self.spec(dtype="fp32", steps=2), model=model_dir))
        config = transformers.AutoConfig.from_pretrained(model_dir)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
        params = dict(model.named_parameters())
        layer = WORLD * sum(fsdp.shard_bytes(p, WORLD) for n, p in params.items() if n.startswith("model.layers.0."))
        root = WORLD * sum(fsdp.shard_bytes(p, WORLD) for n, p in params.items() if ".layers." not in n)
        live, most, made = 0, 0, collections.Counter()
        for op, r in rec.events:
            if r.term != "weights" or r.when == "setup":
                continue
            live += r.size if op == "alloc" else -r.size
            most = max(most, live)
            made[r.when.split(".")[0]] += r.size if op == "alloc" else 0
        self.assertLessEqual(most, root + 2 * layer)
        self.assertGreaterEqual(most, root + layer)
        # Each step gathers every layer again, in its forward and its backward.
        self.assertGreaterEqual(made["step2"], root + 2 * layers * layer)

    def test_mixed_precision_gathers_bf16_and_keeps_fp32(self):
        import torch
        import transformers

        from headroom_gpu import fsdp
        from headroom_gpu.transformers_step import record

        rec = record(self.spec(dtype="mixed", steps=1))
        config = transformers.AutoConfig.from_pretrained(_model_dir(self.tmp))
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
        params = dict(model.named_parameters())
        allocs = [r for op, r in rec.events if op == "alloc"]
        # fp32 moments of the fp32 shards; each layer gathered as bf16 (half its fp32 shards' bytes).
        moments = sum(r.size for r in allocs if r.term == "optimizer" and r.size > 4)
        self.assertEqual(moments, 2 * sum(fsdp.shard_bytes(p, WORLD) for p in params.values()))
        layer = [p for n, p in params.items() if n.startswith("model.layers.0.")]
        gathered = WORLD * sum(fsdp.shard_bytes(p, WORLD) for p in layer) // 2
        forward = [r.size for r in allocs if r.when == "step1.forward" and r.site.endswith("model.layers.0")]
        self.assertIn(gathered, forward)
        self.assertNotIn(2 * gathered, forward)
        with self.assertRaisesRegex(ValueError, "--fsdp"):
            record(dataclasses.replace(self.spec(dtype="mixed"), fsdp=None))

    def test_a_model_without_layers_is_refused_saying_how(self):
        import torch

        from headroom_gpu import fsdp

        with self.assertRaisesRegex(ValueError, "fully_shard"):
            fsdp.layers(torch.nn.Linear(2, 2))
        with self.assertRaisesRegex(ValueError, "rank"):
            with fsdp.fake_process_group(2, rank=2):
                pass

    def test_the_documented_program(self):
        """docs/RECORDING.md's FSDP2 example runs as shown and records a sharded step."""
        from test_recorder import _documented

        block = [b for b in _documented("python") if any("fake_process_group" in line for line in b)]
        self.assertEqual(len(block), 1)
        cwd = os.getcwd()
        os.chdir(self.tmp)
        try:
            scope = {}
            exec(compile("\n".join(block[0]), "docs/RECORDING.md", "exec"), scope)
        finally:
            os.chdir(cwd)
        self.assertTrue(os.path.getsize(os.path.join(self.tmp, "fsdp-step.jsonl")) > 0)
        # AdamW's moments of 4 layers of 1024 × 1024 + 1024, an eighth each.
        moments = sum(r.size for op, r in scope["rec"].events if op == "alloc" and r.term == "optimizer" and r.size > 4)
        self.assertEqual(moments, 4 * 2 * (128 * 1024 + 128) * 4)

    def test_the_documented_figures(self):
        """docs/RECORDING.md's GPT-2 `--fsdp 8` figures are what its plans print: the recording's
        (the command its `sh` block shows, planned as its text shows) and the planner's own."""
        import re

        from test_recorder import REPO, headroom_or_skip

        binary = headroom_or_skip(self)
        with open(os.path.join(REPO, "docs", "RECORDING.md"), encoding="utf-8") as f:
            text = " ".join(f.read().split())
        found = re.search(r"\(`(headroom plan [^`]*--program gpt2-fsdp8.jsonl)`\): ([0-9.]+ GiB) allocated and "
                          r"([0-9.]+ GiB) reserved.*?\(`(headroom plan --model gpt2 [^`]*)`\) allocates "
                          r"([0-9.]+ GiB)", text)
        self.assertIsNotNone(found)
        plan, allocated, reserved, template, own_allocated = found.groups()
        from test_recorder import _documented

        command = [l for b in _documented("sh") for l in b if l.endswith("--out gpt2-fsdp8.jsonl")]
        self.assertEqual(len(command), 1)
        os.symlink(os.path.join(REPO, "data"), os.path.join(self.tmp, "data"))
        env = {**os.environ, "PYTHONPATH": os.path.join(REPO, "python")}
        run = subprocess.run([sys.executable, *command[0].split()[1:]], cwd=self.tmp, capture_output=True,
                             text=True, env=env, timeout=900)
        self.assertEqual(run.returncode, 0, run.stderr)
        printed = subprocess.run([binary, *plan.split()[1:]], cwd=self.tmp, capture_output=True, text=True,
                                 timeout=300)
        self.assertIn(f"allocated {allocated} ", printed.stdout, printed.stderr)
        self.assertIn(f"reserved {reserved} ", printed.stdout)
        own = subprocess.run([binary, *template.split()[1:]], capture_output=True, text=True, timeout=300)
        self.assertIn(f"allocated {own_allocated} ", own.stdout, own.stderr)

    def test_the_command_records_and_plan_replays(self):
        out = os.path.join(self.tmp, "fsdp.jsonl")
        record_command(self, _model_dir(self.tmp), out, "--batch", "2", "--seq", "64", "--steps", "2",
                       "--fsdp", str(WORLD))
        # One rank of WORLD: the plan adds NCCL's buffers.
        assert_replays_and_plans(self, out, "--gpus", str(WORLD))

    def test_lora_with_checkpointing_records_and_plans(self):
        """`--lora RANK --fsdp GPUS --checkpoint`: the adapters sharded with the frozen base in each
        layer's group (fsdp_qlora's `lora` over a bf16 base)."""
        out = os.path.join(self.tmp, "fsdp-lora.jsonl")
        record_command(self, _model_dir(self.tmp), out, "--batch", "2", "--seq", "64", "--steps", "2",
                       "--lora", "4", "--fsdp", str(WORLD), "--checkpoint")
        assert_replays_and_plans(self, out, "--gpus", str(WORLD))


if __name__ == "__main__":
    unittest.main()

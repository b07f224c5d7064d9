"""torchtune's single-device recipes recorded (headroom_gpu.torchtune_recipe): chunked
cross-entropy, the optimizer in the backward, activation offloading and checkpointing, LoRA and
8-bit AdamW, each the same under fake tensors as with real ones on the CPU, and each recording
replayed and planned by headroom. Skipped, saying so, where torchtune does not import. torchtune
0.6.1 needs torchao 0.11, which peft 0.21 refuses (it asks for 0.16 or later, which has dropped what
torchtune 0.6.1 imports), so torchao goes on the path of these tests only, as .ci/run does:

    pip install torchtune==0.6.1
    pip install --no-deps --target torchao-0.11 torchao==0.11.0
    PYTHONPATH=python:torchao-0.11 HEADROOM_BIN=target/debug/headroom python3 -m unittest python/tests/test_torchtune.py
"""

import json
import os
import shlex
import subprocess
import sys
import tempfile
import unittest

try:
    import torch  # noqa: F401
    import torchtune  # noqa: F401

    MISSING = None
except ImportError as e:  # pragma: no cover - depends on the environment
    MISSING = ("the torchtune recipes' tests need torchtune 0.6.1 and torchao 0.11 (pip install torchtune==0.6.1; "
               f"pip install --no-deps --target torchao-0.11 torchao==0.11.0; PYTHONPATH=torchao-0.11): {e}")

try:
    import bitsandbytes  # noqa: F401

    NO_BNB = None
except ImportError as e:  # pragma: no cover - depends on the environment
    NO_BNB = f"8-bit AdamW needs bitsandbytes (pip install bitsandbytes==0.50.2): {e}"

sys.path.insert(0, os.path.dirname(__file__))

from test_recorder import REPO, _documented, assert_replays_and_plans, record_command  # noqa: E402

# A Llama 3.2 of two layers, grouped heads and tied embeddings, with Llama 3's RoPE scaling.
TINY_LLAMA_3_2 = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 256,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 32.0, "rope_type": "llama3", "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192},
}
BATCH, SEQ = 2, 64
# The package, and the path given (where torchao 0.11 is installed apart).
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (os.path.join(REPO, "python"),
                                                               os.environ.get("PYTHONPATH", "")) if p)}
ADAMW = {"_component_": "torch.optim.AdamW", "lr": 2e-5}


def _recipe(tmp, name, **changes):
    """torchtune's shipped llama3_2 config `name` with `changes`, written to `tmp`."""
    from omegaconf import OmegaConf

    from headroom_gpu.torchtune_recipe import shipped

    cfg = OmegaConf.load(shipped(os.path.join("llama3_2", name)))
    for key, value in changes.items():
        cfg[key] = value
    path = os.path.join(tmp, f"{len(os.listdir(tmp))}-{name}")
    OmegaConf.save(cfg, path)
    return path


def _model(tmp):
    path = os.path.join(tmp, "config.json")
    with open(path, "w") as f:
        json.dump(TINY_LLAMA_3_2, f)
    return path


def _allocs(rec):
    return [r for op, r in rec.events if op == "alloc"]


def _live_peak(rec, term):
    """The most bytes of `term` alive at once."""
    live = peak = 0
    for op, r in rec.events:
        if r.term == term:
            live += r.size if op == "alloc" else -r.size
            peak = max(peak, live)
    return peak


@unittest.skipIf(MISSING, MISSING)
class FakeAgainstReal(unittest.TestCase):
    """The recipe's step recorded under fake tensors reaches the live peak the same step reaches
    with real tensors on the CPU (attention left to the CPU's choice in both)."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp()

    def both(self, name, **changes):
        from headroom_gpu import torchtune_recipe as tr

        recipe = tr.read(_recipe(self.tmp, name, **changes))
        model = _model(self.tmp)
        return [tr.record(recipe, model, BATCH, SEQ, steps=2, fake=fake, route_sdpa=False) for fake in (True, False)]

    @unittest.skipIf(NO_BNB, NO_BNB)
    def test_full_as_shipped_8bit_adamw_in_the_backward(self):
        fake, real = self.both("1B_full_single_device.yaml")
        self.assertEqual(fake.rec.peak, real.rec.peak)
        rec = fake.rec
        # The optimizer's state is made in the backward, where each gradient is stepped and freed:
        # no optimizer phase, and no gradient outlives the backward.
        self.assertFalse([r for r in _allocs(rec) if r.when.endswith(".optimizer")])
        self.assertTrue([r for r in _allocs(rec) if r.term == "optimizer" and r.when == "step1.backward"])
        grads = {r.index for r in _allocs(rec) if r.term == "gradients"}
        self.assertTrue(grads)
        live, at_end = set(), None
        for i, (op, r) in enumerate(rec.events):
            (live.add if op == "alloc" else live.discard)(r.index)
            if i + 1 == rec._step_starts[1][0]:
                at_end = live & grads
        self.assertEqual(at_end, set(), "gradients alive after the first step")
        self.assertIn("PagedAdamW8bit recorded as AdamW8bit", " ".join(rec.assumptions))

    def test_optimizer_in_the_backward_holds_one_gradient_at_a_time(self):
        after, = self.both("1B_full_single_device.yaml", optimizer_in_bwd=False, optimizer=ADAMW)[:1]
        inside, real = self.both("1B_full_single_device.yaml", optimizer=ADAMW)
        self.assertEqual(inside.rec.peak, real.rec.peak)
        # AdamW after the backward holds every gradient at once (the tied embedding's among them);
        # in the backward, a parameter's gradient is freed once it is stepped. The tied embedding's
        # first gradient (the output layer's) waits in the engine's buffer for the embedding's, and
        # the sum is made in its storage as a GPU makes it, so it is a gradient from the output
        # layer's backward on, beside the one being stepped: at most two of the largest.
        largest = TINY_LLAMA_3_2["vocab_size"] * TINY_LLAMA_3_2["hidden_size"] * 2
        self.assertGreater(_live_peak(after.rec, "gradients"), 2 * largest)
        self.assertLessEqual(_live_peak(inside.rec, "gradients"), 2 * largest)

    def test_chunked_cross_entropy_upcasts_a_chunk_at_a_time(self):
        chunked, real = self.both("1B_full_single_device.yaml", optimizer_in_bwd=False, optimizer=ADAMW)
        self.assertEqual(chunked.rec.peak, real.rec.peak)
        whole, real = self.both("1B_full_single_device.yaml", optimizer_in_bwd=False, optimizer=ADAMW,
                                loss={"_component_": "torch.nn.CrossEntropyLoss"})
        self.assertEqual(whole.rec.peak, real.rec.peak)
        logits = BATCH * SEQ * TINY_LLAMA_3_2["vocab_size"]
        def loss(rec, site):
            return [r.size for r in _allocs(rec) if r.when == "step2.forward" and r.site == site]

        # Each of the 8 chunks upcast to fp32 on its own (the upcast and its log-softmax); unchunked,
        # the model returns the whole logits in fp32 (TransformerDecoder's unembed upcasts them), and
        # the loss's log-softmax is of all of them.
        self.assertEqual(max(loss(chunked.rec, "CEWithChunkedOutputLoss")), logits // 8 * 4)
        self.assertEqual(loss(chunked.rec, "CEWithChunkedOutputLoss").count(logits // 8 * 4), 2 * 8)
        self.assertEqual(max(loss(whole.rec, "CrossEntropyLoss")), logits * 4)
        self.assertEqual(sum(1 for r in _allocs(chunked.rec) if r.term == "logits" and r.when == "step2.forward"), 8)

    def test_activation_offloading_moves_saved_tensors_to_the_host(self):
        kept, = self.both("1B_full_single_device.yaml", optimizer=ADAMW)[:1]
        moved, real = self.both("1B_full_single_device.yaml", optimizer=ADAMW, enable_activation_offloading=True)
        self.assertEqual(moved.rec.peak, real.rec.peak)
        self.assertEqual(moved.host_peak, real.host_peak)
        self.assertGreater(moved.host_peak, 0)
        self.assertEqual(kept.host_peak, 0)
        self.assertLess(moved.rec.peak, kept.rec.peak)
        # Each tensor brought back is a backward allocation of its size.
        self.assertGreater(sum(r.size for r in _allocs(moved.rec) if r.when == "step2.backward"),
                           sum(r.size for r in _allocs(kept.rec) if r.when == "step2.backward"))

    def test_offloading_with_checkpointing(self):
        fake, real = self.both("1B_full_single_device.yaml", optimizer=ADAMW, enable_activation_offloading=True,
                               enable_activation_checkpointing=True)
        self.assertEqual(fake.rec.peak, real.rec.peak)
        self.assertEqual(fake.host_peak, real.host_peak)
        self.assertTrue(any(k[2].get("recompute") for k in fake.rec.kernel_lines))

    def test_lora_with_accumulation(self):
        fake, real = self.both("1B_lora_single_device.yaml", gradient_accumulation_steps=2)
        self.assertEqual(fake.rec.peak, real.rec.peak)
        grads = [r for r in _allocs(fake.rec) if r.term == "gradients" and r.when.startswith("step2")]
        # Only the adapters are trained: A and B of q, v, output and the 3 MLP projections of 2 layers.
        self.assertEqual(len(grads), 2 * 6 * 2)


@unittest.skipIf(MISSING, MISSING)
class Command(unittest.TestCase):
    """`python -m headroom_gpu record --recipe YAML`, replayed and planned."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp()

    def test_each_recipe_replays_and_plans(self):
        cases = [("1B_lora_single_device.yaml", {"gradient_accumulation_steps": 2}, "chunked cross-entropy"),
                 ("1B_full_single_device.yaml", {"optimizer": ADAMW, "enable_activation_offloading": True},
                  "host memory of activation offloading"),
                 ("1B_full_single_device.yaml", {"optimizer": ADAMW, "compile": True}, "torch.compile")]
        if not NO_BNB:
            cases.append(("1B_full_single_device.yaml", {}, "optimizer in backward"))
        for name, changes, said in cases:
            out = os.path.join(self.tmp, f"{len(os.listdir(self.tmp))}.jsonl")
            run = record_command(self, _model(self.tmp), out, "--recipe", _recipe(self.tmp, name, **changes),
                                 "--batch", str(BATCH), "--seq", str(SEQ))
            self.assertIn(said, run.stdout)
            with open(out) as f:
                self.assertEqual(json.loads(f.readline()), {"op": "shape", "batch": BATCH, "seq": SEQ})
            assert_replays_and_plans(self, out)

    def test_what_is_not_recorded_is_refused(self):
        model = _model(self.tmp)
        cases = [({"model": {"_component_": "torchtune.models.qwen2_5.qwen2_5_0_5b"}}, [], "model._component_"),
                 ({"fsdp_cpu_offload": True}, [], "fsdp_cpu_offload"),
                 ({"optimizer_in_bwd": True, "gradient_accumulation_steps": 4}, [], "gradient_accumulation_steps: 1"),
                 ({"loss": {"_component_": "torchtune.modules.loss.LinearCrossEntropyLoss"}}, [], "loss._component_"),
                 ({}, ["--lora", "4"], "--lora with --recipe"),
                 ({}, [], "tokenizer.max_seq_len is null")]
        for changes, flags, said in cases:
            recipe = _recipe(self.tmp, "1B_full_single_device.yaml", **changes)
            seq = [] if said.startswith("tokenizer") else ["--seq", "64"]
            r = subprocess.run([sys.executable, "-m", "headroom_gpu", "record", "--recipe", recipe, "--model", model,
                                *seq, *flags, "--out", os.devnull], capture_output=True, text=True,
                               env=ENV, timeout=600)
            self.assertEqual(r.returncode, 2, (changes, flags, r.stderr))
            self.assertIn(said, r.stderr)
            self.assertNotIn("Traceback", r.stderr)


@unittest.skipIf(MISSING, MISSING)
class Documented(unittest.TestCase):
    """docs/RECORDING.md's torchtune commands (its `bash` blocks, apart from the `sh` blocks
    tests/test_recorder.py runs, because they need torchtune), run as shown in a scratch directory
    holding the repository's data/, and their recordings planned."""

    def test_the_commands(self):
        d = tempfile.mkdtemp()
        os.symlink(os.path.join(REPO, "data"), os.path.join(d, "data"))
        lines = [l for b in _documented("bash") for l in b if "--recipe" in l or l.startswith("tune cp")]
        self.assertGreaterEqual(len(lines), 3)
        env = ENV
        tune = os.path.join(os.path.dirname(sys.executable), "tune")
        for line in lines:
            args = shlex.split(line)
            if args[0] == "tune":
                args[0] = tune
                r = subprocess.run(args, cwd=d, capture_output=True, text=True, env=env, timeout=600)
            else:
                if NO_BNB and "full" in line:
                    continue  # the shipped full recipe steps bitsandbytes' 8-bit AdamW
                r = subprocess.run([sys.executable, *args[1:]], cwd=d, capture_output=True, text=True, env=env,
                                   timeout=1200)
            self.assertEqual(r.returncode, 0, f"{line}: {r.stderr[-2000:]}")
            if "--out" in args:
                assert_replays_and_plans(self, os.path.join(d, args[args.index("--out") + 1]))


if __name__ == "__main__":
    unittest.main()

"""The step recorder against real torch, transformers and peft on the CPU: what it records
under fake tensors is what the same step allocates for real, and `headroom plan --program`
plans it. Skipped, saying so, where torch, transformers or peft is not installed:

    pip install torch transformers peft
    PYTHONPATH=python HEADROOM_BIN=target/debug/headroom python3 -m unittest python/tests/test_recorder.py
"""

import collections
import json
import os
import subprocess
import sys
import tempfile
import unittest

import headroom_gpu

try:
    import peft  # noqa: F401
    import torch
    import transformers

    MISSING = None
except ImportError as e:  # pragma: no cover - depends on the environment
    MISSING = f"the recorder's tests need torch, transformers and peft (pip install torch transformers peft): {e}"

# A Llama of two layers with grouped heads (4 query, 2 key/value): every path of a
# full-size one, at a size that runs for real on a CPU in a second.
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 256,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}


def _model_dir(tmp, **changes):
    d = os.path.join(tmp, "tiny-llama")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({**TINY_LLAMA, **changes}, f)
    return d


def _terms(rec):
    return collections.Counter(r.term for op, r in rec.events if op == "alloc")


@unittest.skipIf(MISSING, MISSING)
class FakeAgainstReal(unittest.TestCase):
    """The live peak recorded under fake tensors is the one the same step reaches with real
    tensors, with the same bookkeeping, on the CPU (SDPA left to the CPU's choice in both)."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp()

    def both(self, **spec):
        from headroom_gpu.transformers_step import StepSpec, record

        s = StepSpec(model=_model_dir(self.tmp), batch=2, seq=64, steps=2, **spec)
        return record(s, fake=True, route_sdpa=False), record(s, fake=False, route_sdpa=False)

    def test_full_fine_tuning_bf16_and_fp32(self):
        for dtype in ("bf16", "fp32"):
            fake, real = self.both(dtype=dtype)
            self.assertEqual(fake.peak, real.peak, dtype)
            self.assertGreater(fake.peak, 0)
            t = _terms(fake)
            for term in ("weights", "gradients", "optimizer", "activations", "logits", "inputs"):
                self.assertGreater(t[term], 0, f"{dtype}: no {term}")

    def test_lora_checkpointing_and_other_optimizers(self):
        for spec in (
            {"lora": 4},
            {"checkpoint": True, "optimizer": "sgd-momentum", "dtype": "fp32"},
            {"attention": "eager", "optimizer": "sgd", "dtype": "fp32"},
        ):
            fake, real = self.both(**spec)
            self.assertEqual(fake.peak, real.peak, spec)

    def test_lora_grads_only_the_adapters(self):
        fake, _ = self.both(lora=4)
        grads = sum(1 for op, r in fake.events if op == "alloc" and r.term == "gradients")
        # Two steps, each a gradient for A and B of each of the 7 linear layers of 2 blocks.
        self.assertEqual(grads, 2 * 2 * 7 * 2)


@unittest.skipIf(MISSING, MISSING)
class Inference(unittest.TestCase):
    """Inference recorded: a forward without gradients, and generate's prefill and decode steps
    with the key-value cache, the same under fake tensors as with real ones."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp()

    def both(self, **spec):
        from headroom_gpu.transformers_step import StepSpec, record

        s = StepSpec(model=_model_dir(self.tmp), batch=2, seq=64, dtype="bf16", **spec)
        return record(s, fake=True, route_sdpa=False), record(s, fake=False, route_sdpa=False)

    def test_a_forward_records_no_gradients(self):
        fake, real = self.both(mode="infer", steps=2)
        self.assertEqual(fake.peak, real.peak)
        terms = _terms(fake)
        self.assertEqual(terms["gradients"] + terms["optimizer"], 0)
        self.assertGreater(terms["logits"], 0)
        self.assertEqual({r.when.split(".")[1] for op, r in fake.events if r.when != "setup"}, {"forward"})

    def test_generate_grows_the_cache_a_token_a_step(self):
        fake, real = self.both(mode="generate", new_tokens=3)
        self.assertEqual(fake.peak, real.peak)
        self.assertEqual(fake._step, 4)  # the prefill and three decode steps
        starts = [a for a, _ in fake._step_starts]
        live, at = 0, []
        for i, (op, r) in enumerate(fake.events):
            live += r.size if op == "alloc" else -r.size
            if i + 1 in starts[1:]:
                at.append(live)
        # Each decode step keeps one more position of keys and values in each of the 2 layers
        # (2 sequences, 2 key-value heads of 16, bf16) and one more id a sequence (int64).
        per_token = 2 * 2 * (2 * 2 * 16 * 2) + 2 * 8
        self.assertEqual([b - a for a, b in zip(at, at[1:])], [per_token, per_token])

    def test_record_infer_then_plan_and_replay(self):
        model = _model_dir(self.tmp)
        for flags in (["--infer"], ["--generate", "2"]):
            out = os.path.join(self.tmp, "infer.jsonl")
            run = subprocess.run([sys.executable, "-m", "headroom_gpu", "record", "--model", model, "--batch", "2",
                                  "--seq", "64", *flags, "--out", out], capture_output=True, text=True)
            self.assertEqual(run.returncode, 0, run.stderr)
            self.assertIn("forward" if flags == ["--infer"] else "decode steps", run.stdout)
            replay = subprocess.run([_headroom(), "replay", out], capture_output=True, text=True)
            self.assertEqual(replay.returncode, 0, replay.stderr)
            plan = subprocess.run([_headroom(), "plan", "--model", model, "--gpu", "l4", "--program", out, "--json"],
                                  capture_output=True, text=True)
            self.assertEqual(plan.returncode, 0, plan.stderr)
            answer = json.loads(plan.stdout)
            self.assertEqual(answer["peak_phase"], "forward")
            # Planned as inference: generate's prefill and decode steps, or forwards alike.
            self.assertEqual((answer["mode"], answer["decode_steps"]), ("infer", None if flags == ["--infer"] else 2))
            self.assertEqual(answer["breakdown"]["gradients"] + answer["breakdown"]["optimizer"], 0)

    def test_training_flags_are_refused_with_inference(self):
        for flags, said in ((["--infer", "--checkpoint"], "--checkpoint is a training flag"),
                            (["--generate", "2", "--optimizer", "sgd"], "--optimizer is a training flag"),
                            (["--infer", "--generate", "2"], "choose one"), (["--generate", "0"], "--generate 0")):
            run = subprocess.run([sys.executable, "-m", "headroom_gpu", "record", "--model", "x", *flags, "--out",
                                  os.devnull], capture_output=True, text=True)
            self.assertEqual(run.returncode, 2, flags)
            self.assertIn(said, run.stderr)


def _cpu_peak(step, alive):
    """A step's live peak with real tensors and no dispatch mode, as a GPU runs it: the storages
    alive as it starts plus the highest running sum of the CPU allocator's events (storages of more
    than 8 bytes: a CPU kernel wraps Python numbers in tensors of its own, a GPU's takes them as
    arguments)."""
    from torch.profiler import ProfilerActivity, profile

    seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in alive}
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e.start_ns(), i, e.nbytes()) for i, e in enumerate(prof.profiler.kineto_results.events())
                    if e.name() == "[memory]")
    live = peak = 0
    for _, _, nbytes in events:
        if abs(nbytes) > 8:
            live += nbytes
            peak = max(peak, live)
    return sum(n for n in seen.values() if n > 8) + peak


def _recorded_peak(rec):
    """The recording's live peak in its second (last) step, of storages of more than 8 bytes:
    the recorder's CPU truth's walk (`scripts/validate/recorder_truth.py`)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "validate"))
    import recorder_truth

    return recorder_truth.second_step_peak(rec, recorder_truth.SCALAR)


@unittest.skipIf(MISSING, MISSING)
class GradientSums(unittest.TestCase):
    """Where two gradients of one tensor meet, autograd sums them in place on a GPU (into the
    first, `InputBuffer::accumulate`), out of place where the first is a view, and adds a later
    micro-batch's gradient into `.grad` in place (`AccumulateGrad`): the recording makes a tensor
    for a sum where the engine does, so its peak is the one the same step reaches with real
    tensors and no dispatch mode."""

    def steps(self, build, step):
        """`step(*build())` twice with real tensors (the second measured), and twice recorded
        under fake tensors: both peaks. Each step frees its gradients at its end."""
        from headroom_gpu.recorder import StepRecorder

        torch.manual_seed(0)
        made = build()
        step(*made)
        alive = [t for t in made if isinstance(t, torch.Tensor)]
        alive += [p for m in made if isinstance(m, torch.nn.Module) for p in m.parameters()]
        real = _cpu_peak(lambda: step(*made), alive)
        with StepRecorder(route_sdpa=False) as rec:
            made = build()
            for _ in range(2):
                with rec.step():
                    step(*made)
        return _recorded_peak(rec), real, rec

    def test_a_weight_used_twice(self):
        # The sum of the weight's two gradients comes last in the backward, with the two and the
        # input's gradient live: an out-of-place sum is the step's peak.
        def build():
            return torch.nn.Parameter(torch.randn(512, 512)), torch.randn(256, 512)

        def step(w, x):
            ((x @ w).relu() @ w).sum().backward()
            w.grad = None

        recorded, real, rec = self.steps(build, step)
        self.assertEqual(recorded, real)
        weight_sized = [r for op, r in rec.events if op == "alloc" and r.when == "step2.backward" and r.size == 512 * 512 * 4]
        self.assertEqual(len(weight_sized), 2, "the two gradients of the weight, the sum in the first")

    def test_an_adapter_beside_its_base_layer(self):
        # T5's feed-forward under QLoRA (docs/VALIDATION.md, "T5's and the MoE models' moves,
        # traced"): `wo` an fp32 layer with peft's adapter beside it, so the gradient of its
        # input (after `wi` and the ReLU) arrives from the base layer and from `lora_A`. Each is
        # `ViewBackward0`'s view of a matrix multiply's output (the input has three dimensions),
        # which holds that output: the engine adds the two out of place, and the sum, with the
        # two and the ReLU's saved output live, is the step's peak.
        import peft

        class FeedForward(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.wi = torch.nn.Linear(64, 1024, bias=False)
                self.wo = torch.nn.Linear(1024, 64, bias=False)

            def forward(self, x):
                return self.wo(torch.relu(self.wi(x)))

        def build():
            model = peft.get_peft_model(FeedForward(), peft.LoraConfig(r=8, target_modules=["wo"]))
            # The frozen layer's input needs a gradient, as under checkpointing with
            # `enable_input_require_grads`: the sum is of an activation's gradient, not a weight's.
            return model, torch.randn(1, 160, 64, requires_grad=True)

        def step(model, x):
            model(x).square().sum().backward()
            x.grad = None
            for p in model.parameters():
                p.grad = None

        recorded, real, rec = self.steps(build, step)
        self.assertEqual(recorded, real)
        wide = [r.site for op, r in rec.events if op == "alloc" and r.when == "step2.backward"
                and r.size == 160 * 1024 * 4]
        # wo's input's two gradients, their sum, and the ReLU's backward's output.
        self.assertEqual(wide, ["MmBackward0", "MmBackward0", "ViewBackward0", "ReluBackward0"])

    def test_two_micro_batches_accumulate_into_the_gradient(self):
        def build():
            return torch.nn.Linear(512, 512, bias=False), torch.randn(256, 512)

        def step(layer, x):
            for half in x.chunk(2):
                layer(half).square().sum().backward()
            layer.weight.grad = None

        recorded, real, _ = self.steps(build, step)
        self.assertEqual(recorded, real)


@unittest.skipIf(MISSING, MISSING)
class RepeatedSteps(unittest.TestCase):
    """Steps after the second are written as the second repeated: the program is the one that
    recording every step writes, line for line (operations, ids, sizes, order, kernels)."""

    def test_written_steps_are_the_recorded_steps(self):
        from headroom_gpu.transformers_step import StepSpec, record

        tmp = tempfile.mkdtemp()
        gpt2 = os.path.join(REPO, "data", "models", "presets", "gpt2.json")
        for model, spec in ((gpt2, {"batch": 1, "seq": 64}), (_model_dir(tmp), {"batch": 2, "seq": 64, "lora": 4}),
                            (_model_dir(tmp), {"batch": 2, "seq": 64, "checkpoint": True, "dtype": "fp32"}),
                            (_model_dir(tmp), {"batch": 2, "seq": 64, "checkpoint": True, "lora": 4})):
            recorded = record(StepSpec(model=model, steps=4, repeat=False, **spec))
            written = record(StepSpec(model=model, steps=4, **spec))
            self.assertEqual(written._step, 4)
            self.assertEqual(written.peak, recorded.peak, spec)
            self.assertEqual(written.sdpa_kernels, recorded.sdpa_kernels, spec)
            a, b = recorded.to_jsonl("all").splitlines(), written.to_jsonl("all").splitlines()
            self.assertEqual(len(a), len(b), spec)
            first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
            self.assertIsNone(first, f"{spec}: line {first}: {a[first] if first else ''} != {b[first] if first else ''}")
            self.assertTrue(any('"step4.backward' in l for l in b))

    def test_the_loss_and_what_its_graph_keeps_live_until_the_next_forward(self):
        from headroom_gpu.transformers_step import StepSpec, record

        # As a script holds `loss` until the next forward's replaces it: under checkpointing,
        # peft's leaf of the input embeddings' output and its gradient live through the optimizer
        # step too (2 x 64 tokens x 32 wide, fp32), freed by the next step's forward.
        rec = record(StepSpec(model=_model_dir(tempfile.mkdtemp()), batch=2, seq=64, steps=3, repeat=False,
                              lora=4, checkpoint=True))
        third = rec._step_starts[2][0]
        held = sorted((r.when, r.size, r.site.rsplit(".", 1)[-1]) for op, r in rec.events[third:]
                      if op == "free" and r.when.startswith("step2."))
        self.assertEqual(held, [("step2.backward", 2 * 64 * 32 * 4, "ToCopyBackward0"),
                                ("step2.forward", 4, "model"),
                                ("step2.forward", 2 * 64 * 32 * 4, "embed_tokens")])
        # Freed in the forward: before the third step's backward makes anything.
        backward = next(i for i, (op, r) in enumerate(rec.events) if r.when == "step3.backward")
        last = max(i for i, (op, r) in enumerate(rec.events) if op == "free" and r.when.startswith("step2.")
                   and i >= third)
        self.assertLess(last, backward)

    def test_a_step_that_frees_an_earlier_steps_tensor_without_a_counterpart_is_not_repeated(self):
        from headroom_gpu.recorder import StepRecorder

        with StepRecorder() as rec:
            kept = None
            for n in (16, 32):
                with rec.step():
                    kept = torch.ones(n) * 2  # the earlier step's tensor, of another size, freed here
            n = len(rec.events)
            self.assertFalse(rec.repeat_step())
            self.assertEqual(len(rec.events), n)
            self.assertEqual(rec._step, 2)
        del kept

    def test_what_a_step_frees_of_the_step_before_the_repeat_frees_of_the_last(self):
        from headroom_gpu.recorder import StepRecorder

        # A script's `loss`, held until the next forward's replaces it.
        with StepRecorder() as rec:
            held = None
            for _ in range(2):
                with rec.step():
                    held = torch.full((16,), 2.0)
            self.assertTrue(rec.repeat_step())
            self.assertTrue(rec.repeat_step())
            allocs = [r for op, r in rec.events if op == "alloc" and r.size == 64]
            freed = [r for op, r in rec.events if op == "free" and r.size == 64]
            self.assertEqual([r.when for r in allocs], [f"step{i}.forward" for i in (1, 2, 3, 4)])
            # Each step frees the one before's; the last's lives on.
            self.assertEqual(freed, allocs[:3])
            self.assertEqual(rec.live, 64 + sum(r.size for op, r in rec.events if op == "alloc" and r.size != 64)
                             - sum(r.size for op, r in rec.events if op == "free" and r.size != 64))
        del held


@unittest.skipIf(MISSING, MISSING)
class Sdpa(unittest.TestCase):
    """Attention takes the kernel an sm90 GPU takes, and the recording keeps what it keeps."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp()

    def record(self, **spec):
        from headroom_gpu.transformers_step import StepSpec, record

        changes = spec.pop("config", {})
        return record(StepSpec(model=_model_dir(self.tmp, **changes), batch=2, seq=256, steps=1, **spec))

    def test_the_gpu_rule_picks_the_kernel(self):
        self.assertEqual(self.record(dtype="bf16").sdpa_kernels, {"flash": 2})
        # fp32 with grouped heads: the math path; without: memory-efficient.
        self.assertEqual(self.record(dtype="fp32").sdpa_kernels, {"math": 2})
        self.assertEqual(self.record(dtype="fp32", config={"num_key_value_heads": 4}).sdpa_kernels, {"efficient": 2})

    def test_flash_keeps_the_log_sum_exp_not_the_probabilities(self):
        flash = self.record(dtype="bf16")
        eager = self.record(dtype="bf16", attention="eager")
        # b·h·s·s probabilities of 2·4·256·256 bf16 = 1 MiB a layer, kept by eager attention only.
        self.assertGreater(eager.peak - flash.peak, 2 * 4 * 256 * 256 * 2)

    def test_the_rule(self):
        from headroom_gpu import sdpa

        q16 = torch.empty(1, 8, 16, 64, dtype=torch.bfloat16, device="meta")
        kv16 = torch.empty(1, 2, 16, 64, dtype=torch.bfloat16, device="meta")
        self.assertEqual(sdpa.backend(q16, kv16, kv16, None, True, True), sdpa.FLASH)
        mask = torch.empty(1, 1, 16, 16, dtype=torch.bool, device="meta")
        self.assertEqual(sdpa.backend(q16, q16, q16, mask, False, False), sdpa.EFFICIENT)
        big = torch.empty(1, 8, 16, 512, dtype=torch.bfloat16, device="meta")
        self.assertEqual(sdpa.backend(big, big, big, None, True, False), sdpa.EFFICIENT)
        q32 = q16.float()
        self.assertEqual(sdpa.backend(q32, q32, q32, None, True, False), sdpa.EFFICIENT)
        self.assertEqual(sdpa.backend(q32, kv16.float(), kv16.float(), None, True, True), sdpa.MATH)


@unittest.skipIf(MISSING, MISSING)
class JobDtype(unittest.TestCase):
    """`--dtype` is the weights' dtype whatever the config says: a Hub config.json carries the
    dtype its checkpoint was saved in (`torch_dtype`), which `from_config` builds in unless told
    otherwise, and a 1.7B model's fp32 step recorded in bf16 is 12 GB short."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp()

    def test_the_jobs_dtype_wins_over_the_configs(self):
        from headroom_gpu.transformers_step import StepSpec, _build

        wanted = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "amp": torch.float32}
        for saved in (None, "bfloat16", "float16", "float32"):
            model = _model_dir(self.tmp, **({"torch_dtype": saved} if saved else {}))
            for dtype, want in wanted.items():
                built, _ = _build(StepSpec(model=model, dtype=dtype))
                self.assertEqual({p.dtype for p in built.parameters()}, {want}, f"--dtype {dtype}, config {saved}")
            self.assertEqual(torch.get_default_dtype(), torch.float32)

    def test_record_dtype_fp32_of_a_bf16_config(self):
        model = _model_dir(self.tmp, torch_dtype="bfloat16")
        steps = {}
        for dtype in ("fp32", "bf16"):
            out = os.path.join(self.tmp, f"{dtype}.jsonl")
            steps[dtype] = record_command(self, model, out, "--dtype", dtype, "--batch", "2", "--seq", "64",
                                          "--steps", "1").stdout
        # fp32 with grouped heads takes SDPA's math path on an sm90 GPU; flash is bf16 and fp16 only.
        self.assertIn("math 2 calls", steps["fp32"])
        self.assertIn("flash 2 calls", steps["bf16"])
        peak = {d: int(s.split("live peak ")[1].split()[0]) for d, s in steps.items()}
        # Weights, gradients and AdamW's two moments, all live at the first optimizer step: 16 bytes a
        # parameter in fp32, 8 in bf16.
        from headroom_gpu.transformers_step import StepSpec, _build

        params = sum(p.numel() for p in _build(StepSpec(model=model))[0].parameters())
        self.assertGreaterEqual(peak["fp32"], 16 * params)
        self.assertGreaterEqual(peak["fp32"] - peak["bf16"], 8 * params)


@unittest.skipIf(MISSING, MISSING)
class DataDependent(unittest.TestCase):
    def test_operators_on_data_get_a_stated_assumption(self):
        from headroom_gpu.recorder import StepRecorder

        with StepRecorder(data_dependent_fraction=0.5) as rec:
            layer = torch.nn.Linear(16, 16)
            x = torch.randn(8, 16)
            with rec.step():
                y = layer(x)
                rows = torch.nonzero(y > 0)
                kept = y[y > 0]
                n = (y > 0).sum().item()
                kept.sum().backward()
        self.assertEqual(tuple(rows.shape), (64, 2))
        self.assertEqual(tuple(kept.shape), (64,))
        self.assertEqual(n, 1)
        self.assertEqual(len(rec.assumptions), 3, rec.assumptions)


def _headroom():
    return headroom_gpu.binary()


def record_command(test: unittest.TestCase, model: str, out: str, *flags: str) -> subprocess.CompletedProcess:
    """`python -m headroom_gpu record --model MODEL FLAGS --out OUT`, which must succeed."""
    # The path given is kept after the package's (a package installed apart, as torchtune's torchao is).
    path = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    r = subprocess.run([sys.executable, "-m", "headroom_gpu", "record", "--model", model, *flags, "--out", out],
                       capture_output=True, text=True, env=env, timeout=600)
    test.assertEqual(r.returncode, 0, r.stderr)
    return r


def assert_replays_and_plans(test: unittest.TestCase, out: str, *plan_flags: str) -> str:
    """The recording `out` goes through `headroom replay` and fits on one H100 under `headroom
    plan --program` (with `plan_flags`), whose text is returned; skipped where no headroom binary
    is at hand."""
    binary = headroom_or_skip(test)
    r = subprocess.run([binary, "replay", out], capture_output=True, text=True, timeout=120)
    test.assertEqual(r.returncode, 0, r.stderr)
    test.assertIn("peak alloc", r.stdout)
    r = subprocess.run([binary, "plan", "--gpu", "h100", "--program", out, *plan_flags],
                       capture_output=True, text=True, timeout=120)
    test.assertEqual(r.returncode, 0, r.stdout + r.stderr)
    test.assertIn("fits", r.stdout)
    return r.stdout


def headroom_or_skip(test: unittest.TestCase) -> str:
    """The headroom binary the recordings are replayed with ($HEADROOM_BIN, else the installed
    wheel's), or the test skipped saying how to give one."""
    try:
        return headroom_gpu.binary()
    except headroom_gpu.HeadroomError as e:
        test.skipTest(f"no headroom binary to replay the recording: {e}")


# T5 v1.1 (flan-t5's, T0's layout) of two layers a stack, and BERT of two layers.
TINY_T5_V1_1 = {"model_type": "t5", "d_model": 64, "d_ff": 128, "d_kv": 16, "num_heads": 4, "num_layers": 2,
                "vocab_size": 256, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False,
                "decoder_start_token_id": 0, "pad_token_id": 0, "architectures": ["T5ForConditionalGeneration"]}
TINY_BERT = {"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 128}


@unittest.skipIf(MISSING, MISSING)
class Heads(unittest.TestCase):
    """A full or LoRA step is recorded with the head the model trains with: T5 as a
    sequence-to-sequence LM (its output layer its own where the config says so, as its checkpoint
    loads), BERT as a masked LM; T5's SDPA on the memory-efficient kernel, which takes its position
    bias as a mask (with a gradient, the full fine-tuning's)."""

    def record(self, fields, **spec):
        from headroom_gpu.transformers_step import StepSpec, record

        d = os.path.join(tempfile.mkdtemp(), fields["model_type"])
        os.makedirs(d)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(fields, f)
        return d, record(StepSpec(model=d, batch=2, seq=64, **{"steps": 2, **spec}))

    def test_t5_trains_as_a_seq2seq_lm_with_its_own_output_layer(self):
        for spec in ({}, {"lora": 4}, {"lora": 4, "lora_targets": "qv"}, {"dtype": "fp32", "checkpoint": True}):
            with self.subTest(**spec):
                _, rec = self.record(TINY_T5_V1_1, **spec)
                # Two encoder layers' self-attention, two decoder layers' self- and
                # cross-attention, in each of two steps (and again in each backward, checkpointed).
                self.assertEqual(rec.sdpa_kernels, {"efficient": 24 if spec.get("checkpoint") else 12})
                logits = [r for op, r in rec.events if op == "alloc" and r.term == "logits"]
                self.assertTrue(logits, "the sequence-to-sequence LM's logits")

    def test_t5_v1_1_is_built_untied_and_v1_0_tied(self):
        from headroom_gpu.transformers_step import StepSpec, _build

        d, _ = self.record(TINY_T5_V1_1, steps=1)
        model, _ = _build(StepSpec(model=d, lora=4))
        base = model.get_base_model()
        self.assertIsInstance(base, transformers.T5ForConditionalGeneration)
        self.assertIsNot(base.lm_head.weight, base.shared.weight)
        d, _ = self.record(dict(TINY_T5_V1_1, feed_forward_proj="relu", tie_word_embeddings=True), steps=1)
        model, _ = _build(StepSpec(model=d))
        self.assertIs(model.lm_head.weight, model.shared.weight)

    def test_bert_trains_as_a_masked_lm(self):
        _, rec = self.record(TINY_BERT, lora=4)
        self.assertTrue(rec.peak > 0)

    def test_the_command_records_t5_and_plans_it(self):
        d, _ = self.record(TINY_T5_V1_1, steps=1)
        out = os.path.join(d, "step.jsonl")
        r = record_command(self, d, out, "--batch", "2", "--seq", "64", "--steps", "2")
        self.assertIn("recorded 2 steps", r.stdout)
        self.assertIn("efficient", r.stdout)
        assert_replays_and_plans(self, out)

    def test_inference_of_t5_is_refused_saying_where_it_is_planned(self):
        from headroom_gpu.transformers_step import StepSpec, record

        d, _ = self.record(TINY_T5_V1_1, steps=1)
        with self.assertRaisesRegex(ValueError, "headroom plan --infer"):
            record(StepSpec(model=d, batch=1, seq=16, mode="infer"))


@unittest.skipIf(MISSING, MISSING)
class Command(unittest.TestCase):
    def test_record_then_plan(self):
        tmp = tempfile.mkdtemp()
        model = _model_dir(tmp)
        out = os.path.join(tmp, "step.jsonl")
        run = subprocess.run(
            [sys.executable, "-m", "headroom_gpu", "record", "--model", model, "--batch", "2", "--seq", "128",
             "--dtype", "bf16", "--lora", "4", "--out", out],
            capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn("flash", run.stdout)
        plan = subprocess.run(
            [_headroom(), "plan", "--model", model, "--gpu", "l4", "--batch", "2", "--seq", "128", "--program", out,
             "--json"], capture_output=True, text=True)
        self.assertEqual(plan.returncode, 0, plan.stderr)
        answer = json.loads(plan.stdout)
        self.assertTrue(answer["fits"])
        self.assertEqual(answer["runner"]["builder"], "recording")
        self.assertIn(answer["peak_phase"], ("forward", "backward", "optimizer"))
        self.assertGreater(answer["breakdown"]["gradients"] + answer["breakdown"]["activations"], 0)

    def test_bad_input_exits_2(self):
        run = subprocess.run([sys.executable, "-m", "headroom_gpu", "record", "--model", "/nonexistent", "--out",
                              os.devnull], capture_output=True, text=True)
        self.assertEqual(run.returncode, 2)
        self.assertIn("/nonexistent", run.stderr)
        run = subprocess.run([sys.executable, "-m", "headroom_gpu", "record", "--model", "x", "--batch", "0", "--out",
                              os.devnull], capture_output=True, text=True)
        self.assertEqual(run.returncode, 2)
        self.assertIn("--batch 0", run.stderr)


REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


@unittest.skipIf(MISSING, MISSING)
class KernelLines(unittest.TestCase):
    """The kernels each operator runs, written for the planner's step time: one line a kernel,
    none for views, matrix multiplies with their shape and positive FLOPs, attention with the
    kernel routed."""

    def record(self):
        from headroom_gpu.recorder import StepRecorder

        with StepRecorder() as rec:
            lin = torch.nn.Linear(64, 96, bias=False).to(torch.bfloat16)
            opt = torch.optim.AdamW(lin.parameters(), foreach=True)
            x = torch.randn(2, 4, 32, 64, dtype=torch.bfloat16)
            for _ in range(2):
                with rec.step():
                    y = lin(x)
                    q = y[..., :64].contiguous()
                    a = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
                    a.float().square().mean().backward()
                    opt.step()
                    opt.zero_grad()
        return rec

    def test_kernel_lines(self):
        rec = self.record()
        lines = [json.loads(l) for l in rec.to_jsonl().splitlines()]
        kernels = [l for l in lines if l["op"] == "kernel"]
        self.assertTrue(kernels)
        self.assertEqual({k["at"].split(".")[0] for k in kernels}, {"step2"})
        self.assertEqual({k["at"].split(".")[1] for k in kernels}, {"forward", "backward", "optimizer"})
        names = {k["name"] for k in kernels}
        for view in ("aten::view", "aten::t", "aten::transpose", "aten::expand", "aten::_unsafe_view", "aten::detach"):
            self.assertNotIn(view, names)
        mms = [k for k in kernels if k["name"] == "aten::mm"]
        self.assertTrue(mms)
        for k in mms:
            m, n, kk = k["mnk"]
            self.assertEqual(k["flops"], 2 * m * n * kk * k["batch"])
            self.assertGreater(k["flops"], 0)
            self.assertEqual(k["dtype"], "bf16")
            self.assertGreater(k["bytes"], 0)
        self.assertIn([256, 96, 64], [k["mnk"] for k in mms])  # the forward: 2·4·32 rows
        sdpa = [k for k in kernels if "sdpa" in k]
        self.assertEqual([k["sdpa"] for k in sdpa], ["flash", "flash"])
        self.assertEqual(sdpa[0]["bhqkd"], [2, 4, 32, 32, 64])
        self.assertTrue(all(k["causal"] for k in sdpa))
        everything = [json.loads(l) for l in rec.to_jsonl("all").splitlines()]
        first = [l for l in everything if l["op"] == "kernel" and l["at"].startswith("step1.")]
        self.assertGreaterEqual(len(first), len(kernels))  # the first step makes the optimizer's state too
        self.assertFalse([l for l in rec.to_jsonl("none").splitlines() if '"kernel"' in l])
        # Without them, the same allocations.
        strip = lambda text: [l for l in text.splitlines() if '"kernel"' not in l]  # noqa: E731
        self.assertEqual(strip(rec.to_jsonl()), rec.to_jsonl("none").splitlines())

    def test_a_recording_with_kernels_is_timed(self):
        rec = self.record()
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "k.jsonl")
            rec.write(path)
            out = subprocess.run([_headroom(), "plan", "--model", "gpt2", "--gpu", "h100", "--batch", "2", "--seq",
                                  "32", "--program", path, "--json"], capture_output=True, text=True)
            self.assertIn(out.returncode, (0, 1), out.stderr)
            self.assertGreater(json.loads(out.stdout)["step_time_s"], 0)
            replay = subprocess.run([_headroom(), "replay", path], capture_output=True, text=True)
            self.assertEqual(replay.returncode, 0, replay.stderr)


def _documented(kind):
    """docs/RECORDING.md's code blocks of `kind` (sh or python), each as its lines."""
    with open(os.path.join(REPO, "docs", "RECORDING.md"), encoding="utf-8") as f:
        text = f.read()
    blocks, current = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            if current is None:
                current = (line[3:], [])
            else:
                blocks.append(current)
                current = None
        elif current is not None:
            current[1].append(line)
    return [lines for lang, lines in blocks if lang == kind]


@unittest.skipIf(MISSING, MISSING)
class Documented(unittest.TestCase):
    """Every recording command and program docs/RECORDING.md shows runs as shown, in a scratch
    directory holding the repository's data/ (headroom's own commands are run by the Rust
    tests of documented commands)."""

    def scratch(self):
        d = tempfile.mkdtemp()
        os.symlink(os.path.join(REPO, "data"), os.path.join(d, "data"))
        return d

    def test_the_commands(self):
        d = self.scratch()
        commands = [l for b in _documented("sh") for l in b if l.startswith("python -m headroom_gpu ")]
        self.assertGreaterEqual(len(commands), 2)
        env = {**os.environ, "PYTHONPATH": os.path.join(REPO, "python")}
        for line in commands:
            args = line.split()[1:]
            run = subprocess.run([sys.executable, *args], cwd=d, capture_output=True, text=True, env=env)
            self.assertEqual(run.returncode, 0, f"{line}: {run.stderr}")
            out = args[args.index("--out") + 1]
            # At the shape its first line says.
            plan = subprocess.run(
                [_headroom(), "plan", "--model", "gpt2", "--gpu", "l4", "--program", os.path.join(d, out)],
                capture_output=True, text=True)
            self.assertIn(plan.returncode, (0, 1), plan.stderr)

    def test_the_python(self):
        d = self.scratch()
        # The first block; the recipes' own (FSDP2's) are run by their tests.
        blocks = _documented("python")
        cwd = os.getcwd()
        os.chdir(d)
        try:
            exec(compile("\n".join(blocks[0]), "docs/RECORDING.md", "exec"), {})
        finally:
            os.chdir(cwd)
        self.assertTrue(os.path.getsize(os.path.join(d, "my-step.jsonl")) > 0)

    def test_the_shipped_recording_is_what_the_recorder_records(self):
        """data/recordings/gpt2-bf16-b4-s1024.jsonl, recorded again: the same allocations."""
        from headroom_gpu.transformers_step import StepSpec, record

        rec = record(StepSpec(model=os.path.join(REPO, "data", "models", "presets", "gpt2.json"), batch=4, seq=1024))
        with open(os.path.join(REPO, "data", "recordings", "gpt2-bf16-b4-s1024.jsonl"), encoding="utf-8") as f:
            shipped = [json.loads(l) for l in f]
        sizes = lambda lines: sorted(l["size"] for l in lines if l["op"] == "alloc")  # noqa: E731
        self.assertEqual(sizes(json.loads(l) for l in rec.to_jsonl().splitlines()), sizes(shipped))


if __name__ == "__main__":
    unittest.main()

"""The step recorders mark each layer's backward as a profiler range, and pair each dropout's
tensors, without changing what the engine does: autograd sums a residual's two gradients in place
(`InputBuffer::accumulate`, into the first where it and its storage are held by the buffer alone),
and a hook that holds the gradient of a layer's output, as a module's full backward hooks do
(`BackwardHook.grad_outputs`), or its storage, as a storage object made of it does, made that sum
a new tensor a layer (docs/VALIDATION.md, "The residual sum under the layer marks"). Real
tensors, no dispatch mode: the adds the engine runs with the hooks on are those it runs without.
Every marking path is checked: `layer_marks.hook_layers` (step_programs.py, step_recipes.py,
infer_programs.py), qlora_programs.py's own marks, and step_programs.py's `DropoutSources`.
qlora_programs.py's dropout pairs are looked up by storage object, as its recorder keys every
storage; under that recorder (a TorchDispatchMode) the engine makes every sum out of place and
`headroom_gpu.gradient_sums` places them, so they are not checked here.

    PYTHONPATH=python /work/venv-torch/bin/python -m unittest python/tests/test_layer_marks.py
"""

import collections
import contextlib
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_recorders import NeedsRecorders  # noqa: E402  (scripts/validate on the path too)

WIDE = [2, 32, 64]


def small_model(family, dropout):
    """A three-layer model of width 64: Llama (pre-norm, RMSNorm, no dropout), T5 (three blocks a
    stack) or GPT-2 (pre-norm, LayerNorm, dropout on each residual branch where `dropout`)."""
    import torch
    import transformers

    torch.manual_seed(0)
    if family == "llama":
        cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                       num_key_value_heads=2, num_hidden_layers=3, vocab_size=256)
        model = transformers.LlamaForCausalLM(cfg)
    elif family == "t5":
        # Two stacks, and blocks that pass the position bias on beside the hidden state.
        cfg = transformers.T5Config(d_model=64, d_ff=128, d_kv=16, num_heads=4, num_layers=3, vocab_size=256,
                                    dropout_rate=0.1 if dropout else 0.0, decoder_start_token_id=0)
        model = transformers.T5ForConditionalGeneration(cfg)
    else:
        p = 0.1 if dropout else 0.0
        cfg = transformers.GPT2Config(n_embd=64, n_layer=3, n_head=4, vocab_size=256, n_positions=64,
                                      resid_pdrop=p, embd_pdrop=p, attn_pdrop=p, bos_token_id=0, eos_token_id=0)
        model = transformers.GPT2LMHeadModel(cfg)
    model.config.use_cache = False
    return model


def backward_adds(family, marks, checkpointing, around=contextlib.nullcontext, dropout=False):
    """The backward's adds of two activation-sized tensors, in place (`aten::add_`) and out of
    place (`aten::add`), of a three-layer model, forward and backward run inside `around()`; with
    the layer ranges `marks` makes, if any."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    model = small_model(family, dropout)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    if marks:
        marks(model, family)
    ids = torch.randint(0, 256, WIDE[:2])
    with around():
        loss = model(input_ids=ids, labels=ids).loss
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            loss.backward()
    adds = collections.Counter(e.name for e in prof.events() if e.name in ("aten::add", "aten::add_")
                               and e.input_shapes[:2] == [WIDE, WIDE])
    ranges = sorted((e.time_range.start, e.name) for e in prof.events() if e.name.startswith("layer:"))
    return adds, [name for _, name in ranges]


class _Marks:
    """qlora_programs.py's recorder as its layer marks use it: `mark(("main", 3))` a range."""

    def mark(self, tag):
        from torch.profiler import record_function

        return record_function(f"layer:{tag[0]}:{tag[1]}")


def full_backward_hooks(model, family):
    """The marks the recorders used before `when_all`: a module's full backward hooks."""
    import layer_marks

    for name, m in model.named_modules():
        if layer_marks.layer_pattern(family).fullmatch(name):
            m.register_full_backward_pre_hook(lambda *a: None)
            m.register_full_backward_hook(lambda *a: None)


class LayerMarks(NeedsRecorders):
    def marking_paths(self):
        import infer_programs
        import qlora_programs
        import step_programs
        import step_recipes

        return {"step_programs": step_programs.hook_layers, "step_recipes": step_recipes.hook_layers,
                "infer_programs": infer_programs.sp.hook_layers,
                "qlora_programs": lambda m, f: qlora_programs._hook_layers(m, f, _Marks())}

    def test_the_marks_leave_the_engines_sums_as_they_are(self):
        for name, marks in self.marking_paths().items():
            for family in ("llama", "gpt2", "t5"):
                for checkpointing in (False, True):
                    with self.subTest(marks=name, family=family, checkpointing=checkpointing):
                        plain, _ = backward_adds(family, None, checkpointing)
                        marked, ranges = backward_adds(family, marks, checkpointing)
                        self.assertEqual(marked, plain)
                        # The residual sums in place: two a layer (three in T5's decoder).
                        self.assertGreaterEqual(plain["aten::add_"], 6)
                        layers = ["layer:main:2", "layer:main:1", "layer:main:0"]
                        if family == "t5":
                            layers += ["layer:enc:2", "layer:enc:1", "layer:enc:0"]
                        self.assertEqual(ranges, layers)

    def test_a_mark_that_holds_the_gradient_moves_one_sum_a_layer(self):
        """What the test above would see of marks that hold a gradient: the full backward hooks'."""
        for checkpointing in (False, True):
            with self.subTest(checkpointing=checkpointing):
                plain, _ = backward_adds("llama", None, checkpointing)
                held, _ = backward_adds("llama", full_backward_hooks, checkpointing)
                self.assertEqual(held["aten::add_"], plain["aten::add_"] - 3)
                self.assertEqual(held["aten::add"], plain["aten::add"] + 3)

    def test_the_dropout_pairs_leave_the_engines_sums_as_they_are(self):
        import step_programs

        for checkpointing in (False, True):
            with self.subTest(checkpointing=checkpointing):
                plain, _ = backward_adds("gpt2", None, checkpointing, dropout=True)
                sources = step_programs.DropoutSources()
                paired, _ = backward_adds("gpt2", None, checkpointing, lambda: sources, dropout=True)
                self.assertEqual(paired, plain)
                self.assertGreaterEqual(plain["aten::add_"], 6)
                # Each dropout's forward and backward paired: the embeddings' and two a layer.
                self.assertGreaterEqual(len(sources.pairs), 2 * 7)


if __name__ == "__main__":
    unittest.main()

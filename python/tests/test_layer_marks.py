"""The step recorder marks each layer's backward as a profiler range without changing what the
engine does: autograd sums a residual's two gradients in place (`InputBuffer::accumulate`, into
the first where its storage is held by the buffer alone), and a mark that holds the gradient of a
layer's output, as a module's full backward hooks do (`BackwardHook.grad_outputs`), made that sum
a new tensor a layer (docs/VALIDATION.md, "The residual sum under the layer marks"). Real
tensors, no dispatch mode: the adds the engine runs with the marks on are those it runs without.

    PYTHONPATH=python /work/venv-torch/bin/python -m unittest python/tests/test_layer_marks.py
"""

import collections
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_recorders import NeedsRecorders  # noqa: E402  (scripts/validate on the path too)


def backward_adds(marks, checkpointing):
    """The backward's adds of two activation-sized tensors, in place (`aten::add_`) and out of
    place (`aten::add`), of a three-layer Llama; with the layer ranges `marks` makes, if any."""
    import torch
    import transformers
    from torch.profiler import ProfilerActivity, profile

    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                   num_key_value_heads=2, num_hidden_layers=3, vocab_size=256)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    model.config.use_cache = False
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    if marks:
        marks(model, "llama")
    ids = torch.randint(0, 256, (2, 32))
    loss = model(input_ids=ids, labels=ids).loss
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        loss.backward()
    wide = [2, 32, 64]
    adds = collections.Counter(e.name for e in prof.events() if e.name in ("aten::add", "aten::add_")
                               and e.input_shapes[:2] == [wide, wide])
    ranges = sorted((e.time_range.start, e.name) for e in prof.events() if e.name.startswith("layer:"))
    return adds, [name for _, name in ranges]


class LayerMarks(NeedsRecorders):
    def test_the_marks_leave_the_engines_sums_as_they_are(self):
        import step_programs as sp

        for checkpointing in (False, True):
            with self.subTest(checkpointing=checkpointing):
                plain, _ = backward_adds(None, checkpointing)
                marked, ranges = backward_adds(sp.hook_layers, checkpointing)
                self.assertEqual(marked, plain)
                # The residual sums in place: two a layer.
                self.assertGreaterEqual(plain["aten::add_"], 6)
                self.assertEqual(ranges, ["layer:main:2", "layer:main:1", "layer:main:0"])


if __name__ == "__main__":
    unittest.main()

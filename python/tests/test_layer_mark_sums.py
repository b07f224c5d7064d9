"""scripts/validate/backward_adds.py's one rule for the old layer marks' residual sums
(`marks_sums`, which `backward_adds.py --recorder` and `lora_sums.py` both print): the
hidden-sized out-of-place adds at the nodes where a hook that held a layer's gradient made the
residual sum (`mark_nodes`), beyond those the engine makes itself there (`own`). Each node and
allowance of the rule is held to what it takes and leaves, and no bundled template's backward
holds such a sum.

    python3 -m unittest python/tests/test_layer_mark_sums.py
"""

import os
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts", "validate"))
import backward_adds  # noqa: E402
import template_file  # noqa: E402

HIDDEN = {"tok": {"h": 4.0}}


def template(per_layer, layers=5):
    """A backward of `layers` layers, each with `per_layer[node]` hidden-sized adds made under
    `node`, and a hidden-sized allocation at a `MulBackward0 > aten::mul` that is no sum."""
    sites = ["autograd::engine::evaluate_function: MulBackward0 > aten::mul"] \
        + [f"autograd::engine::evaluate_function: {node} > aten::add" for node in sorted(per_layer)]
    tensors, step = [], []
    for layer in range(layers):
        for site, node in enumerate([None] + sorted(per_layer)):
            for _ in range(1 if node is None else per_layer[node]):
                step += [0, len(tensors), layer]
                tensors.append([0, 3, site])
    return {"laws": [HIDDEN], "sites": sites, "tensors": tensors, "step": step, "backward": [0, 0]}


def listed(key, per_layer):
    return backward_adds.marks_sums(key, template(per_layer))


class Rule(unittest.TestCase):
    def test_an_rms_norm_s_sum_is_at_its_multiply_in_fp32_and_its_cast_in_bf16(self):
        self.assertEqual(listed("llama/causal-lm/fp32/sdpa/full/lora-qv", {"MulBackward0": 1}), {"MulBackward0": 5})
        self.assertEqual(listed("llama/causal-lm/amp-cuda/sdpa/full", {"MulBackward0": 1}), {"MulBackward0": 5})
        # At bf16 a multiply's add is no norm's; T5 casts before its multiply at either precision.
        self.assertEqual(listed("llama/causal-lm/bf16/sdpa/full/lora-qv", {"MulBackward0": 1}), {})
        self.assertEqual(listed("llama/causal-lm/bf16/sdpa/full/lora-qv", {"ToCopyBackward0": 1}),
                         {"ToCopyBackward0": 5})
        self.assertEqual(listed("t5/seq2seq-lm/bf16/eager/full", {"MulBackward0": 1}), {"MulBackward0": 5})

    def test_the_recomputation_s_adds_are_the_engine_s(self):
        # Gemma-2's checkpointed fp32 key of every linear layer, recorded under the present marks,
        # keeps three a layer; its query-and-value key one; one more is a hook's.
        self.assertEqual(listed("gemma2/causal-lm/fp32/eager/ckpt/lora-all", {"MulBackward0": 3}), {})
        self.assertEqual(listed("gemma2/causal-lm/fp32/eager/ckpt/lora-all", {"MulBackward0": 4}), {"MulBackward0": 5})
        self.assertEqual(listed("gemma2/causal-lm/fp32/eager/ckpt/lora-qv", {"MulBackward0": 2}), {"MulBackward0": 5})
        self.assertEqual(listed("qwen2_moe/causal-lm/fp32/sdpa/ckpt", {"MulBackward0": 1}), {})
        self.assertEqual(listed("qwen2_moe/causal-lm/fp32/sdpa/ckpt/lora-all", {"MulBackward0": 4}),
                         {"MulBackward0": 5})
        # Without checkpointing there is no recomputation.
        self.assertEqual(listed("gemma2/causal-lm/fp32/eager/full/lora-all", {"MulBackward0": 1}), {"MulBackward0": 5})
        # Llama's recomputation adds at `MmBackward0`, no norm's node: none of it is listed.
        self.assertEqual(listed("llama/causal-lm/fp32/sdpa/ckpt/lora-all", {"MmBackward0": 2}), {})

    def test_layer_norm_families_sum_at_the_layer_norm_only(self):
        # GPT-2's checkpointed multiplies are its recomputation's (its norm is a LayerNorm).
        self.assertEqual(listed("gpt2/causal-lm/fp32/sdpa/ckpt/lora-all", {"MulBackward0": 4}), {})
        self.assertEqual(listed("gpt2/causal-lm/fp32/sdpa/ckpt/lora-qv", {"NativeLayerNormBackward0": 2}),
                         {"NativeLayerNormBackward0": 10})
        self.assertEqual(listed("bloom/causal-lm/bf16/eager/full/lora-qv", {"ToCopyBackward0": 1}), {})

    def test_gpt_neox_s_parallel_residual_sums_at_its_norm_outside_autocast(self):
        self.assertEqual(listed("gpt_neox/causal-lm/fp32/eager/full", {"NativeLayerNormBackward0": 1}), {})
        self.assertEqual(listed("gpt_neox/causal-lm/amp-cuda/sdpa/full/lora-qv", {"NativeLayerNormBackward0": 1}),
                         {"NativeLayerNormBackward0": 5})

    def test_bert_s_post_norm_blocks(self):
        self.assertEqual(listed("bert/masked-lm/fp32/eager/ckpt/lora-all", {"NativeLayerNormBackward0": 7}), {})
        # Four a layer with adapters on the query and value (its bf16 key recorded under the
        # present marks keeps four): two more are the marks'.
        self.assertEqual(listed("bert/masked-lm/fp32/eager/ckpt/lora-qv", {"NativeLayerNormBackward0": 4}), {})
        self.assertEqual(listed("bert/masked-lm/fp32/eager/ckpt/lora-qv", {"NativeLayerNormBackward0": 6}),
                         {"NativeLayerNormBackward0": 10})
        self.assertEqual(listed("bert/masked-lm/fp32/eager/full/lora-qv", {"NativeLayerNormBackward0": 1}),
                         {"NativeLayerNormBackward0": 5})
        # At bf16 peft casts the layer's input to its fp32 adapters: the sums of its gradient.
        self.assertEqual(listed("bert/masked-lm/bf16/sdpa/full/lora-qv", {"ToCopyBackward0": 1, "ViewBackward0": 1}),
                         {"ToCopyBackward0": 5, "ViewBackward0": 5})
        # A view's sum is the engine's everywhere else (its base holds the storage).
        self.assertEqual(listed("bert/masked-lm/fp32/sdpa/full/lora-qv", {"ViewBackward0": 1}), {})
        self.assertEqual(listed("llama/causal-lm/bf16/sdpa/full/lora-qv", {"ViewBackward0": 2}), {})

    def test_an_inference_template_has_no_backward_to_scan(self):
        self.assertEqual(backward_adds.marks_sums("llama/forward/bf16/sdpa", {"dims": {}}), {})


class Bundled(unittest.TestCase):
    def test_no_bundled_training_template_holds_a_hook_s_sum(self):
        # Every training key was recorded again under the present marks (docs/VALIDATION.md,
        # issue 46's sections of 2026-11-30 and 2026-12-01): a key recorded under the old marks, or
        # a recorder that made a hook's sum again, shows here by file and key.
        found, files = {}, set()
        for name, key, t in template_file.bundled():
            files.add(name)
            extra = backward_adds.marks_sums(key, t)
            if extra:
                found[f"{name} {key}"] = dict(extra)
        self.assertGreater(len(files), 10)
        self.assertEqual(found, {})


if __name__ == "__main__":
    unittest.main()

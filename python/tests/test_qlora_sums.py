"""scripts/validate/qlora_sums.py: a QLoRA template's out-of-place gradient sums known by the first
gradient freed right after each, and no bundled QLoRA key without checkpointing keeps a sum a GPU
adds in place (a sum summed into again, what a recording made before `gradient_sums` holds).

A key recorded since a sum whose first gradient is a view was made out of place has such sums
(an adapted projection's input gradient, the base's and the adapter's) unless under AMP, where
a linear layer's input that autocast casts gets its gradient through the cast (the output
projection's, the attention's bf16 output, does not: AMP's `qlora-all` has one a layer, its
`qlora-qv` none), or at BERT's query and value projections, whose input gets its first gradient
from the residual. Every bundled key was recorded under that rule (docs/VALIDATION.md,
"hf-qlora-amp.tpl recorded again with the held pair and the output projection's sums"): a key
without such a sum shows by file.

    python3 -m unittest python/tests/test_qlora_sums.py
"""

import os
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts", "validate"))
import qlora_sums  # noqa: E402
import template_file  # noqa: E402


def template(sites_freed):
    """A backward of hidden-sized tensors: for each site, a tensor made there, then a sum
    (`aten::add`), then that tensor freed, as the engine replaces a first gradient by the sum."""
    sites = ["aten::add"] + sorted(set(sites_freed))
    laws = [{"tok": {"h": 4.0}}]
    tensors, step = [], []
    for site in sites_freed:
        first, total = len(tensors), len(tensors) + 1
        tensors += [[0, 3, sites.index(site)], [0, 3, 0]]
        step += [0, first, 1, 0, total, 1, 1, first, 1, 1, total, 1]
    return {"laws": laws, "sites": sites, "tensors": tensors, "step": step, "backward": [0, 0]}


class Sums(unittest.TestCase):
    def test_a_sum_is_named_by_the_first_gradient_it_replaced(self):
        c = qlora_sums.sums(template(["aten::mm", "aten::add", "aten::mm"]))
        # The second sum replaced a sum, itself an `aten::add` followed by no free (`-`).
        self.assertEqual(dict(c), {"aten::mm": 2, "aten::add": 1, "-": 1})

    def test_a_view_s_sum_is_a_sum_that_replaced_a_matrix_product_s_output(self):
        t = template(["aten::mm", "aten::add", "aten::mm", "aten::clone"])
        self.assertEqual(qlora_sums.view_sums(t), 2)
        self.assertFalse(qlora_sums.viewless("llama/causal-lm/bf16/sdpa/full/qlora-qv", t))
        t = template(["aten::clone"])
        self.assertTrue(qlora_sums.viewless("llama/causal-lm/bf16/sdpa/full/qlora-qv", t))
        self.assertFalse(qlora_sums.viewless("llama/causal-lm/amp-cuda/sdpa/full/qlora-qv", t))
        self.assertTrue(qlora_sums.viewless("llama/causal-lm/amp-cuda/sdpa/full/qlora-all", t))
        self.assertFalse(qlora_sums.viewless("bert/masked-lm/bf16/sdpa/full/qlora-qv", t))
        self.assertTrue(qlora_sums.viewless("bert/masked-lm/bf16/sdpa/full/qlora-all", t))

    def test_no_key_lacks_a_view_s_sum_and_amp_s_qlora_qv_none_has_one(self):
        viewless, amp = {}, []
        for name, key, t in template_file.bundled("hf-qlora*.tpl"):
            if qlora_sums.viewless(key, t):
                viewless.setdefault(name, []).append(key)
            if "/amp-cuda/" in key and key.endswith("/qlora-qv") and qlora_sums.view_sums(t):
                amp.append(key)
        self.assertEqual(viewless, {})
        self.assertEqual(amp, [])

    def test_no_bundled_qlora_key_without_checkpointing_keeps_a_sum_summed_into_again(self):
        stale, files = [], set()
        for name, key, t in template_file.bundled("hf-qlora*.tpl"):
            files.add(name)
            if "/ckpt/" not in key and qlora_sums.sums(t)["aten::add"]:
                stale.append(key)
        self.assertEqual(len(files), 4)
        self.assertEqual(stale, [])


if __name__ == "__main__":
    unittest.main()

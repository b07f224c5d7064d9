"""scripts/validate/step_programs.py's laws at a sequence-to-sequence job's two lengths: each
tensor's size at TARGET_SHAPES (batch, encoder length, decoder length) read in the encoder's
length, the decoder's, or both, and the bundled T5 templates recorded so.

    python3 -m unittest python/tests/test_target_law.py
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_recorders import ROOT, NeedsRecorders  # noqa: E402  (scripts/validate on the path too)
import template_file  # noqa: E402

DIMS = {"h": 240, "f": 520, "q": 240, "kv": 240, "heads": 6, "d": 40, "V": 3000}


class TargetLaw(NeedsRecorders):
    def sizes(self, fn):
        import step_programs as sp
        return [fn(b, s, t) for b, s, t in sp.TARGET_SHAPES]

    def law(self, fn):
        import step_programs as sp
        return sp.target_law(self.sizes(fn), DIMS, [], "test", (4, 2, 1, 8))

    def test_each_length_is_read_apart(self):
        # The encoder's hidden state, the decoder's, the decoder's self-attention scores per
        # head, the cross-attention's, its position bias (shared by the batch), the labels
        # shifted right (one position fewer a sequence).
        self.assertEqual(self.law(lambda b, s, t: 4 * 240 * b * s), {"tok": {"h": 4.0}})
        self.assertEqual(self.law(lambda b, s, t: 4 * 240 * b * t), {"ttok": {"h": 4.0}})
        self.assertEqual(self.law(lambda b, s, t: 4 * 6 * b * t * t), {"ttok_t": {"one": 24.0}})
        self.assertEqual(self.law(lambda b, s, t: 4 * 6 * b * t * s), {"ttok_s": {"one": 24.0}})
        self.assertEqual(self.law(lambda b, s, t: 4 * 6 * t * s), {"tpos_s": {"one": 24.0}})
        self.assertEqual(self.law(lambda b, s, t: 8 * b * t - 8 * b), {"ttok": {"one": 8.0}, "seq": {"one": -8.0}})

    def test_the_memory_efficient_kernel_s_padding_is_read_in_either_length(self):
        """Its log-sum-exp pads the queries to 32 positions, its bias gradient the positions
        attended to, to 16: the encoder's pairs (56 and 88 to 64 and 96), the decoder's (24 and 40
        to 32 and 48) and the cross-attention's (the encoder's positions)."""
        def up(n, to):
            return -(-n // to) * to

        self.assertEqual(self.law(lambda b, s, t: 4 * 6 * b * up(t, 32)), {"ttok32": {"heads": 4.0}})
        self.assertEqual(self.law(lambda b, s, t: 2 * 6 * b * s * up(s, 16)), {"tok_s16": {"one": 12.0}})
        self.assertEqual(self.law(lambda b, s, t: 2 * 6 * b * t * up(t, 16)), {"ttok_t16": {"one": 12.0}})
        self.assertEqual(self.law(lambda b, s, t: 2 * 6 * b * t * up(s, 16)), {"ttok_s16": {"one": 12.0}})

    def test_a_size_in_no_law_of_the_two_lengths_is_refused(self):
        import step_programs as sp
        with self.assertRaises(sp.Unexplained):
            self.law(lambda b, s, t: 4 * b * (s * s + t))


class Bundled(unittest.TestCase):
    def test_t5_v1_1_untied_query_and_value_templates_read_the_decoder_s_length(self):
        t = template_file.read(os.path.join(ROOT, "data", "programs", "hf-lora-fp32.tpl"))["templates"]
        for ckpt in ("full", "ckpt"):
            x = t[f"t5/seq2seq-lm/fp32/eager/{ckpt}/gated/lora-qv"]
            self.assertIsNotNone(x["check"].get("target_seq"), ckpt)
            kinds = {k for law in x["laws"] for k in law}
            self.assertTrue({"ttok", "ttok_t", "ttok_s"} <= kinds, (ckpt, kinds))


if __name__ == "__main__":
    unittest.main()

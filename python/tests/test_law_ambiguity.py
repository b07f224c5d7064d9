"""scripts/validate/law_ambiguity.py and per_head_laws.py's per-head norms: a recording whose
heads cannot tell two laws apart, or whose head widths are other widths, is named, and no
bundled template is one.

    python3 -m unittest python/tests/test_law_ambiguity.py
"""

import os
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts", "validate"))
import law_ambiguity  # noqa: E402
import per_head_laws  # noqa: E402
import template_file  # noqa: E402

PROGRAMS = os.path.join(ROOT, "data", "programs")


def dims(hidden, heads, kv_heads, d):
    return {"h": hidden, "f": 1184, "q": heads * d, "kv": kv_heads * d, "kf": 1184, "kh": hidden, "heads": heads,
            "kv_heads": kv_heads, "d": d, "V": 4096, "E": 1, "k": 1, "one": 1, "P": 2048}


class Rivals(unittest.TestCase):
    def test_an_fp32_key_reads_as_a_bf16_query_at_twice_the_key_value_heads(self):
        """At 8 heads over 4 of 48, an fp32 key (192 x 4 bytes a token) is a bf16 query (384 x 2)."""
        d = dims(256, 8, 4, 48)
        self.assertEqual(law_ambiguity.rivals(4 * d["kv"], d, "q"), [{"kv": 4.0}])
        self.assertEqual(law_ambiguity.law_rivals({"tok": {"q": 2.0}}, d), [("tok", {"q": 2.0}, [{"kv": 4.0}])])
        # Gemma's 4 over 2 of 96: the same, and a bf16 key is an fp32 head.
        g = dims(256, 4, 2, 96)
        self.assertEqual(law_ambiguity.rivals(2 * g["kv"], g, "kv"), [{"d": 4.0}])

    def test_four_key_value_heads_make_half_a_bf16_key_an_fp32_head(self):
        """12 over 4 of 40 (the GQA recordings): rotate_half's half of a bf16 key (kv x 1 byte) is an
        fp32 head (d x 4): the two read apart only where the key-value heads are not four."""
        d = dims(256, 12, 4, 40)
        self.assertEqual(law_ambiguity.law_rivals({"tok": {"kv": 1.0}}, d), [("tok", {"kv": 1.0}, [{"d": 4.0}])])
        self.assertEqual(law_ambiguity.law_rivals({"tok": {"q": 2.0}}, d), [])

    def test_fifteen_heads_over_five_read_every_width_one_way(self):
        d = dims(240, 15, 5, 40)
        for unit in ("q", "kv", "d", "heads", "kv_heads"):
            for per in (0.5, 1.0, 2.0, 4.0, 8.0):
                self.assertEqual(law_ambiguity.rivals(per * d[unit], d, unit), [], f"{unit} x {per}")

    def test_bytes_a_token_and_pair_laws_have_no_rival(self):
        d = dims(256, 4, 2, 96)
        self.assertEqual(law_ambiguity.law_rivals({"tok": {"one": 8.0}, "tok_s": {"heads": 2.0}}, d), [])
        self.assertEqual(law_ambiguity.law_rivals({"fixed": {"q*h": 2.0}}, d), [])

    def test_no_bundled_template_holds_a_rival_law_or_shares_a_head_width(self):
        """Every bundled template passes the checks its recording made: no law with a rival
        reading, and no head-tied width as wide as another width of its recording."""
        seen = 0
        for name in sorted(os.listdir(PROGRAMS)):
            data = template_file.read(os.path.join(PROGRAMS, name))
            for key, t in data["templates"].items():
                if "laws" not in t:
                    continue
                seen += 1
                self.assertEqual(law_ambiguity.audit(t), [], key)
                self.assertEqual(law_ambiguity.shared_widths(t["dims"], key.split("/")[0]), [], key)
        self.assertGreater(seen, 0)


class SharedWidths(unittest.TestCase):
    def test_a_query_as_wide_as_the_hidden_size_is_named_where_a_head_has_a_width_of_its_own(self):
        """15 heads of 128 on a hidden size of 1,920: a query's weight reads as `h*h`, wrong on a
        Gemma whose query is not its hidden size; GPT-2's query is its hidden size in every GPT-2."""
        d = dims(1920, 15, 5, 128)
        self.assertEqual(law_ambiguity.shared_widths(d, "gemma2"), [("q", "h"), ("q", "kh")])
        self.assertEqual(law_ambiguity.shared_widths(d, "gpt2"), [])
        self.assertEqual(law_ambiguity.shared_widths(dims(2880, 15, 5, 256), "gemma2"), [])


class Refused(unittest.TestCase):
    """The recorders refuse a law with a rival reading (`step_programs.refuse_rivals`, which
    `infer_programs.py` calls too), and bitsandbytes' inference is recorded at 15 heads over 5
    wherever the family's config takes a hidden size apart from its heads."""

    def setUp(self):
        try:
            import step_programs  # noqa: F401  (torch and transformers)
        except ImportError as e:
            self.skipTest(f"the recorders need torch: {e}")

    def test_a_recording_with_a_rival_law_is_refused(self):
        import step_programs as sp

        with self.assertRaisesRegex(sp.Unexplained, "reads as well as"):
            sp.refuse_rivals({"tok": {"kv": 4.0}}, dims(256, 8, 4, 48), "t tensor 3")
        sp.refuse_rivals({"tok": {"kv": 4.0}}, dims(240, 15, 5, 40), "t tensor 3")

    def test_quantized_inference_records_grouped_heads_at_fifteen_over_five(self):
        import quant_infer as qi
        import step_programs as sp

        for family in ("qwen2", "qwen3", "mistral", "phi3", "mixtral"):
            cfg = qi.config(sp.config(family, 5), family, 5)
            heads, kv_heads, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
            self.assertEqual((heads, kv_heads), (15, 5), family)
            # Every projection whole blocks of 16,384 elements (bitsandbytes' second-level absmax).
            for out in (heads * d, kv_heads * d):
                self.assertEqual(out * cfg["hidden_size"] % 16384, 0, family)
            d_ = dims(cfg["hidden_size"], heads, kv_heads, d)
            for unit in ("q", "kv", "d"):
                for per in (0.5, 1.0, 2.0, 4.0):
                    self.assertEqual(law_ambiguity.law_rivals({"tok": {unit: per}}, d_), [], (family, unit, per))
        # Llama's, Gemma-2's and Gemma 3's configs refuse a hidden size that is not a multiple of
        # their heads: 15 heads of 256 on 2,880, the query 3,840 wide, not the hidden size.
        for family in ("llama", "gemma2", "gemma3_text"):
            cfg = qi.config(sp.config(family, 5), family, 5)
            heads, kv_heads, d, h = (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"],
                                     cfg["hidden_size"])
            self.assertEqual((heads, kv_heads, h % heads), (15, 5, 0), family)
            for out in (heads * d, kv_heads * d, cfg["intermediate_size"]):
                self.assertEqual(out * h % 16384, 0, family)
            self.assertEqual(law_ambiguity.shared_widths(dims(h, heads, kv_heads, d), family), [], family)

    def test_a_recording_whose_query_is_its_hidden_size_is_refused(self):
        import step_programs as sp

        with self.assertRaisesRegex(sp.Unexplained, "recorded where q = h"):
            sp.refuse_shared_widths(dims(1920, 15, 5, 128), "llama")
        sp.refuse_shared_widths(dims(1920, 15, 5, 128), "gpt2")


class KeyNorms(unittest.TestCase):
    def test_a_key_norm_s_statistics_are_a_key_value_head_each(self):
        """Qwen3's and Gemma 3's norms over each head of the keys and queries, in fp32: one
        element a head a token, read per head, where a hidden state's norm (one element a token)
        stays bytes."""
        law = per_head_laws.norm_law
        self.assertEqual(law({"tok": {"one": 16.0}}, 12, 4, "aten::rsqrt"), {"tok": {"kv_heads": 4.0}})
        self.assertEqual(law({"tok": {"one": 16.0}}, 4, 2, "aten::mean"), {"tok": {"heads": 4.0}})
        self.assertEqual(law({"tok": {"one": 8.0}}, 4, 2,
                             "autograd::engine::evaluate_function: RsqrtBackward0 > aten::pow"),
                         {"tok": {"kv_heads": 4.0}})
        self.assertEqual(law({"seq": {"one": 8.0}}, 4, 2, "aten::rsqrt"), {"seq": {"kv_heads": 4.0}})
        self.assertEqual(law({"tok": {"one": 4.0}}, 4, 2, "aten::rsqrt"), {"tok": {"one": 4.0}})
        # A decode step's int64 positions plus one: as many bytes, another operator.
        self.assertEqual(law({"seq": {"one": 8.0}}, 4, 2, "aten::add"), {"seq": {"one": 8.0}})

    def test_no_bundled_template_reads_a_head_norm_as_bytes(self):
        stale = []
        for name in sorted(os.listdir(PROGRAMS)):
            data = template_file.read(os.path.join(PROGRAMS, name))
            for key, t in data["templates"].items():
                if "laws" in t and per_head_laws.relaw(t):
                    stale.append(f"{name} {key}")
        self.assertEqual(stale, [])


if __name__ == "__main__":
    unittest.main()

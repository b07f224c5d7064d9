"""The step recorders' training models, and the CPU ground truth's (`measure.train_case`), build
no key-value cache (`measure.no_cache`), as the GPU's training runs have them: with the config's
default, transformers makes a `DynamicCache` in a training forward and copies each layer's key and
value onto it, and SDPA saves the copies in place of the value, a view of Phi-3's fused
query-key-value output (docs/VALIDATION.md, "LoRA on an H200").

    python3 -m unittest python/tests/test_no_cache.py
"""

import contextlib
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_recorders import NeedsRecorders  # noqa: E402  (scripts/validate on the path too)


class NoCache(NeedsRecorders):
    def forward(self, cached):
        import measure
        import step_programs as sp
        import torch

        cfg = sp.config("phi3", 2)
        model = measure.build(cfg, "causal-lm", "sdpa", torch.bfloat16)
        if not cached:
            measure.no_cache(model)
        batch = measure.inputs(cfg, "causal-lm", 1, 16)
        return model(**batch)

    @staticmethod
    def caches(out):
        # The output's fields that are caches, whatever transformers names the field.
        from transformers import Cache
        return [v for v in out.values() if isinstance(v, Cache)]

    def test_a_training_forward_keeps_no_cache_once_it_is_turned_off(self):
        self.assertEqual(self.caches(self.forward(cached=False)), [])

    @staticmethod
    @contextlib.contextmanager
    def builds():
        """The models `measure.build` makes inside the block, in order."""
        import measure

        built, real = [], measure.build

        def build(*args, **kwargs):
            built.append(real(*args, **kwargs))
            return built[-1]

        measure.build = build
        try:
            yield built
        finally:
            measure.build = real

    @classmethod
    def train_cases(cls, *use_cache):
        """`measure.train_case` of a 2-layer Phi-3 for each `use_cache` (None: the default), and
        the models it built."""
        import measure
        import step_programs as sp

        with cls.builds() as built:
            rows = [measure.train_case("phi3", sp.config("phi3", 2), "causal-lm", "fp32", "adamw", "sdpa", False, 1, 16,
                                       **({} if on is None else {"use_cache": on})) for on in use_cache]
        return rows, built

    def test_the_cpu_ground_truth_steps_build_none_either(self):
        # measure.py's training steps (the CPU truth the replayed templates are held to) build
        # their model as the recorders do.
        _, built = self.train_cases(None)
        self.assertEqual(len(built), 1)
        self.assertFalse(built[0].config.use_cache)

    def test_the_cpu_ground_truth_keeps_the_configs_default_when_asked(self):
        # `measure.py --use-cache`: the rows the templates recorded with the cache (`…/cache`)
        # are held to, each saying which cache it was measured with.
        rows, built = self.train_cases(True, False)
        self.assertEqual([m.config.use_cache for m in built], [True, False])
        self.assertEqual([r["use_cache"] for r in rows], [True, False])

    def test_the_recorder_keeps_qlora_s_cache_off(self):
        # `--use-cache` records the config's default; QLoRA's recorder turns it off, as peft's
        # QLoRA scripts do, so the two are refused together before anything is recorded.
        import io
        import step_programs as sp

        argv = sys.argv
        sys.argv = ["step_programs.py", "--use-cache", "--qlora", "all", "--only", "gpt2", "--out", os.devnull]
        err = io.StringIO()
        try:
            with self.assertRaises(SystemExit) as e, contextlib.redirect_stderr(err):
                sp.main()
        finally:
            sys.argv = argv
        self.assertEqual(e.exception.code, 2)
        self.assertIn("--use-cache", err.getvalue())

    def test_the_lora_truth_s_cases_say_which_cache_they_ran(self):
        # lora_truth.py's cases run without the cache unless one turns it on, and each row says
        # which; a row measured before `no_cache` (no `use_cache`, the cache on) stays its listed
        # case's on a reuse, not its twin's with the cache.
        import lora_truth

        with self.builds() as built:
            rows = [lora_truth.case("phi3", "fp32", False, 2, 1, 16, 4, "qv", use_cache=on) for on in (True, False)]
        self.assertEqual([m.config.use_cache for m in built], [True, False])
        self.assertEqual([r["use_cache"] for r in rows], [True, False])
        listed = lora_truth.whole(("phi3", "fp32", False, 2, 1, 16, 4, "qv"))
        twin = lora_truth.whole(("phi3", "fp32", False, 2, 1, 16, 4, "qv", None, None, None, True))
        self.assertEqual((listed[-1], twin[-1], listed[:-1]), (False, True, twin[:-1]))
        legacy = {k: v for k, v in rows[0].items() if k != "use_cache"}
        self.assertEqual(lora_truth.earlier_case(legacy), listed)
        self.assertEqual(lora_truth.earlier_case(rows[0]), twin)

    def test_the_configs_default_would_make_one(self):
        # What the recordings before `no_cache` ran: a cache in the training forward.
        self.assertEqual(len(self.caches(self.forward(cached=True))), 1)


if __name__ == "__main__":
    unittest.main()

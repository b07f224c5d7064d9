"""The step recorder holds the last step's loss while the profiler runs, as a script's `loss` is
held until the next forward's replaces it: under checkpointing, the leaf peft's
`enable_input_require_grads` makes of the input embeddings' output, and its `.grad`, live on after
the step's backward, through the optimizer step (docs/VALIDATION.md, "LoRA under AMP with eager
attention asked"). Let go inside the profile, the second step's pair read as living from one step
into the next and were left out of the template, which then planned the optimizer step without
them (1% low for a checkpointed eager LoRA step).

    PYTHONPATH=python /work/venv-torch/bin/python -m unittest python/tests/test_held_loss.py
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_recorders import NeedsRecorders  # noqa: E402  (scripts/validate on the path too)


class HeldLoss(NeedsRecorders):
    @classmethod
    def setUpClass(cls):
        try:
            import step_programs as sp
        except ImportError:
            return
        cls.sp = sp
        cls.job = sp.Job("llama", "causal-lm", "bf16", "eager", True, 2, 16, 2, (sp.LORA_RANK, "qv"))
        cls.keep, cls.left = sp.kept(cls.job)

    def embedding_outputs(self, section):
        return [i for i, t in enumerate(self.job.tensors)
                if t["section"] == section and t["ops"] and t["ops"][0][0] == "aten::embedding"]

    def test_the_second_step_s_input_embeddings_output_is_never_freed_and_kept(self):
        (out,) = self.embedding_outputs("step2.forward")
        self.assertIsNone(self.job.tensors[out]["freed"])
        self.assertIn(out, self.keep)

    def test_only_the_first_step_s_leaf_and_gradient_live_into_the_next(self):
        (first,) = self.embedding_outputs("step1.forward")
        across = sorted(i for i, why in self.left.items() if why == "lives from one step into the next")
        self.assertEqual(len(across), 2, [self.job.tensors[i]["ops"][:2] for i in across])
        self.assertIn(first, across)
        self.assertEqual(self.job.tensors[first]["freed"]["section"], "step2.forward")


if __name__ == "__main__":
    unittest.main()

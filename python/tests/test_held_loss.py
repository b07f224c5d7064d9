"""The step recorder holds the last step's loss while the profiler runs, as a script's `loss` is
held until the next forward's replaces it: under checkpointing, the leaf peft's
`enable_input_require_grads` makes of the input embeddings' output, and its `.grad`, live on after
the step's backward, through the optimizer step (docs/VALIDATION.md, "LoRA under AMP with eager
attention asked"). Let go inside the profile, the second step's pair read as living from one step
into the next and were left out of the template, which then planned the optimizer step without
them (1% low for a checkpointed eager LoRA step). T5 holds three such leaves and their
gradients, six tensors a step.

The first step's pair is freed in the second step's forward, as the new loss takes the name. The
template keeps it in `step1` as held there, its free left out, so the plan's first step makes it
as the job's does and the planner frees it where the job's loop lets its loss go
(docs/VALIDATION.md, "The first step's held pair in the templates"). Left out, as before
2026-11-30, the plan's first forward made no leaf where the GPU's did, and the checkpointed QLoRA
rows' reserved memory moved by one leaf.

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

    def test_the_first_step_s_leaf_and_gradient_are_held_in_step1(self):
        (first,) = self.embedding_outputs("step1.forward")
        self.assertEqual(self.job.tensors[first]["freed"]["section"], "step2.forward")
        across = [i for i, why in self.left.items() if why == "lives from one step into the next"]
        self.assertEqual(across, [], [self.job.tensors[i]["ops"][:2] for i in across])
        held = [i for i in self.keep if self.sp.held_into_step2(self.job.tensors[i])]
        self.assertEqual(len(held), 2, [self.job.tensors[i]["ops"][:2] for i in held])
        self.assertIn(first, held)
        events = self.sp.sequence(self.job, self.keep)
        # Made in the template's first step and freed in none of its sections: the planner frees
        # them where the job's loop lets its loss go.
        for i in held:
            self.assertIn(("a", i), [(k, t) for k, t, _ in events["step1"]])
            for name in ("setup", "step1", "step"):
                self.assertNotIn(("f", i), [(k, t) for k, t, _ in events[name]], name)


class HeldLossT5(NeedsRecorders):
    """T5's graph holds three leaves under checkpointing where a decoder-only model's holds one:
    the encoder's and the decoder's input embeddings' outputs (`enable_input_require_grads`) and
    the decoder's cross-attention zero position bias (T5Attention makes it require a gradient
    under checkpointing), each with its `.grad`. The first step's six live into the second
    step's forward and are held in `step1`; the second step's six are kept. With the loss let go
    inside the profile, the second step's read as living into the next too: twelve left out."""

    @classmethod
    def setUpClass(cls):
        try:
            import step_programs as sp
        except ImportError:
            return
        cls.sp = sp
        cls.job = sp.Job("t5", "seq2seq-lm", sp.AMP_CUDA, "eager", True, 2, 16, 2, (sp.LORA_RANK, "qv"))
        cls.keep, cls.left = sp.kept(cls.job)
        cls.tiny = sp.TINY

    def test_the_second_step_s_three_leaves_and_their_gradients_are_kept(self):
        never = [i for i, x in enumerate(self.job.tensors) if x["section"].startswith("step2")
                 and x["freed"] is None and x["size"] > self.tiny]
        self.assertEqual(len(never), 6, [self.job.tensors[i]["ops"][:1] for i in never])
        self.assertEqual(sorted(self.job.tensors[i]["ops"][0][0] for i in never
                                if self.job.tensors[i]["section"] == "step2.forward"),
                         ["aten::embedding", "aten::embedding", "aten::zeros"])
        for i in never:
            self.assertIn(i, self.keep)

    def test_the_first_step_s_six_are_held_in_step1(self):
        across = [i for i, why in self.left.items() if why == "lives from one step into the next"]
        self.assertEqual(across, [], [(self.job.tensors[i]["section"], self.job.tensors[i]["ops"][:1])
                                      for i in across])
        held = [i for i in self.keep if self.sp.held_into_step2(self.job.tensors[i])]
        self.assertEqual(len(held), 6, [(self.job.tensors[i]["section"], self.job.tensors[i]["ops"][:1])
                                        for i in held])
        self.assertEqual(sorted(self.job.tensors[i]["ops"][0][0] for i in held
                                if self.job.tensors[i]["section"] == "step1.forward"),
                         ["aten::embedding", "aten::embedding", "aten::zeros"])
        events = self.sp.sequence(self.job, self.keep)
        frees = {t for name in ("setup", "step1", "step") for k, t, _ in events[name] if k == "f"}
        self.assertEqual(frees & set(held), set())


if __name__ == "__main__":
    unittest.main()

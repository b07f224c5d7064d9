"""The recorder's CPU truth (scripts/validate/recorder_truth.py, data/validation/recorder_truth.json):
the live peak it records under fake tensors is the one the same step reaches on the CPU, to the
byte, on at least 95% of at least 60 jobs over every family, LoRA, inference and generate's decode steps. A few jobs are run
again here, live, against the figures the file holds. Skipped, saying so, where torch,
transformers or peft is not installed:

    pip install torch transformers peft
    PYTHONPATH=python python3 -m unittest python/tests/test_recorder_truth.py
"""

import json
import os
import sys
import unittest

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TRUTH = os.path.join(REPO, "data", "validation", "recorder_truth.json")

try:
    import peft  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401

    MISSING = None
except ImportError as e:  # pragma: no cover - depends on the environment
    MISSING = f"the recorder's CPU truth needs torch, transformers and peft (pip install torch transformers peft): {e}"


def _truth():
    with open(TRUTH, encoding="utf-8") as f:
        return json.load(f)


def _grid():
    sys.path.insert(0, os.path.join(REPO, "scripts", "validate"))
    import recorder_truth

    return recorder_truth


class TheFile(unittest.TestCase):
    """What data/validation/recorder_truth.json says (no torch needed to read it)."""

    def test_exact_on_95_percent_of_60_jobs_or_more(self):
        jobs = _truth()["jobs"]
        self.assertGreaterEqual(len(jobs), 60)
        exact = sum(1 for j in jobs if j["exact"])
        self.assertGreaterEqual(exact / len(jobs), 0.95, f"{exact} of {len(jobs)} exact")
        check = [j for j in jobs if j["split"] == "check"]
        self.assertGreaterEqual(sum(1 for j in check if j["exact"]) / len(check), 0.95)

    def test_every_family_lora_and_inference(self):
        jobs = _truth()["jobs"]
        families = {j["family"] for j in jobs}
        for family in ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
                       "gemma3_text", "phi3", "gpt2", "gpt_neox", "bloom", "bert", "t5"):
            self.assertIn(family, families)
        self.assertTrue(any(j["lora"] for j in jobs))
        self.assertTrue(any(j["mode"] == "infer" for j in jobs))
        self.assertTrue(any(j["mode"] == "generate" for j in jobs))
        self.assertEqual({j["split"] for j in jobs if j["family"] in ("llama", "gpt2")}, {"tuning"})
        self.assertEqual({j["split"] for j in jobs if j["family"] not in ("llama", "gpt2")}, {"check"})


@unittest.skipIf(MISSING, MISSING)
class Documented(unittest.TestCase):
    def test_validation_md_shows_the_files_table(self):
        """docs/VALIDATION.md's table is the one `recorder_truth.py --table` prints of the file."""
        import subprocess

        run = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "validate", "recorder_truth.py"),
                              "--table", TRUTH], capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stderr)
        with open(os.path.join(REPO, "docs", "VALIDATION.md"), encoding="utf-8") as f:
            self.assertIn(run.stdout.strip(), f.read())


@unittest.skipIf(MISSING, MISSING)
class Live(unittest.TestCase):
    """Jobs of the grid run again: the recorder and the CPU agree, and the file holds these figures."""

    def test_a_few_jobs_again(self):
        rt = _grid()
        torch.set_num_threads(1)
        cfgs = rt.configs()
        held = {(j["family"], j["mode"], j["precision"], j["attention"], j["lora"]): j for j in _truth()["jobs"]}
        wanted = (("qwen3", "infer", "fp32", "sdpa", None), ("gpt_neox", "train", "fp32", "sdpa", 4),
                  ("phi3", "generate", "fp32", "sdpa", None))
        for key in wanted:
            job = next(j for j in rt.jobs() if (j["family"], j["mode"], j["precision"], j["attention"], j["lora"]) == key)
            r = rt.run(job, cfgs)
            self.assertEqual(r["recorded_peak_bytes"], r["cpu_peak_bytes"], key)
            self.assertEqual(r["cpu_peak_bytes"], held[key]["cpu_peak_bytes"], key)
            self.assertEqual(r["recorded_peak_bytes"], held[key]["recorded_peak_bytes"], key)


if __name__ == "__main__":
    unittest.main()

"""scripts/gpu/validate_templates.py without a GPU: its plans, its jobs' code on the CPU, its
table, and its refusal to measure where there is no GPU.

    PYTHONPATH=python HEADROOM_BIN=target/debug/headroom python3 -m unittest python/tests/test_validate_templates.py
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

import headroom_gpu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "gpu", "validate_templates.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import validate_templates  # noqa: E402

try:
    import peft  # noqa: F401
    import torch
    import transformers  # noqa: F401

    MISSING = None
except ImportError as e:
    MISSING = f"the jobs' code needs torch, transformers and peft ({e})"


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=600)


class Plans(unittest.TestCase):
    def test_every_job_is_planned_from_a_template(self):
        """Each job is one the shipped templates serve: a job the planner would plan by the
        closed form, or refuse, checks nothing."""
        try:
            binary = headroom_gpu.binary()
        except headroom_gpu.HeadroomError as e:
            self.skipTest(f"no headroom binary: {e}")
        out = os.path.join(tempfile.mkdtemp(), "plans.json")
        r = run("plan", "--headroom", binary, "--out", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out) as f:
            plans = json.load(f)
        self.assertEqual(set(plans), {j["name"] for j in validate_templates.jobs()})
        for name, p in plans.items():
            self.assertNotIn("error", p, name)
            self.assertIn(p["program"]["source"], ("recorded", "template"), name)
            self.assertGreater(p["reserved_bytes"], p["allocated_bytes"] * 0.99, name)

    def test_an_unknown_job_is_named(self):
        r = run("plan", "--out", os.devnull, "--only", "no-such-job")
        self.assertEqual(r.returncode, 1)
        self.assertIn("no job named 'no-such-job'", r.stderr)
        self.assertIn("t5-base bf16 2x512", r.stderr)


class Table(unittest.TestCase):
    def test_rows_set_the_plan_beside_the_gpu(self):
        tmp = tempfile.mkdtemp()
        plans, measured = os.path.join(tmp, "plans.json"), os.path.join(tmp, "measured.jsonl")
        with open(plans, "w") as f:
            json.dump({"a": {"allocated_bytes": 11 << 30, "reserved_bytes": 12 << 30, "fits": True,
                             "program": {"source": "recorded", "template": "t5/seq2seq-lm/bf16/eager/full"}},
                       "b": {"error": "refused"}}, f)
        with open(measured, "w") as f:
            f.write(json.dumps({"name": "a", "allocated": 10 << 30, "reserved": 12 << 30}) + "\n")
            f.write(json.dumps({"name": "b", "error": "OutOfMemoryError"}) + "\n")
        r = run("table", "--plans", plans, "--measured", measured)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("| a | `t5/seq2seq-lm/bf16/eager/full` | 10.00 GiB | 11.00 GiB | +10.00% | 12.00 GiB | "
                      "12.00 GiB | +0.00% |", r.stdout)
        self.assertIn("| b | closed form | OutOfMemoryError | refused |", r.stdout)


@unittest.skipIf(MISSING, MISSING)
class Jobs(unittest.TestCase):
    def test_a_job_runs_on_the_cpu(self):
        """The code `measure` runs on the GPU, on one layer of T5 with LoRA: a job that fails
        here would waste a GPU's time."""
        job = [j for j in validate_templates.jobs() if j["name"] == "t5-base lora r16 4x512"][0]
        job = {**job, "config": validate_templates.layers(job["config"], 1), "batch": 1, "seq": 16}
        r = run("one", json.dumps(job), "--device", "cpu")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout.strip().splitlines()[-1])["device"], "cpu")

    @unittest.skipIf(MISSING is None and torch.cuda.is_available(), "a GPU is here: measure would run every job")
    def test_measure_without_a_gpu_says_so(self):
        r = run("measure", "--out", os.path.join(tempfile.mkdtemp(), "m.jsonl"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("no CUDA GPU here", r.stderr)


if __name__ == "__main__":
    unittest.main()

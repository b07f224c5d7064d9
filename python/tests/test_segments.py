"""scripts/validate/segments.py and scripts/gpu/validate_plan.py's snapshot jobs, without a GPU:
two runs' large segments compared, a difference found where one run made a segment the other did
not, and the dev grid's jobs named and ordered as the GPU ran them.

    PYTHONPATH=python HEADROOM_BIN=target/debug/headroom python3 -m unittest python/tests/test_segments.py
"""

import io
import json
import os
import subprocess
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

import headroom_gpu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts", "validate"))
sys.path.insert(0, os.path.join(ROOT, "scripts", "gpu"))
import segments  # noqa: E402
import validate_plan  # noqa: E402

GIB2, PIN = 2 << 30, 64 << 20
CAPACITY = 80 << 30
SHARED = os.path.join(ROOT, "..", "shared", "gpu", "devgrid-cases.json")


def program(path, ops):
    with open(path, "w") as f:
        for op in ops:
            f.write(json.dumps(op) + "\n")
    return path


# The 64 MiB tensor made while the 2 GiB one is live takes a segment of its own, and the second
# 2 GiB request reuses the first one's segment: one large segment.
KEEPS = [{"op": "alloc", "id": "x", "size": GIB2}, {"op": "alloc", "id": "pin", "size": PIN},
         {"op": "free", "id": "x"}, {"op": "alloc", "id": "y", "size": GIB2}]
# Made after the 2 GiB tensor is freed, the 64 MiB one is split from its block (best fit), and
# the second 2 GiB request needs a segment of its own: two.
SPLITS = [{"op": "alloc", "id": "x", "size": GIB2}, {"op": "free", "id": "x"},
          {"op": "alloc", "id": "pin", "size": PIN}, {"op": "alloc", "id": "y", "size": GIB2}]


class Segments(unittest.TestCase):
    def setUp(self):
        try:
            self.binary = headroom_gpu.binary()
        except headroom_gpu.HeadroomError as e:
            self.skipTest(f"no headroom binary: {e}")
        self.tmp = tempfile.mkdtemp()

    def snapshot_of(self, ops, name):
        """The PyTorch snapshot `headroom replay` writes of `ops`: a stand-in for a GPU's."""
        trace = program(os.path.join(self.tmp, f"{name}.jsonl"), ops)
        snap = os.path.join(self.tmp, f"{name}.pickle")
        subprocess.run([self.binary, "replay", trace, "--capacity", str(CAPACITY), "--snapshot-out", snap],
                       check=True, capture_output=True)
        return snap

    def compare(self, snapshot, ops, name):
        out = io.StringIO()
        with redirect_stdout(out):
            rc = segments.main([snapshot, "--program", program(os.path.join(self.tmp, f"{name}.jsonl"), ops),
                                "--headroom", self.binary, "--capacity", str(CAPACITY)])
        return rc, out.getvalue()

    def test_the_same_run_makes_the_same_segments(self):
        rc, text = self.compare(self.snapshot_of(KEEPS, "gpu"), KEEPS, "plan")
        self.assertEqual(rc, 0, text)
        self.assertIn("the same large segments, in the same order", text)
        self.assertIn("request      0  x", text)  # the plan's side names the request that made it

    def test_a_segment_one_run_made_and_the_other_did_not_is_named(self):
        rc, text = self.compare(self.snapshot_of(KEEPS, "gpu"), SPLITS, "plan")
        self.assertEqual(rc, 1, text)
        self.assertIn("first difference: large segment 2: GPU none, plan 2,048 MiB", text)
        self.assertIn("    2     2,048 MiB  request      2  y", text)
        # what keeps the first segment from serving `y`: the 64 MiB tensor split from it
        self.assertIn("segment   1, 2,048 MiB: 64.0 MiB live in 1 blocks", text)

    def test_a_file_that_is_no_snapshot_is_named(self):
        with self.assertRaises(SystemExit) as e:
            segments.load(os.path.join(ROOT, "README.md"))
        self.assertIn("README.md: not a readable snapshot", str(e.exception.code))
        with self.assertRaises(SystemExit) as e:
            segments.main(["--program", os.path.join(self.tmp, "none.jsonl"), "--capacity", "1",
                           "--headroom", os.path.join(self.tmp, "no-binary")])
        self.assertIn("cannot run", str(e.exception.code))

    def test_a_program_without_its_capacity_is_refused(self):
        with self.assertRaises(SystemExit) as e, redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
            segments.main(["--program", "x.jsonl"])
        self.assertEqual(e.exception.code, 2)


class SnapshotJobs(unittest.TestCase):
    def test_the_dev_grid_is_named_and_ordered_as_it_ran(self):
        if not os.path.exists(SHARED):
            self.skipTest("../shared/gpu (the GPU's measurements) is not beside this checkout")
        with open(SHARED) as f:
            cases = [c["name"] for c in json.load(f)]
        grid = validate_plan.jobs(list(validate_plan.CONFIGS), [(1, 512), (4, 2048)])
        self.assertEqual([validate_plan.job_name(m, b, s, p, c) for m, _, b, s, p, c in grid], cases)

    def test_an_unknown_job_is_refused_before_a_gpu_is_asked_for(self):
        r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu", "validate_plan.py"),
                            "--models", "llama-1b", "--shapes", "1x512,4x2048", "--snapshots", self.id(),
                            "--snapshot-jobs", "llama-1b-train-fp32-full-sdpa-4x2049"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 2)
        self.assertIn("no job named llama-1b-train-fp32-full-sdpa-4x2049", r.stderr)
        self.assertIn("llama-1b-train-fp32-full-sdpa-4x2048", r.stderr)


if __name__ == "__main__":
    unittest.main()

"""The Python module against the `headroom` binary, with no GPU: `plan`, `inspect`, the
errors, and `record` saying clearly what it needs. In an environment where the wheel is
installed:

    python -m unittest discover -s python/tests

or against the sources and a binary built with cargo, from the repository root:

    PYTHONPATH=python HEADROOM_BIN=target/release/headroom python3 -m unittest discover -s python/tests
"""

import os
import subprocess
import sys
import tempfile
import unittest

import headroom_gpu

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


class Plan(unittest.TestCase):
    def test_an_answer_that_fits_and_one_that_does_not(self):
        small = headroom_gpu.plan(model="gpt2", gpu="h100-sxm", batch=4, seq=1024)
        self.assertTrue(small["fits"])
        self.assertIsInstance(small["per_gpu_bytes"], int)
        big = headroom_gpu.plan(model="llama-3-70b", gpu="l4")
        self.assertFalse(big["fits"], "exit status 1 is an answer, not an error")

    def test_keyword_arguments_are_flags(self):
        r = headroom_gpu.plan(model="llama-3-8b", gpu="h100-sxm", infer=True, weights="int4", max_batch=False)
        self.assertEqual(r["mode"], "infer")
        r = headroom_gpu.plan(model="gpt2", gpu="l4", seq=1024, max_batch=True)
        self.assertGreater(r["max_batch"], 0)

    def test_bad_input_raises_with_headrooms_message(self):
        with self.assertRaises(headroom_gpu.HeadroomError) as e:
            headroom_gpu.plan(model="no-such-model", gpu="h100-sxm")
        self.assertIn("no-such-model", str(e.exception))
        self.assertEqual(e.exception.status, 2)


class Inspect(unittest.TestCase):
    def test_a_snapshot_headroom_wrote(self):
        with tempfile.TemporaryDirectory() as d:
            snap = os.path.join(d, "run.pickle")
            trace = os.path.join(REPO, "data", "traces", "gpt2-small-train.jsonl")
            subprocess.run(
                [headroom_gpu.binary(), "replay", trace, "--snapshot-out", snap], check=True, capture_output=True
            )
            r = headroom_gpu.inspect(snap, top=5)
            device = r["snapshots"][0]["devices"][0]
            self.assertGreater(device["peak_allocated_bytes"], 0)
            self.assertLessEqual(device["peak_allocated_bytes"], device["peak_reserved_bytes"])

    def test_a_missing_file_raises(self):
        with self.assertRaises(headroom_gpu.HeadroomError):
            headroom_gpu.inspect("/nonexistent/run.pickle")
        with self.assertRaises(headroom_gpu.HeadroomError):
            headroom_gpu.inspect()


class FakeTorch:
    """Stands in for torch with a CUDA device: records the calls `record` makes."""

    def __init__(self):
        self.calls = []
        outer = self

        class Memory:
            @staticmethod
            def _record_memory_history(enabled="all", **kwargs):
                outer.calls.append(("history", enabled, kwargs))

            @staticmethod
            def _dump_snapshot(path):
                outer.calls.append(("dump", path))

        class Cuda:
            memory = Memory

            @staticmethod
            def is_available():
                return True

        self.cuda = Cuda


class Record(unittest.TestCase):
    def with_fake_torch(self):
        fake = FakeTorch()
        saved = sys.modules.get("torch")
        sys.modules["torch"] = fake
        self.addCleanup(lambda: sys.modules.__setitem__("torch", saved) if saved else sys.modules.pop("torch"))
        return fake

    def test_records_then_dumps_and_stops(self):
        fake = self.with_fake_torch()
        with headroom_gpu.record("run.pickle", max_entries=1000, stacks="all"):
            fake.calls.append(("step",))
        self.assertEqual(
            fake.calls,
            [
                ("history", "all", {"stacks": "all", "max_entries": 1000}),
                ("step",),
                ("dump", "run.pickle"),
                ("history", None, {}),
            ],
        )

    def test_an_out_of_memory_error_still_dumps_and_goes_on(self):
        fake = self.with_fake_torch()

        class OutOfMemoryError(RuntimeError):
            pass

        with self.assertRaises(OutOfMemoryError):
            with headroom_gpu.record("oom.pickle"):
                raise OutOfMemoryError("CUDA out of memory")
        self.assertEqual([c[0] for c in fake.calls], ["history", "dump", "history"])
        self.assertEqual(fake.calls[1], ("dump", "oom.pickle"))

    def test_without_cuda_it_says_what_it_needs(self):
        try:
            import torch  # noqa: F401

            if torch.cuda.is_available():
                self.skipTest("a CUDA device is present")
        except ImportError:
            pass
        with self.assertRaises(headroom_gpu.HeadroomError) as e:
            with headroom_gpu.record("unused.pickle"):
                pass
        self.assertRegex(str(e.exception), "PyTorch|CUDA")


if __name__ == "__main__":
    unittest.main()

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


class TorchAllocator(unittest.TestCase):
    """The plug-in loaded as `use` loads it, on its simulated GPU, with torch stood in for."""

    def setUp(self):
        self.lib = os.environ.get("HEADROOM_TORCH_LIB")
        if not self.lib:
            self.skipTest("HEADROOM_TORCH_LIB is not set (cargo build --release -p headroom-torch)")

    def run_python(self, code, **env):
        full = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), **env)
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full)

    def test_use_hands_pytorch_the_two_functions_and_stats_follow(self):
        code = f"""
import sys, types
calls = []
hooks = dict()
class Hooks:
    def __getattr__(self, name):
        if not name.startswith("set_"):
            raise AttributeError(name)
        return lambda address: hooks.__setitem__(name, address)
class Pluggable:
    def __init__(self, *args):
        calls.append(("pluggable",) + args)
        self._allocator = Hooks()
memory = types.SimpleNamespace(CUDAPluggableAllocator=Pluggable,
                               change_current_allocator=lambda a: calls.append(("change", a)))
sys.modules["torch"] = types.SimpleNamespace(cuda=types.SimpleNamespace(memory=memory, is_initialized=lambda: False))
import ctypes, tempfile, os
from headroom_gpu import torch_allocator
torch_allocator.use({self.lib!r}, policy="expandable")
assert calls[0] == ("pluggable", {self.lib!r}, "headroom_malloc", "headroom_free"), calls
assert calls[1][0] == "change"
lib = ctypes.CDLL({self.lib!r})
# PyTorch is handed the private-pool hooks: the library's own functions.
for setter, symbol in torch_allocator.POOL_HOOKS.items():
    assert hooks[setter] == ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value, (setter, hooks)
lib.headroom_malloc.restype = ctypes.c_void_p
lib.headroom_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
torch_allocator.record_history(1000, {self.lib!r})
p = lib.headroom_malloc(3 << 20, 1, None)
assert p
s = torch_allocator.memory_stats(1, {self.lib!r})
assert s["allocated_bytes.all.current"] == 3 << 20, s["allocated_bytes.all.current"]
with tempfile.TemporaryDirectory() as d:
    torch_allocator.dump_snapshot(os.path.join(d, "plugin.pickle"), {self.lib!r})
    assert os.path.getsize(os.path.join(d, "plugin.pickle")) > 0
print("ok")
"""
        r = self.run_python(code, HEADROOM_TORCH_BACKEND="sim", HEADROOM_TORCH_SIM_BYTES="1GiB")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "ok")

    def assert_use_refuses(self, pluggable_init, initialized, says):
        """`use()` under a stand-in torch refuses with `says`, and PyTorch's allocator is never swapped."""
        code = f"""
import sys, types
calls = []
class Pluggable:
    def __init__(self, *args): {pluggable_init}
memory = types.SimpleNamespace(CUDAPluggableAllocator=Pluggable,
                               change_current_allocator=lambda a: calls.append(a))
sys.modules["torch"] = types.SimpleNamespace(cuda=types.SimpleNamespace(memory=memory, is_initialized=lambda: {initialized}))
from headroom_gpu import torch_allocator, HeadroomError
try:
    torch_allocator.use({self.lib!r})
except HeadroomError as e:
    assert {says!r} in str(e), e
    assert calls == [], calls
    print("refused")
"""
        r = self.run_python(code, HEADROOM_TORCH_BACKEND="sim")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "refused")

    def test_without_the_pool_hooks_use_refuses(self):
        self.assert_use_refuses("self._allocator = types.SimpleNamespace()", False, "PyTorch 2.3 or newer")

    def test_after_a_cuda_call_use_refuses_naming_the_order(self):
        # Refused before the pluggable allocator is even made.
        self.assert_use_refuses("calls.append(args)", True, "before any CUDA call")

    def test_without_a_backend_use_refuses_and_leaves_pytorch_alone(self):
        code = f"""
import sys, types
calls = []
memory = types.SimpleNamespace(CUDAPluggableAllocator=lambda *a: calls.append(a),
                               change_current_allocator=lambda a: calls.append(a))
sys.modules["torch"] = types.SimpleNamespace(cuda=types.SimpleNamespace(memory=memory, is_initialized=lambda: False))
from headroom_gpu import torch_allocator, HeadroomError
try:
    torch_allocator.use({self.lib!r})
except HeadroomError as e:
    assert "HEADROOM_TORCH_BACKEND=none: expected cuda or sim" in str(e), e
    assert calls == [], calls
    print("refused")
"""
        env = dict(HEADROOM_TORCH_BACKEND="none")
        r = self.run_python(code, **env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "refused")

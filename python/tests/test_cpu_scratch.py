"""The step recorders leave out what a CPU kernel makes and drops inside one call
(`step_programs.cpu_scratch`). A mixture of experts counts its tokens per expert with
`torch.histc` (transformers' grouped experts, a float input on a CPU): its CPU kernel keeps the
bin edges and one histogram per intra-op thread, so a template that kept them would read 4 bytes
an expert recorded with one thread and 8 with two (docs/VALIDATION.md, "Qwen2-MoE's router
histogram and one scan for the layer marks' sums"). Only the output stays, whatever the threads:
in the training recorders' reading (`step_programs.allocations`) and in the inference recorder's
(`infer_programs.InferJob`, its sections and the tensors `infer_programs.kept` keeps). Every
bundled template was recorded under that reading, and none keeps the histograms.

    cd python && python3 -m unittest tests/test_cpu_scratch.py
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_recorders import NeedsRecorders  # noqa: E402  (scripts/validate on the path too)
import template_file  # noqa: E402

EXPERTS = 9


class HistcScratch(NeedsRecorders):
    def kept_and_left(self, threads):
        """The sizes of what `torch.histc` allocates under `threads` intra-op threads, split into
        what the recorders keep and what they leave out as scratch."""
        import step_programs as sp
        import torch
        from torch.profiler import ProfilerActivity, profile

        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            # Top-2 of 9 experts for 2×56 tokens, sorted, as the grouped experts hand them over.
            ids = torch.randint(0, EXPERTS, (2 * 56 * 2,)).sort().values.float()
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                out = torch.histc(ids, bins=EXPERTS, min=0, max=EXPERTS - 1)
        finally:
            torch.set_num_threads(before)
        made, kept, left = {}, [], []
        for _, ptr, size, ops in sp.allocations(prof):
            if size > 0:
                made[ptr] = (size, ops)
            elif ptr in made:
                size, at = made.pop(ptr)
                (left if sp.cpu_scratch(at, ops) else kept).append(size)
        kept += [size for size, _ in made.values()]  # alive after the call: the output
        self.assertEqual(out.numel(), EXPERTS)
        return sorted(kept), sorted(left)

    def test_only_the_output_is_kept_whatever_the_threads(self):
        for threads in (1, 2):
            with self.subTest(threads=threads):
                kept, left = self.kept_and_left(threads)
                self.assertEqual(kept, [EXPERTS * 4])
                # The bin edges and the per-thread histograms: what a thread count changes.
                self.assertEqual(sum(left), (EXPERTS + 1) * 4 + threads * EXPERTS * 4)


class InferenceHistcScratch(NeedsRecorders):
    """The inference recorder reads a profile with marks of its own (`setup`, `run`, `forward`)
    and keeps a tensor by `infer_programs.kept`: a histc in a generate's first forward leaves its
    output alone in the prefill, whatever the threads."""

    def kept_and_left(self, threads):
        import infer_programs as ip
        import torch
        from torch.profiler import ProfilerActivity, profile, record_function

        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            ids = torch.randint(0, EXPERTS, (2 * 56 * 2,)).sort().values.float()
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                with record_function("setup"):
                    pass
                with record_function("run"), record_function("forward"):
                    out = torch.histc(ids, bins=EXPERTS, min=0, max=EXPERTS - 1)
        finally:
            torch.set_num_threads(before)
        job = ip.InferJob.__new__(ip.InferJob)
        job._read(prof, {})
        keep, left = ip.kept(job)
        self.assertEqual(out.numel(), EXPERTS)
        self.assertTrue(all(job.tensors[i]["section"] == "prefill" for i in keep))
        return sorted(job.tensors[i]["size"] for i in keep), left, \
            sum(t["size"] for t in job.tensors if t["scratch"])

    def test_the_inference_recorder_keeps_only_the_output_whatever_the_threads(self):
        for threads in (1, 2):
            with self.subTest(threads=threads):
                kept, left, scratch = self.kept_and_left(threads)
                self.assertEqual(kept, [EXPERTS * 4])
                self.assertEqual(left, {"CPU kernel scratch": 2})
                self.assertEqual(scratch, (EXPERTS + 1) * 4 + threads * EXPERTS * 4)


def histograms(t):
    """How many of a template's tensors are a CPU histc's histograms (`aten::histc > aten::empty`)."""
    return sum(1 for e in t["tensors"] if t["sites"][e[2]] == "aten::histc > aten::empty")


class Bundled(unittest.TestCase):
    def test_no_template_keeps_the_histograms(self):
        found, files = {}, set()
        for name, key, t in template_file.bundled():
            files.add(name)
            if histograms(t):
                found.setdefault(name, []).append(key)
        self.assertGreater(len(files), 10)
        self.assertEqual(found, {})


if __name__ == "__main__":
    unittest.main()

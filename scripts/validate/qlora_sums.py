#!/usr/bin/env python3
"""Autograd's out-of-place gradient sums in the QLoRA templates (`data/programs/hf-qlora*.tpl`),
by what the sum replaced. `qlora_programs.py` records with fake tensors under a dispatch mode,
where the engine makes every sum a new tensor and `headroom_gpu.gradient_sums` places it where
a GPU's engine does (`InputBuffer::accumulate`): in place into the first gradient, which is then
no allocation at all, unless the first is a view, whose base shares its storage (a linear layer's
input gradient from `ViewBackward0`, the view of a matrix product's output). The fake recorder
names a site by its operator alone (`aten::add`, no autograd node), so a sum is known by the free
that follows it: the first gradient's, freed as the sum replaces it.

Per key, the later step's backward's `aten::add` allocations of one hidden state a token, counted
by the site of the tensor freed right after: `aten::mm` is a matrix product's output, the base
of a view (the engine's own out-of-place sum); `aten::add` is a sum summed into again, which the
engine adds in place and which only a recording that placed no sum keeps (templates recorded
before `gradient_sums`); anything else is listed by its site. Under checkpointing the backward
also runs the recomputed forward, whose adds (a residual's, LoRA's `result + lora_B(...)`) are no
gradient sums and are counted with the rest.

    python3 scripts/validate/qlora_sums.py data/programs/hf-qlora.tpl [FILE ...] [--stale]

`--stale` lists only the keys without checkpointing (`/full/`) that have a sum summed into
again: under checkpointing a recomputed forward's add of an add looks the same.
"""

import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import template_file  # noqa: E402
from backward_adds import hidden_sized  # noqa: E402


def sums(t):
    """Counter(site of the tensor freed right after) of the hidden-sized `aten::add` allocations
    in `t`'s later step's backward; `-` where the next event frees nothing of the sum's law."""
    step, start = t["step"], t["backward"][1]
    tensors, sites, laws = t["tensors"], t["sites"], t["laws"]
    out = collections.Counter()
    for i in range(start, len(step) // 3):
        kind, tensor, _ = step[3 * i: 3 * i + 3]
        law, _, site = tensors[tensor][:3]
        if kind != 0 or sites[site] != "aten::add" or not hidden_sized(laws[law]):
            continue
        nxt = step[3 * i + 3: 3 * i + 5]
        freed = len(nxt) == 2 and nxt[0] == 1 and tensors[nxt[1]][0] == law
        out[sites[tensors[nxt[1]][2]] if freed else "-"] += 1
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--stale", action="store_true", help="only keys without checkpointing with a sum summed into again")
    args = ap.parse_args()
    for path in args.files:
        templates = template_file.read(path)["templates"]
        for key in sorted(templates):
            if "error" in templates[key]:
                continue
            c = sums(templates[key])
            if args.stale and (not c["aten::add"] or "/ckpt/" in key):
                continue
            print(f"{os.path.basename(path)}\t{key}\t{sum(c.values())}\t"
                  + ", ".join(f"{s} x{n}" for s, n in c.most_common()))


if __name__ == "__main__":
    main()

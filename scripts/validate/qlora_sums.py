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

    python3 scripts/validate/qlora_sums.py data/programs/hf-qlora.tpl [FILE ...] [--stale | --viewless]

`--stale` lists only the keys without checkpointing (`/full/`) that have a sum summed into
again: under checkpointing a recomputed forward's add of an add looks the same.

`--viewless` lists the keys whose later step's backward has no out-of-place sum of a view at
all, of any width (`view_sums`): an adapted projection's input gradient sums the 4-bit base's
and the adapter's, and at bf16 and fp32 compute one of them arrives first as the view of a
matrix product's output, which the engine does not add into (a hidden state at the attention's
and the MLP's input, the MLP's and the attention output's widths at their output projections:
4 a step for the query and value projections at five layers, 19 for every linear layer). A
key recorded before that sum was made out of place (2026-11-30 noon) has none. Under AMP
(`amp-cuda`) a linear layer's input that autocast casts gets its gradient through the cast
(`ToCopyBackward0`), a new tensor; the attention's output is bf16 already, so the output
projection's input gradient is a view's sum there too: `qlora-all` has one a layer (5 a step; T5
15, its three attentions), `qlora-qv` none. BERT's query-value keys have none either: its
`qlora-qv` without checkpointing, recorded again under the rule, is the bundled key event for
event (its adapted projections' input, the previous block's LayerNorm's output, gets its first
gradient from the residual). Neither is listed.
"""

import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import template_file  # noqa: E402
from backward_adds import hidden_sized  # noqa: E402


def backward_adds(t):
    """Each `aten::add` allocation in `t`'s later step's backward, as (its law, the site of the
    tensor of that law freed by the very next event, or `None` where that event frees nothing of
    the sum's law): the one walk both counts below read."""
    step, start = t["step"], t["backward"][1]
    tensors, sites = t["tensors"], t["sites"]
    for i in range(start, len(step) // 3):
        kind, tensor, _ = step[3 * i: 3 * i + 3]
        law, _, site = tensors[tensor][:3]
        if kind != 0 or sites[site] != "aten::add":
            continue
        nxt = step[3 * i + 3: 3 * i + 5]
        freed = len(nxt) == 2 and nxt[0] == 1 and tensors[nxt[1]][0] == law
        yield law, sites[tensors[nxt[1]][2]] if freed else None


def sums(t):
    """Counter(site of the tensor freed right after) of the hidden-sized `aten::add` allocations
    in `t`'s later step's backward; `-` where the next event frees nothing of the sum's law."""
    laws = t["laws"]
    return collections.Counter(freed or "-" for law, freed in backward_adds(t) if hidden_sized(laws[law]))


def view_sums(t):
    """How many of `t`'s later step's backward's `aten::add` allocations, of any law, are followed
    right away by the free of a tensor of their law made by `aten::mm`: the engine's own
    out-of-place sums into a gradient that is the view of a matrix product's output."""
    return sum(freed == "aten::mm" for _, freed in backward_adds(t))


def viewless(key, t):
    """Whether `t` has no out-of-place sum of a view where it should have one: a recording made
    before a view's sum was made out of place. Under AMP only `qlora-all` has one (the output
    projection's input, the attention's bf16 output)."""
    amp = "/amp-cuda/" in key or "/amp/" in key
    if key.endswith("/qlora-qv") and (amp or key.startswith("bert/")):
        return False
    return view_sums(t) == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--stale", action="store_true", help="only keys without checkpointing with a sum summed into again")
    ap.add_argument("--viewless", action="store_true",
                    help="only keys with no out-of-place sum of a view where they should have one")
    args = ap.parse_args()
    for path in args.files:
        templates = template_file.read(path)["templates"]
        for key in sorted(templates):
            if "error" in templates[key]:
                continue
            if args.viewless:
                if viewless(key, templates[key]):
                    print(f"{os.path.basename(path)}\t{key}")
                continue
            c = sums(templates[key])
            if args.stale and (not c["aten::add"] or "/ckpt/" in key):
                continue
            print(f"{os.path.basename(path)}\t{key}\t{sum(c.values())}\t"
                  + ", ".join(f"{s} x{n}" for s, n in c.most_common()) + f"\tviews {view_sums(templates[key])}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Autograd's out-of-place sums of two activation-sized gradients in the recorded backward of
each step program: a template's allocations after its step's backward begins whose site is an
autograd node's `aten::add` (the engine sums a gradient that arrives second into the first
under the node that made it, `XBackward0 > aten::add`; in place it is `aten::add_`, which
allocates nothing) and whose law is a per-token tensor of one hidden state, counted by layer.

The engine adds in place where it holds the only reference to the first gradient and its
storage (`InputBuffer::accumulate`); a recorder's hook that held one (a module's full backward
hook, a storage object made of the gradient) made the residual sum a new tensor a layer where
a GPU's step adds in place (docs/VALIDATION.md, "The residual sum under the layer marks").
A key is listed with the layers that have such a sum, the count a layer and the sites. Some are
the engine's own, on any device: a sum whose first gradient is a view (`ViewBackward0 >
aten::add`: a linear layer's input gradient, `grad.view(...)`, which holds its base's storage),
and, under checkpointing, one add a layer that is no sum: the recomputed forward's first
residual add, run inside the first node of the layer's backward as it unpacks a saved tensor
(`torch.utils.checkpoint` stops the recomputation once the last saved tensor is made, before the
second residual add). `python/tests/test_layer_marks.py` counts the engine's own adds with no
hook at all.

    python3 scripts/validate/backward_adds.py data/programs/hf.tpl [FILE ...] [--all]
"""

import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import template_file  # noqa: E402

ACTIVATIONS = 3  # step_programs.TERMS.index("activations")


def hidden_sized(law):
    """A law of one hidden state a token, at any width: `{"tok": {"h": w}}`."""
    return set(law) == {"tok"} and set(law["tok"]) == {"h"}


def backward_adds(t):
    """{layer: Counter(site)} of the out-of-place hidden-sized sums in `t`'s later steps'
    backward (the first step's where no later one is recorded apart)."""
    if "error" in t:
        return None
    step = t["step"]
    start = t["backward"][1]
    start = len(step) // 3 if start is None else start
    by_layer = collections.defaultdict(collections.Counter)
    for i in range(start, len(step) // 3):
        kind, tensor, layer = step[3 * i: 3 * i + 3]
        if kind != 0:
            continue
        law, term, site = t["tensors"][tensor][:3]
        name = t["sites"][site]
        top, _, leaf = name.rpartition(" > ")
        if leaf == "aten::add" and "Backward" in top and hidden_sized(t["laws"][law]):
            by_layer[layer][name] += 1
    return by_layer


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--all", action="store_true", help="list keys with no such sum too")
    args = ap.parse_args()
    for path in args.files:
        templates = template_file.read(path)["templates"]
        for key in sorted(templates):
            by_layer = backward_adds(templates[key])
            if by_layer is None:
                continue
            layers = sorted(n for n in by_layer if n >= 0)
            if not layers and not args.all:
                continue
            per = sorted({sum(by_layer[n].values()) for n in layers})
            sites = collections.Counter()
            for n in layers:
                sites.update(by_layer[n])
            print(f"{os.path.basename(path)}\t{key}\tlayers {len(layers)}\ta layer {'/'.join(map(str, per)) or 0}\t"
                  + ", ".join(f"{s} x{c}" for s, c in sites.most_common()))


if __name__ == "__main__":
    main()

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
aten::add`: a linear layer's input gradient, `grad.view(...)`, which holds its base's storage;
not BERT's at bf16, below),
and, under checkpointing, one add a layer that is no sum: the recomputed forward's first
residual add, run inside the first node of the layer's backward as it unpacks a saved tensor
(`torch.utils.checkpoint` stops the recomputation once the last saved tensor is made, before the
second residual add). `python/tests/test_layer_marks.py` counts the engine's own adds with no
hook at all.

    python3 scripts/validate/backward_adds.py data/programs/hf.tpl [FILE ...] [--all]

`--recorder` lists, of each file, only the keys whose sums include the old layer marks' hooks'
(`marks_sums`, the one rule `lora_sums.py` ranks by too, for every template, with adapters or
without): the adds at the nodes where a hook that held a layer's gradient made the residual sum
(`mark_nodes`: the norm's input-gradient node, `MulBackward0` for an fp32 or AMP RMSNorm and T5's,
`ToCopyBackward0` for a bf16 one, `NativeLayerNormBackward0` for GPT-2's, BLOOM's, GPT-NeoX's and
BERT's LayerNorm, and at bf16 BERT's sums into a layer's input gradient, `ToCopyBackward0` and
`ViewBackward0`), beyond the
engine's own there a layer (`own`: under checkpointing the recomputation's adds at Gemma-2's,
Gemma 3's, Qwen2-MoE's and T5's `MulBackward0`, BERT's post-norm blocks, GPT-NeoX's parallel
residual outside autocast), summed over the layers, by node. QLoRA's templates, recorded with
fake tensors, name no autograd node (`qlora_sums.py` scans them):

    python3 scripts/validate/backward_adds.py data/programs/hf-lora.tpl --recorder
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
    if "error" in t or "backward" not in t:
        return None  # a failed recording, or an inference template
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


# Where the old layer marks' hook made a layer's residual sum out of place: the node whose input
# gradient is the norm's (RMSNorm ends in a multiply by its weight, after a cast back to bf16
# where it computes in fp32, Gemma's `type_as` too; T5's casts before the multiply), and for
# BERT's post-norm layers at bf16 also the sums into its layer's input gradient, from peft's
# casts of the input to its fp32 adapters and the linear layers' views (its bf16 `lora-qv`
# recorded under the present marks keeps neither).
LAYER_NORM = {"gpt2", "bloom", "gpt_neox", "bert"}


def mark_nodes(family, precision):
    """The autograd nodes at which a key's backward made the old marks' residual sums."""
    if family in LAYER_NORM:
        return ("NativeLayerNormBackward0", "ToCopyBackward0", "ViewBackward0") \
            if (family, precision) == ("bert", "bf16") else ("NativeLayerNormBackward0",)
    return ("ToCopyBackward0",) if precision == "bf16" and family != "t5" else ("MulBackward0",)


# The adds a layer the engine makes itself at those nodes, with no hook (measured in keys recorded
# under the present marks, or in their bf16 twins where the node is not the bf16 key's norm's):
# under checkpointing the recomputed forward's residual add and peft's adapters' sums, run inside
# the first node of the layer's backward as it unpacks a saved tensor (`torch.utils.checkpoint`
# stops the recomputation once the last saved tensor is made); BERT's post-norm blocks under
# checkpointing; GPT-NeoX's parallel residual outside autocast, at its norm. By (family, targets)
# with `None` for a key without adapters.
RECOMPUTED = {  # checkpointed keys, at `MulBackward0`
    "gemma2": {None: 1, "qv": 1, "all": 3},
    "gemma3_text": {None: 1, "qv": 1, "all": 3},
    "qwen2_moe": {None: 1, "qv": 1, "all": 3},
    "t5": {None: 1, "qv": 1, "all": 3},
}
BERT_CHECKPOINTED = {None: 2, "qv": 4, "all": 7}  # at `NativeLayerNormBackward0`


def own(key, node):
    """The sums a layer the engine makes itself at `node` for `key`."""
    family, _, precision, _, ckpt = key.split("/")[:5]
    last = key.rsplit("/", 1)[-1]
    targets = last.split("-", 1)[1] if last.startswith("lora-") else None
    if ckpt == "ckpt" and node == "MulBackward0" and family in RECOMPUTED:
        return RECOMPUTED[family][targets]
    if node == "NativeLayerNormBackward0":
        if family == "bert" and ckpt == "ckpt":
            return BERT_CHECKPOINTED[targets]
        if family == "gpt_neox" and not precision.startswith("amp"):
            return 1
    return 0


def marks_sums(key, t):
    """{node: count} of the old marks' residual sums in `t`, over the backward's layers: the
    hidden-sized adds at `mark_nodes` beyond the engine's own (`own`), a layer at a time."""
    family, _, precision = key.split("/")[:3]
    nodes = mark_nodes(family, precision)
    extra = collections.Counter()
    for n, sites in (backward_adds(t) or {}).items():
        if n < 0:
            continue
        at = collections.Counter()
        for site, count in sites.items():
            node = site.rpartition(" > ")[0].rpartition(": ")[2]
            if node in nodes:
                at[node] += count
        for node, count in at.items():
            if count > own(key, node):
                extra[node] += count - own(key, node)
    return dict(extra)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--all", action="store_true", help="list keys with no such sum too")
    ap.add_argument("--recorder", action="store_true", help="list only the keys with the recorder's sums")
    args = ap.parse_args()
    for path in args.files:
        templates = template_file.read(path)["templates"]
        if args.recorder:
            for key in sorted(templates):
                extra = marks_sums(key, templates[key])
                if extra:
                    print(f"{os.path.basename(path)}\t{key}\t{sum(extra.values())} over the layers\t"
                          + ", ".join(f"{s} x{c}" for s, c in sorted(extra.items())))
            continue
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

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

`--recorder` lists, of each file, only the keys whose sums include the recorder's: the adds at
the site of the family's norm's input-gradient node (`norm_site`), less those a checkpointed
key's recomputation makes at that same site (`RECOMPUTE_SITE`), read from the key's twin at a
precision whose norm sums elsewhere (`?` where no twin tells them apart: recording the key
again settles it). GPT-NeoX's parallel residual and BERT's post-norm blocks sum at their norm
node on any device and are never listed:

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


# The node whose input gradient is a norm's: where a hook that held the residual's gradient
# made the layer's residual sum out of place. RMSNorm ends in a multiply by its weight, after a
# cast back to bf16 where it computes in fp32 (Gemma's: `type_as`); T5's casts before the multiply.
LAYER_NORM = {"gpt2", "bloom"}
OWN_NORM_SUMS = {"gpt_neox", "bert"}


def norm_site(family, precision):
    if family in OWN_NORM_SUMS:
        return None
    if family in LAYER_NORM:
        return "NativeLayerNormBackward0"
    return "ToCopyBackward0" if precision == "bf16" and family != "t5" else "MulBackward0"


# The first node of a checkpointed layer's backward, inside which the recomputed forward's
# adds of hidden states (the first residual add, peft's adapters' sums) are made. GPT-2's
# checkpointed LoRA keys recorded under the present marks keep two `NativeLayerNormBackward0`
# adds a layer too (not traced), so its norm's site is the recomputation's as well.
RECOMPUTE_SITE = {
    "gemma2": ("MulBackward0",), "gemma3_text": ("MulBackward0",), "t5": ("MulBackward0",),
    "gpt2": ("MulBackward0", "NativeLayerNormBackward0"), "qwen2_moe": ("MulBackward0",),
    "mixtral": ("IndexBackward0",), "qwen3_moe": ("IndexBackward0",),
}


def per_layer(by_layer, node):
    """The most adds a layer (of the layers marked) whose site's node is `node`."""
    counts = [sum(c for s, c in by_layer[n].items() if s.rpartition(" > ")[0].endswith(": " + node))
              for n in by_layer if n >= 0]
    return max(counts, default=0)


def recorder_sums(key, templates):
    """The recorder's residual sums a layer in `templates[key]`: an int, or None where the
    recomputation's adds share the norm's site and no twin tells how many are the recomputation's."""
    family, _, precision = key.split("/")[:3]
    site = norm_site(family, precision)
    by_layer = backward_adds(templates[key])
    if site is None or by_layer is None:
        return 0
    n = per_layer(by_layer, site)
    if "/ckpt" not in key or site not in RECOMPUTE_SITE.get(family, ("MmBackward0",)) or not n:
        return n
    for other in ("bf16", "fp32"):
        twin = key.replace(f"/{precision}/", f"/{other}/", 1).replace("/sdpa-math/", "/sdpa/")
        for twin in (twin, twin.replace("/sdpa/", "/sdpa-math/")):
            if twin != key and twin in templates and norm_site(family, other) != site:
                return n - per_layer(backward_adds(templates[twin]), site)
    return None


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
                n = recorder_sums(key, templates)
                if n is None or n > 0:
                    print(f"{os.path.basename(path)}\t{key}\t{'?' if n is None else n} a layer")
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

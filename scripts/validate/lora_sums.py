#!/usr/bin/env python3
"""The LoRA keys whose recorded backward holds a residual sum out of place beyond the engine's
own, ranked for recording again: first the keys `lora_truth`'s CPU cases replay
(`data/validation/lora_cpu_truth.json`), then the popular families', then the rest.

A sum out of place is `backward_adds.py`'s (an `XBackward0 > aten::add` of two hidden states in a
layer's backward). At a norm's input-gradient node (`MulBackward0` for RMSNorm in fp32 and AMP,
`ToCopyBackward0` in bf16, `NativeLayerNormBackward0` for LayerNorm) it is the recorder's hooks'
unless it is one the engine makes with no hook (docs/VALIDATION.md, "The residual sums recorded
in place in the other templates"): under checkpointing the recomputed forward's residual add,
run as the layer's first backward node unpacks a saved tensor (GPT-2's, Gemma-2's, Gemma 3's and
T5's at `MulBackward0`, once a layer, twice with every linear layer's adapters, Gemma 3's three
times and GPT-2's at fp32 four, as their recordings under the new marks make them; BERT's post-norm
blocks twice at `NativeLayerNormBackward0`, seven times with every linear layer's adapters, as
its fp32 eager key recorded again keeps them), and GPT-NeoX's parallel residual outside autocast
(`NativeLayerNormBackward0`, once a layer). `ViewBackward0` sums are the engine's everywhere.
What this counts is the adds beyond those, a layer: a key listed with none was recorded with
no hook's sum, or one this rule does not tell from the engine's (recording it again settles it).

    python3 scripts/validate/lora_sums.py data/programs/hf-lora-fp32.tpl [FILE ...] [--all]
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import backward_adds  # noqa: E402
import template_file  # noqa: E402

NORM_NODES = ("MulBackward0", "ToCopyBackward0", "NativeLayerNormBackward0")
POPULAR = ("llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "gemma3_text", "phi3")
TASKS = {"bert": "masked-lm", "t5": "seq2seq-lm"}
CASES = os.path.join(os.path.dirname(__file__), "../../data/validation/lora_cpu_truth.json")


def own(key, node):
    """The sums a layer the engine makes itself at `node` for `key`."""
    family, _, precision, _, ckpt = key.split("/")[:5]
    all_linear = key.endswith("/lora-all")
    if ckpt == "ckpt" and node == "MulBackward0" and family in ("gpt2", "gemma2", "gemma3_text", "t5"):
        if not all_linear:
            return 1
        return 3 if family == "gemma3_text" else 4 if (family, precision) == ("gpt2", "fp32") else 2
    if node == "NativeLayerNormBackward0":
        if family == "bert" and ckpt == "ckpt":
            return 7 if all_linear else 2
        if family == "gpt_neox" and not precision.startswith("amp"):
            return 1
    return 0


def hook_sums(key, t):
    """{site: count} of the sums beyond the engine's own, over the backward's layers."""
    by_layer = backward_adds.backward_adds(t) or {}
    extra = {}
    for n, sites in by_layer.items():
        if n < 0:
            continue
        for site, count in sites.items():
            node = site.rpartition(" > ")[0].rpartition(": ")[2]
            if node in NORM_NODES:
                beyond = count - own(key, node)
                if beyond > 0:
                    extra[node] = extra.get(node, 0) + beyond
    return extra


def case_keys():
    """The template keys `lora_truth`'s cases replay."""
    keys = set()
    for c in json.load(open(CASES))["cases"]:
        f = c["family"]
        gated = "/gated" if (c.get("variant") or "").startswith("v1.1") else ""
        ck = "ckpt" if c["checkpointing"] else "full"
        keys.add(f"{f}/{TASKS.get(f, 'causal-lm')}/{c['precision']}/{c['attention']}/{ck}{gated}/lora-{c['targets']}")
    return keys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--all", action="store_true", help="list keys with no such sum too")
    args = ap.parse_args()
    tested = case_keys()
    rows = []
    for path in args.files:
        for key, t in template_file.read(path)["templates"].items():
            if "error" in t:
                continue
            extra = hook_sums(key, t)
            if not extra and not args.all:
                continue
            rank = 0 if key in tested else 1 if key.split("/")[0] in POPULAR else 2
            rows.append((rank, os.path.basename(path), key, extra))
    for rank, name, key, extra in sorted(rows):
        sites = ", ".join(f"{s} x{c}" for s, c in sorted(extra.items())) or "none"
        print(f"{('cpu-case', 'popular', 'other')[rank]}\t{name}\t{key}\t{sites}")


if __name__ == "__main__":
    main()

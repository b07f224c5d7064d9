#!/usr/bin/env python3
"""The keys whose recorded backward holds a residual sum out of place beyond the engine's
own, ranked for recording again: first the keys `lora_truth`'s CPU cases replay
(`data/validation/lora_cpu_truth.json`), then the popular families', then the rest.

A sum out of place is `backward_adds.py`'s (an `XBackward0 > aten::add` of two hidden states in a
layer's backward), and the old marks' are those `backward_adds.marks_sums` takes, the rule
`backward_adds.py --recorder` lists by too: the adds at the nodes where a hook that held a
layer's gradient made the residual sum (the norm's input-gradient node, and BERT's peft casts at
bf16), beyond those the engine makes there itself (docs/VALIDATION.md, "Qwen2-MoE's router
histogram and one scan for the layer marks' sums"). Keys without adapters are scanned the same.

    python3 scripts/validate/lora_sums.py data/programs/hf-lora-fp32.tpl [FILE ...] [--all]
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import backward_adds  # noqa: E402
import template_file  # noqa: E402

POPULAR = ("llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "gemma3_text", "phi3")
TASKS = {"bert": "masked-lm", "t5": "seq2seq-lm"}
CASES = os.path.join(os.path.dirname(__file__), "../../data/validation/lora_cpu_truth.json")


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
            extra = backward_adds.marks_sums(key, t)
            if not extra and not args.all:
                continue
            rank = 0 if key in tested else 1 if key.split("/")[0] in POPULAR else 2
            rows.append((rank, os.path.basename(path), key, extra))
    for rank, name, key, extra in sorted(rows):
        sites = ", ".join(f"{s} x{c}" for s, c in sorted(extra.items())) or "none"
        print(f"{('cpu-case', 'popular', 'other')[rank]}\t{name}\t{key}\t{sites}")


if __name__ == "__main__":
    main()

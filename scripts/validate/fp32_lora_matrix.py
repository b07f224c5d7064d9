#!/usr/bin/env python3
"""The fp32 LoRA matrix (docs/VALIDATION.md, "The fp32 LoRA matrix"): every job of 36 models
(the presets, the Hub configs of `data/models/` a preset family serves, Gemma-2-9B's and
Qwen3-30B-A3B's config.json) planned on one H200 at 1 x 256 with `--finetune lora --precision
fp32`, each target (`all`, `qv`), checkpointing (`none`, `full`) and attention (`sdpa`, `eager`):
288 jobs, each plan's `program:` line read. Prints how many passed to Megatron's closed form,
by attention, and the templates those asked for.

    HEADROOM_BIN=target/debug/headroom python3 scripts/validate/fp32_lora_matrix.py [--jobs]
"""

import argparse
import collections
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
# The Hub configs of `data/models/` whose families have presets (the course's cs336 configs and
# OctoCoder's, a family with no training template, left out).
CONFIGS = ["gemma-3-1b.json", "llama-3.2-1b.json", "qwen1.5-moe-a2.7b.json", "qwen3-1.7b.json"]
# google/gemma-2-9b's and Qwen/Qwen3-30B-A3B's config.json, the fields the planner reads
# (crates/headroom-plan/src/builders/hf/adapters.rs): no preset ships either family.
HUB = {
    "gemma-2-9b": {"model_type": "gemma2", "hidden_size": 3584, "num_hidden_layers": 42, "num_attention_heads": 16,
                   "num_key_value_heads": 8, "head_dim": 256, "intermediate_size": 14336, "vocab_size": 256000,
                   "max_position_embeddings": 8192, "sliding_window": 4096, "query_pre_attn_scalar": 256},
    "qwen3-30b-a3b": {"model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48,
                      "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                      "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
                      "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
                      "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": False},
}


def presets(binary):
    """The presets `plan` names when asked for one it does not know."""
    err = subprocess.run([binary, "plan", "--model", "no-such-model", "--gpu", "h200"], capture_output=True,
                         text=True).stderr
    return re.search(r"known presets: (.*)", err).group(1).split(", ")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", action="store_true", help="print each job's program line")
    args = ap.parse_args()
    binary = os.environ.get("HEADROOM_BIN", os.path.join(REPO, "target", "debug", "headroom"))
    with tempfile.TemporaryDirectory() as tmp:
        models = [(p, p) for p in presets(binary)]
        models += [(c.removesuffix(".json"), os.path.join(REPO, "data", "models", c)) for c in CONFIGS]
        for name, cfg in HUB.items():
            path = os.path.join(tmp, f"{name}.json")
            with open(path, "w") as f:
                json.dump(cfg, f)
            models.append((name, path))
        closed = collections.Counter()
        asked = collections.Counter()
        total = 0
        for (name, model), targets, ckpt, attention in itertools.product(models, ("all", "qv"), ("none", "full"),
                                                                         ("sdpa", "eager")):
            out = subprocess.run([binary, "plan", "--model", model, "--gpu", "h200", "--batch", "1", "--seq", "256",
                                  "--finetune", "lora", "--precision", "fp32", "--lora-targets", targets,
                                  "--checkpoint", ckpt, "--attention", attention], capture_output=True, text=True)
            line = next((x for x in out.stdout.splitlines() if x.startswith("program:")), out.stderr.strip())
            total += 1
            if args.jobs:
                print(name, targets, ckpt, attention, line[:160])
            if line.startswith("program: megatron"):
                closed[attention] += 1
                key = re.search(r"`([^`]*)`", line)
                asked[key.group(1) if key else line] += 1
    print(f"{len(models)} models, {total} jobs; closed form: {sum(closed.values())} "
          f"({closed['sdpa']} with SDPA, {closed['eager']} eager)")
    for key, n in sorted(asked.items()):
        print(f"  {n:3d}  {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

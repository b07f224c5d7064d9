#!/usr/bin/env python3
"""CPU ground truth for the model types recorded after `measure.py`'s grid (Qwen2-MoE,
Gemma 3's text model, T5 v1.0): real training steps measured as `measure.py` measures them
(`measure.train_case`: the step's peak of live tensor bytes and each phase's), on configs and
shapes none of the recordings used — other widths, heads, experts and depths than
`step_programs.py`'s recording configs, and batch x sequence other than 2x56, 2x88 and 3x56.
Every case is a check case: nothing was read from them before the templates were recorded.

    .venv/bin/python scripts/validate/family_checks.py --out data/validation/cpu_family_checks.json

`--variants` measures instead the precisions, kernels and checkpointing recorded into
`data/programs/hf-variants.tpl` (eager attention in bf16 with checkpointing and without, AMP,
checkpointed fp32, fp32 with SDPA's fused kernel), a sample of its keys, each on a config of six
layers or more (`measure.py`'s `deep` configs, T5 v1.0's `T5_V1`, or one of its own for the model
types that grid does not build) at a shape no recording used:

    .venv/bin/python scripts/validate/family_checks.py --variants --out data/validation/cpu_variant_checks.json

`--only` measures the named cases alone — a model type (`t5`: here T5 v1.0's, `T5_V1`) or cases
(`family/precision/attention/ckpt|full`), comma-separated — and keeps the file's other cases:

    .venv/bin/python scripts/validate/family_checks.py --only t5 --out data/validation/cpu_family_checks.json
    .venv/bin/python scripts/validate/family_checks.py --variants --only qwen3/bf16/eager/ckpt --out data/validation/cpu_variant_checks.json

`cargo test -p headroom-plan --test family_templates` compares the templates' CPU replay with
each case (`crates/headroom-plan/tests/family_templates.rs`).
"""

import argparse
import json
import platform
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import measure  # noqa: E402

# Six and seven layers, other widths than the recordings' (step_programs.config): Qwen2-MoE
# with 6 experts of 160, 2 a token, a shared expert 320 wide; Gemma 3 with its own five
# sliding layers to one global, a window shorter than the sequences.
CONFIGS = {
    "qwen2_moe": dict(model_type="qwen2_moe", hidden_size=192, num_hidden_layers=6, num_attention_heads=6,
                      num_key_value_heads=2, head_dim=32, intermediate_size=512, moe_intermediate_size=160,
                      shared_expert_intermediate_size=320, num_experts=6, num_experts_per_tok=2,
                      decoder_sparse_step=1, mlp_only_layers=[], vocab_size=5000, max_position_embeddings=2048,
                      tie_word_embeddings=False, use_sliding_window=False),
    "gemma3_text": dict(model_type="gemma3_text", hidden_size=192, num_hidden_layers=7, num_attention_heads=4,
                        num_key_value_heads=1, head_dim=64, intermediate_size=768, vocab_size=5000,
                        max_position_embeddings=2048, sliding_window=64, query_pre_attn_scalar=64),
}
SHAPES = {"fp32": ((2, 192), (1, 320)), "bf16": ((1, 192),)}

# T5 v1.0 (one ReLU projection in, tied: t5-base's kind), recorded so since `measure.py`'s T5
# (v1.1's gated MLP) was measured: its `deep` config, four blocks a stack, with v1.0's MLP;
# eager (transformers' T5 has no SDPA path), each of the four recorded keys.
T5_V1 = dict(measure.small_configs()[("t5", "deep")], feed_forward_proj="relu")
T5_CASES = (("fp32", False, 2, 192), ("fp32", True, 2, 192), ("bf16", False, 1, 192), ("bf16", True, 1, 192))

# The model type `measure.py` does not build that the sample takes, at six layers and widths
# of its own: Gemma-2 with its sliding window as Gemma-2's presets have it (4096, longer than
# the sequences).
VARIANT_CONFIGS = {
    "gemma2": dict(model_type="gemma2", hidden_size=192, num_hidden_layers=6, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=64, intermediate_size=768, vocab_size=5000,
                   max_position_embeddings=2048, sliding_window=4096, query_pre_attn_scalar=64),
}
# (family, precision, attention, checkpointing, batch, seq): 16-bit steps at one sequence of
# 160 (a CPU's 16-bit matrix multiplies are slow), fp32 at 2 x 144.
VARIANTS = (
    ("mistral", "bf16", "eager", True, 1, 160),
    ("gpt2", "bf16", "eager", True, 1, 160),
    ("gpt_neox", "bf16", "eager", True, 1, 160),
    ("gemma2", "amp", "eager", False, 1, 160),
    ("bloom", "amp", "eager", False, 1, 160),
    ("qwen2_moe", "amp", "sdpa", False, 1, 160),
    ("gemma2", "fp32", "eager", True, 2, 144),
    ("qwen3", "bf16", "eager", True, 1, 160),
    ("gemma", "bf16", "eager", True, 1, 160),
    ("gemma", "fp32", "eager", False, 2, 144),
    ("bert", "bf16", "sdpa", True, 1, 160),
    ("gemma3_text", "amp", "sdpa", False, 1, 160),
    ("gemma3_text", "fp32", "sdpa", True, 2, 144),
    ("qwen2_moe", "fp32", "sdpa", True, 2, 144),
    ("gemma", "fp32", "sdpa", False, 2, 144),
    ("mixtral", "bf16", "eager", False, 1, 160),
    ("bert", "bf16", "eager", False, 1, 160),
    ("qwen2_moe", "fp32", "eager", False, 2, 144),
    ("gemma3_text", "bf16", "eager", False, 1, 160),
    ("t5", "amp", "eager", False, 1, 160),
    ("t5", "amp", "eager", True, 1, 160),
    # Full fine-tuning's last gaps, chosen before the templates were recorded: eager AMP with
    # and without checkpointing, checkpointed eager fp32, checkpointed AMP with SDPA,
    # checkpointed eager bf16 (BERT, Mixtral).
    ("llama", "amp", "eager", False, 1, 160),
    ("llama", "amp", "eager", True, 1, 160),
    ("mistral", "amp", "eager", True, 1, 160),
    ("qwen2", "amp", "eager", False, 1, 160),
    ("mixtral", "amp", "eager", False, 1, 160),
    ("phi3", "amp", "eager", True, 1, 160),
    ("gemma", "amp", "eager", False, 1, 160),
    ("gpt2", "amp", "eager", False, 1, 160),
    ("gpt_neox", "amp", "eager", True, 1, 160),
    ("bert", "amp", "eager", False, 1, 160),
    ("bloom", "amp", "eager", True, 1, 160),
    ("llama", "fp32", "eager", True, 2, 144),
    ("qwen2", "fp32", "eager", True, 2, 144),
    ("gpt2", "fp32", "eager", True, 2, 144),
    ("gemma", "amp", "sdpa", True, 1, 160),
    ("gpt_neox", "amp", "sdpa", True, 1, 160),
    ("bert", "amp", "sdpa", True, 1, 160),
    ("bert", "bf16", "eager", True, 1, 160),
    ("mixtral", "bf16", "eager", True, 1, 160),
)


def cases():
    for family in CONFIGS:
        for precision, shapes in SHAPES.items():
            for batch, seq in shapes:
                yield dict(mode="train", family=family, size="check", head="causal-lm", precision=precision,
                           optimizer="adamw", attention="sdpa", checkpointing=False, batch=batch, seq=seq,
                           split="check")
    for precision, checkpointing, batch, seq in T5_CASES:
        yield dict(mode="train", family="t5", size="check", head="seq2seq-lm", precision=precision,
                   optimizer="adamw", attention="eager", checkpointing=checkpointing, batch=batch, seq=seq,
                   split="check")


def variant_cases():
    deep = measure.small_configs()
    # Qwen3 as Qwen2's deep config with Qwen3's code (its queries' and keys' norms).
    deep[("qwen3", "deep")] = {**deep[("qwen2", "deep")], "model_type": "qwen3"}
    for family, precision, attention, checkpointing, batch, seq in VARIANTS:
        # T5 as its v1.0 check config (`T5_V1`), as the templates without `/gated` record it.
        config = CONFIGS.get(family) or VARIANT_CONFIGS.get(family) or (T5_V1 if family == "t5" else None) \
            or deep[(family, "deep")]
        head = {"bert": "masked-lm", "t5": "seq2seq-lm"}.get(family, "causal-lm")
        yield config, dict(mode="train", family=family, size="check", head=head, precision=precision,
                           optimizer="adamw", attention=attention, checkpointing=checkpointing, batch=batch,
                           seq=seq, split="check")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--variants", action="store_true",
                    help="measure the cases of data/programs/hf-variants.tpl's keys instead")
    ap.add_argument("--only", help="comma-separated model types or cases (family/precision/attention/ckpt|full) "
                                   "measured into --out in place of theirs, the file's other cases kept")
    a = ap.parse_args()
    torch.set_num_threads(1)
    start = time.time()
    results = []
    chosen = variant_cases() if a.variants else ((T5_V1 if c["family"] == "t5" else CONFIGS[c["family"]], c)
                                                 for c in cases())
    if a.only:
        only = set(a.only.split(","))

        def named(c):
            name = f"{c['family']}/{c['precision']}/{c['attention']}/{'ckpt' if c['checkpointing'] else 'full'}"
            return name in only or c["family"] in only

        with open(a.out) as f:
            kept = json.load(f)
        start -= kept["seconds"]  # the file's time, the cases kept included
        kept = kept["cases"]
        chosen = [(cfg, c) for cfg, c in chosen if named(c)]
        results = [c for c in kept if not named(c)]
    about = ("CPU ground truth for hf-variants.tpl's keys" if a.variants
             else "CPU ground truth for the model types recorded since")

    def write():
        out = {"about": f"{about}: scripts/validate/family_checks.py",
               "torch": torch.__version__, "transformers": __import__("transformers").__version__,
               "python": platform.python_version(), "seconds": round(time.time() - start, 1), "cases": results}
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")

    for cfg, c in chosen:
        r = measure.train_case(c["family"], cfg, c["head"], c["precision"], c["optimizer"], c["attention"],
                               c["checkpointing"], c["batch"], c["seq"])
        results.append({**c, "config": cfg, **r})
        print(f"{c} -> {r['peak_bytes']}", file=sys.stderr, flush=True)
        if a.only:
            write()
    write()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Time one transformer layer's forward and backward on this GPU and compare them with
`headroom plan`'s kernel model (`layer_time_s` in `--json`).

A layer's time is measured as the difference between the same Hugging Face model built
from its config (random weights: nothing is downloaded) with few and with more layers,
so the embedding, the logits and the loss cancel. Forward and backward are timed with
CUDA events after warm-up steps, bf16 weights, SDPA attention, over a grid of batch and
sequence; the plan is asked for the same shape on the GPU it names. Prints a markdown
table for docs/GPU.md.

    cargo build --release -p headroom-cli
    python3 scripts/gpu/layer_time.py [--headroom target/release/headroom] [--gpu h100-sxm]

Needs torch with CUDA and transformers. Without a GPU it says so and exits 2.
"""

import argparse
import json
import os
import subprocess
import tempfile

import gpu_env

# Layer shapes of models the planner knows, as config.json fields (few layers; the
# count is set per run).
CONFIGS = {
    "llama-3-8b": {
        "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
        "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192,
    },
    "gpt2-xl": {"model_type": "gpt2", "n_embd": 1600, "n_head": 25, "n_positions": 8192, "vocab_size": 50257},
}

# torch.cuda.get_device_name() fragments and the catalog names they map to.
GPUS = [("H200", "h200"), ("H100 PCIe", "h100-pcie"), ("H100", "h100-sxm"), ("A100-SXM4-40GB", "a100-40gb"),
        ("A100", "a100-80gb"), ("L40S", "l40s"), ("L4", "l4"), ("A10", "a10"), ("T4", "t4")]


def fail(msg):
    gpu_env.fail("layer_time", msg)


def timed(torch, transformers, cfg, layers, batch, seq, steps=10, warmup=3):
    """Mean forward and backward seconds of the model with `layers` layers."""
    key = "n_layer" if cfg["model_type"] == "gpt2" else "num_hidden_layers"
    config = transformers.AutoConfig.for_model(**{**cfg, key: layers})
    config._attn_implementation = "sdpa"
    model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16).cuda().train()
    tokens = torch.randint(0, cfg["vocab_size"], (batch, seq), device="cuda")
    start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    fwd = bwd = 0.0
    for i in range(warmup + steps):
        start.record()
        loss = model(input_ids=tokens, labels=tokens).loss
        mid.record()
        loss.backward()
        end.record()
        torch.cuda.synchronize()
        model.zero_grad(set_to_none=True)
        if i >= warmup:
            fwd += start.elapsed_time(mid) / 1e3
            bwd += mid.elapsed_time(end) / 1e3
    del model, tokens
    torch.cuda.empty_cache()
    return fwd / steps, bwd / steps


def predict(headroom, path, gpu, batch, seq):
    cmd = [headroom, "plan", "--model", path, "--gpu", gpu, "--train", "--batch", str(batch), "--seq", str(seq),
           "--precision", "bf16", "--attention", "sdpa", "--framework", "hf", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode == 2:
        fail(f"{' '.join(cmd)}: {out.stderr.strip()}")
    t = json.loads(out.stdout)["layer_time_s"]
    return t["forward"], t["backward"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--headroom", default="target/release/headroom")
    ap.add_argument("--gpu", help="the catalog name of this GPU (default: from its device name)")
    args = ap.parse_args()
    torch, transformers = gpu_env.require("layer_time", args.headroom, "times real kernels")
    name = torch.cuda.get_device_name()
    gpu = args.gpu or next((g for frag, g in GPUS if frag in name), None)
    if gpu is None:
        fail(f"{name} is not in the catalog's list here; name it with --gpu")
    print(f"{name} as {gpu}, torch {torch.__version__}, transformers {transformers.__version__}\n")
    print("| model | batch × seq | forward measured | forward planned | error | backward measured | backward planned | error |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    few, more = 2, 6
    with tempfile.TemporaryDirectory() as tmp:
        for label, cfg in CONFIGS.items():
            path = os.path.join(tmp, label, "config.json")
            os.makedirs(os.path.dirname(path))
            key = "n_layer" if cfg["model_type"] == "gpt2" else "num_hidden_layers"
            with open(path, "w") as f:
                json.dump({**cfg, key: more}, f)
            for batch, seq in [(1, 2048), (1, 8192), (4, 2048)]:
                (f0, b0), (f1, b1) = (timed(torch, transformers, cfg, n, batch, seq) for n in (few, more))
                fm, bm = (f1 - f0) / (more - few), (b1 - b0) / (more - few)
                fp, bp = predict(args.headroom, path, gpu, batch, seq)
                print(f"| {label} | {batch} × {seq} | {fm * 1e3:.2f} ms | {fp * 1e3:.2f} ms | {fp / fm - 1:+.1%} "
                      f"| {bm * 1e3:.2f} ms | {bp * 1e3:.2f} ms | {bp / bm - 1:+.1%} |", flush=True)


if __name__ == "__main__":
    main()

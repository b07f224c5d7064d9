#!/usr/bin/env python3
"""Measure real training peaks and compare them with `headroom plan`.

Runs Hugging Face models built from their configs (random weights: nothing is
downloaded) over a grid of batch, sequence, precision and checkpointing, on the
GPU this machine has. Each run does three optimizer steps of AdamW on random
tokens and records torch.cuda.max_memory_allocated() and max_memory_reserved() (or
that it ran out of memory), then asks `headroom plan --json` for the same
configuration and prints a markdown table of predicted (`allocated_bytes`,
`reserved_bytes`, `fits`: the job's step program replayed through headroom's
allocator) against measured, for docs/GPU.md.

    cargo build --release -p headroom-cli
    python3 scripts/gpu/validate_plan.py [--headroom target/release/headroom] [--quick] [--compile]

With --compile each step runs through torch.compile(model) and the plan is asked with
--compile (what the compiled graphs keep, recorded on CPU for decoders at fp32, bf16 and AMP).

Needs torch with CUDA and transformers. Without a GPU it says so and exits 2.
"""

import argparse
import itertools
import json
import os
import subprocess
import tempfile

import gpu_env

# Small and mid-sized members of the families the planner reads, as config.json fields.
CONFIGS = {
    "llama-1b": {
        "model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 128256,
        "max_position_embeddings": 8192, "tie_word_embeddings": True,
    },
    "qwen2-0.5b": {
        "model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
        "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936,
        "max_position_embeddings": 32768, "tie_word_embeddings": True,
    },
    "gpt2-medium": {
        "model_type": "gpt2", "n_embd": 1024, "n_layer": 24, "n_head": 16, "n_positions": 4096,
        "vocab_size": 50257,
    },
}

# (headroom --precision, torch dtype of the weights, autocast)
PRECISIONS = {"bf16": ("bfloat16", False), "fp32": ("float32", False), "amp": ("float32", True)}


def fail(msg):
    gpu_env.fail("validate_plan", msg)


def measure(torch, transformers, cfg, batch, seq, precision, checkpoint, compiled=False):
    dtype_name, autocast = PRECISIONS[precision]
    dtype = getattr(torch, dtype_name)
    config = transformers.AutoConfig.for_model(**cfg)
    config._attn_implementation = "sdpa"
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=dtype)
    if checkpoint == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    tokens = torch.randint(0, cfg["vocab_size"], (batch, seq), device="cuda")
    if compiled:
        torch._dynamo.reset()
    forward = torch.compile(model, dynamic=False) if compiled else model
    try:
        for _ in range(3):
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                loss = forward(input_ids=tokens, labels=tokens).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())
    except torch.cuda.OutOfMemoryError:
        peak = None
    del model, forward, opt, tokens
    torch.cuda.empty_cache()
    return peak


def predict(headroom, path, gpu_memory, batch, seq, precision, checkpoint, compiled=False):
    cmd = [headroom, "plan", "--model", path, "--gpu", "h100-sxm", "--gpu-memory", str(gpu_memory),
           "--train", "--batch", str(batch), "--seq", str(seq), "--precision", precision,
           "--attention", "sdpa", "--checkpoint", checkpoint, "--json"] + (["--compile"] if compiled else [])
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode == 2:
        fail(f"{' '.join(cmd)}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--headroom", default="target/release/headroom")
    ap.add_argument("--quick", action="store_true", help="one model, a small grid")
    ap.add_argument("--compile", action="store_true", help="torch.compile'd steps against plan --compile")
    args = ap.parse_args()
    torch, transformers = gpu_env.require("validate_plan", args.headroom, "measures real peaks")
    total = torch.cuda.mem_get_info()[1]
    name = torch.cuda.get_device_name()
    models = dict(itertools.islice(CONFIGS.items(), 1)) if args.quick else CONFIGS
    grid = list(itertools.product([1, 4], [512, 2048], ["bf16", "fp32", "amp"], ["none", "full"]))
    if args.quick:
        grid = grid[::3]
    print(f"{name}, {total / 2**30:.1f} GiB, torch {torch.__version__}, transformers {transformers.__version__}\n")
    print("| model | batch × seq | precision | checkpoint | allocated | planned | error | reserved | planned | error | verdict |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---|")
    errors, reserved_errors, verdicts = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for label, cfg in models.items():
            path = os.path.join(tmp, label, "config.json")
            os.makedirs(os.path.dirname(path))
            with open(path, "w") as f:
                json.dump(cfg, f)
            for batch, seq, precision, checkpoint in grid:
                peak = measure(torch, transformers, cfg, batch, seq, precision, checkpoint, args.compile)
                plan = predict(args.headroom, path, total, batch, seq, precision, checkpoint, args.compile)
                predicted, reserved = plan["allocated_bytes"], plan["reserved_bytes"]
                gib = lambda b: f"{b / 2**30:.2f} GiB"
                ran = peak is not None
                verdicts.append(ran == plan["fits"])
                verdict = f"{'ran' if ran else 'OOM'}, plan: {'fits' if plan['fits'] else 'does NOT fit'}"
                if not ran:
                    row = ("OOM", gib(predicted), "–", "–", gib(reserved), "–")
                else:
                    err = predicted / peak[0] - 1
                    rerr = reserved / peak[1] - 1
                    errors.append(abs(err))
                    reserved_errors.append(abs(rerr))
                    row = (gib(peak[0]), gib(predicted), f"{err:+.1%}", gib(peak[1]), gib(reserved), f"{rerr:+.1%}")
                print(f"| {label} | {batch} × {seq} | {precision} | {checkpoint} | " + " | ".join(row) + f" | {verdict} |",
                      flush=True)
    if errors:
        for name, errs in (("allocated", errors), ("reserved", reserved_errors)):
            within = sum(e <= 0.05 for e in errs)
            print(f"\n{name}: {within} of {len(errs)} within 5%; mean |error| {sum(errs) / len(errs):.1%}, "
                  f"worst {max(errs):.1%}")
    print(f"verdicts right: {sum(verdicts)} of {len(verdicts)}")


if __name__ == "__main__":
    main()

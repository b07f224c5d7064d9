#!/usr/bin/env python3
"""Measure transformers' `generate` on the GPU and compare it with `headroom plan --infer
--framework hf`, before and after its recorded programs.

Runs validate_plan.py's models (built from their configs on the GPU, random weights, nothing
downloaded) through `model.generate(ids, attention_mask, max_new_tokens=N, min_new_tokens=N,
do_sample=False)` with SDPA, each job in a process of its own, and records
`torch.cuda.max_memory_allocated()` and `max_memory_reserved()` after `reset_peak_memory_stats()`
(the model built first, as the plan's setup). Then asks each headroom binary given for the
same job (`--json`: `allocated_bytes`, `reserved_bytes`) and prints a markdown table, one row a
job and binary, for docs/VALIDATION.md. Every row is a check row: nothing in the planner was
fitted to these jobs.

    cargo build --release -p headroom-cli
    python3 scripts/gpu/validate_infer.py --headroom target/release/headroom --before /path/to/headroom-main
    python3 scripts/gpu/validate_infer.py --headroom target/release/headroom --weights int4

`--weights int4`: the same models over bitsandbytes' 4-bit layers, loaded as
`from_pretrained(..., quantization_config=BitsAndBytesConfig(load_in_4bit=True,
bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16))`
loads them (`headroom_gpu.qlora.build` and `load` on the GPU: each weight arriving in bf16 and
quantized by bitsandbytes' CUDA kernels), planned with `--quantize nf4 --double-quant
--compute-dtype bf16` (the `…/nf4` templates, whose prompt's forward was recorded on
bitsandbytes' dequantize-then-matmul path: the measured peak says whether the GPU took it).

Needs torch with CUDA and transformers. Without a GPU it says so and exits 2.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import gpu_env
from validate_plan import CONFIGS

# (model, dtype, batch, prompt, new tokens)
JOBS = [
    ("llama-1b", "bf16", 1, 512, 64),
    ("llama-1b", "bf16", 4, 2048, 128),
    ("qwen2-0.5b", "bf16", 8, 1024, 256),
    ("gpt2-medium", "bf16", 4, 1024, 64),
    ("gpt2-medium", "fp32", 2, 1024, 64),
    # fp32 with grouped key-value heads: SDPA's math path (the `sdpa-math` templates), the
    # backend PyTorch picks reported beside the peaks.
    ("llama-1b", "fp32", 2, 1024, 64),
    ("qwen2-0.5b", "fp32", 4, 1024, 64),
]
# bitsandbytes' NF4 layers (`--weights int4`): a decode step of up to 4 sequences on its fused
# kernel, and of 8 (past its floor, its heuristic's choice).
INT4_JOBS = [
    ("llama-1b", "nf4", 1, 512, 64),
    ("llama-1b", "nf4", 4, 2048, 128),
    ("qwen2-0.5b", "nf4", 8, 1024, 256),
]


def measure(name, dtype, batch, prompt, new_tokens):
    """Runs in a process of its own: (peak allocated, peak reserved), or an error."""
    code = f"""
import json, torch, transformers
cfg = {CONFIGS[name]!r}
fields = dict(cfg); mt = fields.pop("model_type")
config = transformers.AutoConfig.for_model(mt, **fields)
if {dtype!r} == "nf4":
    import sys
    sys.path.insert(0, "python")
    from headroom_gpu import qlora
    model = qlora.load(qlora.build(config, "sdpa", model_head="causal-lm"), device="cuda")
else:
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa",
                                                              dtype=torch.{ {"bf16": "bfloat16", "fp32": "float32", "nf4": "bfloat16"}[dtype]})
model.eval(); model.generation_config.pad_token_id = 0
ids = torch.randint(0, config.vocab_size, ({batch}, {prompt}), device="cuda")
mask = torch.ones_like(ids)
# The SDPA backend a layer's call gets (no mask, so transformers passes enable_gqa where the
# key-value heads are grouped): torch._fused_sdp_choice's ids are 0 math, 1 flash, 2 efficient, 3 cuDNN.
h = config.num_attention_heads
kv = getattr(config, "num_key_value_heads", None) or h
d = getattr(config, "head_dim", None) or config.hidden_size // h
q = torch.empty(1, h, 8, d, device="cuda", dtype=model.dtype)
k = torch.empty(1, kv, 8, d, device="cuda", dtype=model.dtype)
backend = ["math", "flash", "efficient", "cudnn", "overrideable"][torch._fused_sdp_choice(
    q, k, k, is_causal=True, enable_gqa=kv < h)]
del q, k
torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens={new_tokens}, min_new_tokens={new_tokens},
                     do_sample=False)
torch.cuda.synchronize()
print(json.dumps({{"allocated": torch.cuda.max_memory_allocated(), "reserved": torch.cuda.max_memory_reserved(),
                  "sdpa": backend}}))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


def predict(headroom, path, gpu_memory, dtype, batch, prompt, new_tokens):
    args = [headroom, "plan", "--model", path, "--gpu", "h200", "--gpu-memory", str(gpu_memory), "--infer",
            "--framework", "hf", "--weights", "bf16" if dtype == "nf4" else dtype, "--batch", str(batch), "--seq", str(prompt), "--json"]
    if dtype == "nf4":
        # Before --json, which the fallback below keeps last but for --new-tokens.
        args[-1:-1] = ["--quantize", "nf4", "--double-quant", "--compute-dtype", "bf16"]
    if new_tokens > 1:
        args += ["--new-tokens", str(new_tokens)]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode > 1:
        # A binary without --new-tokens plans generate's first forward (the closed form's).
        r = subprocess.run(args[:-2] if new_tokens > 1 else args, capture_output=True, text=True)
    if r.returncode > 1:
        return {"error": r.stderr.strip()}
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--headroom", default="target/release/headroom")
    ap.add_argument("--before", help="a headroom binary of the planner before (the closed form)")
    ap.add_argument("--out", default="infer-gpu.json")
    ap.add_argument("--weights", choices=("16", "int4"), default="16",
                    help="16: JOBS (bf16 and fp32); int4: INT4_JOBS, over bitsandbytes' NF4 layers")
    args = ap.parse_args()
    torch, _ = gpu_env.require("validate_infer", args.headroom, "measures generate on the GPU")
    gpu_memory = torch.cuda.get_device_properties(0).total_memory
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, dtype, batch, prompt, new_tokens in INT4_JOBS if args.weights == "int4" else JOBS:
            path = os.path.join(tmp, f"{name}.json")
            with open(path, "w") as f:
                json.dump(CONFIGS[name], f)
            got = measure(name, dtype, batch, prompt, new_tokens)
            row = {"job": f"{name} {dtype} {batch}×{prompt} +{new_tokens}", "measured": got}
            for label, binary in (("after", args.headroom), ("before", args.before)):
                if binary:
                    row[label] = predict(binary, path, gpu_memory, dtype, batch, prompt, new_tokens)
            rows.append(row)
            print(json.dumps(row)[:400], flush=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    gib = 1 << 30
    print("| job | GPU allocated | GPU reserved | plan | allocated | diff | reserved | diff |")
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    for r in rows:
        m = r["measured"]
        if "error" in m:
            print(f"| {r['job']} | {m['error']} | | | | | | |")
            continue
        for label in ("before", "after"):
            p = r.get(label)
            if not p or "error" in p:
                continue
            a, v = p["allocated_bytes"], p["reserved_bytes"]
            print(f"| {r['job']}, SDPA {m.get('sdpa', '?')} | {m['allocated'] / gib:.2f} GiB | {m['reserved'] / gib:.2f} GiB | {label} | "
                  f"{a / gib:.2f} GiB | {a / m['allocated'] - 1:+.2%} | {v / gib:.2f} GiB | {v / m['reserved'] - 1:+.2%} |")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The shipped step templates (`data/programs/hf-*.tpl`) against the GPU, one job at a time.

Each job is a Hugging Face model built from its config (random weights: nothing is downloaded)
and run as a user runs it on the GPU: full fine-tuning, LoRA or QLoRA (peft + bitsandbytes) for
three AdamW steps, an inference forward, or `generate`. The GPU's `max_memory_allocated` and
`max_memory_reserved` are set beside what `headroom plan --json` says for the same job
without `--program` (the template the planner replays, named in the output), which is what a
user gets. The jobs were chosen before any ran; none was tuned on.

Planning needs no GPU, so the two halves can run on different machines:

    python3 scripts/gpu/validate_templates.py plan --headroom target/debug/headroom --out plans.json
    python3 scripts/gpu/validate_templates.py measure --out measured.jsonl [--parallel 3]   # on the GPU
    python3 scripts/gpu/validate_templates.py table --plans plans.json --measured measured.jsonl

`measure` runs each job in a process of its own (cuBLAS's workspaces and the caching
allocator's counters are a process's own), several at once where the plans say they fit
together, and writes a line a job as it ends. `--only NAME,...` runs some jobs. Without a GPU
`measure` says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
H200_BYTES = 150_109_880_320
GIB = 1 << 30

GEMMA2_9B = {
    "model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 256, "num_hidden_layers": 42, "vocab_size": 256000,
    "max_position_embeddings": 8192, "query_pre_attn_scalar": 256, "sliding_window": 4096,
    "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0, "hidden_activation": "gelu_pytorch_tanh",
}
GEMMA2_2B = {**GEMMA2_9B, "hidden_size": 2304, "intermediate_size": 9216, "num_attention_heads": 8,
             "num_key_value_heads": 4, "num_hidden_layers": 26}
QWEN3_30B_A3B = {
    "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
    "num_experts": 128, "num_experts_per_tok": 8, "num_attention_heads": 32, "num_key_value_heads": 4,
    "head_dim": 128, "num_hidden_layers": 48, "vocab_size": 151936, "max_position_embeddings": 32768,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True, "tie_word_embeddings": False,
}

QWEN15_7B = {
    "model_type": "qwen2", "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
    "num_key_value_heads": 32, "num_hidden_layers": 32, "vocab_size": 151936, "max_position_embeddings": 32768,
    "tie_word_embeddings": False, "rope_theta": 1000000.0,
}


def preset(name):
    with open(os.path.join(ROOT, "data/models/presets", f"{name}.json")) as f:
        return json.load(f)


def model_file(name):
    with open(os.path.join(ROOT, "data/models", f"{name}.json")) as f:
        return json.load(f)


def layers(cfg, n):
    """`cfg` with `n` layers: the per-layer tensors are what a job checks, and fewer layers keep
    the big families' jobs on one GPU."""
    cfg = dict(cfg)
    for k in ("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers"):
        if k in cfg:
            cfg[k] = n
    return cfg


def job(name, cfg, kind, dtype="bf16", attention="sdpa", batch=1, seq=1024, checkpoint=False, rank=16,
        targets="all", new_tokens=0, target=None, quantize=None):
    """`target`: T5's labels' length (the decoder's), `seq` where not given. `quantize="nf4"`: an
    inference job over bitsandbytes' NF4 layers (double quantization, bf16 compute)."""
    return dict(name=name, config=cfg, kind=kind, dtype=dtype, attention=attention, batch=batch, seq=seq,
                checkpoint=checkpoint, rank=rank, targets=targets, new_tokens=new_tokens, target=target,
                quantize=quantize)


def jobs():
    """In order of value (docs/GPU.md's owed lists, newest first)."""
    return [
        # T5 with SDPA as transformers 5.24 runs it (2026-12-02): the memory-efficient kernel, its
        # position bias the mask, recorded on the kernel's CPU stand-in.
        job("t0-3b qlora sdpa r16 1x1024", preset("t0-3b"), "qlora", batch=1, seq=1024),
        job("t5-base bf16 sdpa 4x512", preset("t5-base"), "train", batch=4, seq=512),
        job("t5-base lora sdpa r16 4x512", preset("t5-base"), "lora", batch=4, seq=512),
        # The seventh and sixth sessions' lists (2026-11-29), chosen before any ran.
        # peft's seq2seq LoRA script at T0_3B's shape: labels of 4 tokens.
        job("t0-3b lora-qv r8 fp32 8x64->4", preset("t0-3b"), "lora", dtype="fp32", attention="eager", batch=8,
            seq=64, rank=8, targets="qv", target=4),
        # Dropout's one-byte masks of fp32 tensors under AMP.
        job("t5-base amp eager 8x512", preset("t5-base"), "train", dtype="amp", attention="eager", batch=8, seq=512),
        job("bert-base amp 8x512", preset("bert-base-uncased"), "train", dtype="amp",
            batch=8, seq=512),
        # NF4 inference, the templates recorded again at 15 heads of 256 over 5.
        job("gemma2-9b nf4 generate 4x2048+16", GEMMA2_9B, "generate", attention="eager", batch=4, seq=2048,
            new_tokens=16, quantize="nf4"),
        job("llama-2-7b nf4 generate 4x2048+16", preset("llama-2-7b"), "generate", batch=4, seq=2048, new_tokens=16,
            quantize="nf4"),
        # peft's merged expert stacks kept for the backward (LoRA of every linear, no checkpointing).
        job("mixtral-8x7b(4L) lora eager r16 1x256", layers(preset("mixtral-8x7b"), 4), "lora", attention="eager",
            seq=256),
        # QLoRA of ungrouped Qwen1.5-7B: fp32 SDPA on the memory-efficient kernel.
        job("qwen1.5-7b qlora-qv r16 no-ckpt 1x1024", QWEN15_7B, "qlora", targets="qv"),
        # Position-pair laws now read per head: eager attention at real head counts.
        job("bloom-7b1 bf16 eager 1x2048", preset("bloom-7b1"), "train", attention="eager", seq=2048),
        job("gemma2-9b(8L) bf16 eager 2x2048", layers(GEMMA2_9B, 8), "train", attention="eager", batch=2, seq=2048),
        job("gemma2-2b bf16 eager 2x1024", GEMMA2_2B, "train", attention="eager", batch=2, seq=1024),
        job("llama-3.2-1b bf16 eager 2x1024", model_file("llama-3.2-1b"), "train", attention="eager", batch=2),
        # QLoRA planned from its templates (peft + bitsandbytes).
        job("llama-3-8b qlora r16 4x2048", preset("llama-3-8b"), "qlora", batch=4, seq=2048, checkpoint=True),
        job("gpt2 qlora r16 4x1024", preset("gpt2"), "qlora", batch=4, seq=1024, checkpoint=True),
        job("pythia-1b qlora r16 4x2048", preset("pythia-1b"), "qlora", batch=4, seq=2048, checkpoint=True),
        job("gemma-3-1b qlora r16 2x2048", model_file("gemma-3-1b"), "qlora", batch=2, seq=2048, checkpoint=True),
        job("mixtral-8x7b(4L) qlora r16 1x2048", layers(preset("mixtral-8x7b"), 4), "qlora", seq=2048,
            checkpoint=True),
        job("qwen3-30b-a3b(4L) qlora r16 2x1024", layers(QWEN3_30B_A3B, 4), "qlora", batch=2, checkpoint=True),
        job("phi-3-mini qlora r16 2x2048", preset("phi-3-mini"), "qlora", batch=2, seq=2048, checkpoint=True),
        job("gemma2-2b qlora r16 2x1024", GEMMA2_2B, "qlora", attention="eager", batch=2, checkpoint=True),
        job("bert-large qlora r16 8x512", preset("bert-large-uncased"), "qlora", batch=8, seq=512, checkpoint=True),
        job("t5-large qlora r16 4x512", preset("t5-large"), "qlora", attention="eager", batch=4, seq=512,
            checkpoint=True),
        # QLoRA without checkpointing (prepare_model_for_kbit_training(use_gradient_checkpointing=False)).
        job("llama-3-8b qlora r16 no-ckpt 1x2048", preset("llama-3-8b"), "qlora", seq=2048),
        job("gpt2 qlora r16 no-ckpt 4x1024", preset("gpt2"), "qlora", batch=4, seq=1024),
        job("bert-large qlora r16 no-ckpt 8x512", preset("bert-large-uncased"), "qlora", batch=8, seq=512),
        # QLoRA of heads that are their own key-value heads: fp32 SDPA on the memory-efficient kernel.
        job("phi-3-mini qlora-qv r16 no-ckpt 1x1024", preset("phi-3-mini"), "qlora", targets="qv"),
        job("llama-2-7b qlora-qv r16 no-ckpt 1x1024", preset("llama-2-7b"), "qlora", targets="qv"),
        # T5 v1.0 (ReLU MLP) training, and BERT.
        job("t5-base fp32 2x512", preset("t5-base"), "train", dtype="fp32", attention="eager", batch=2, seq=512),
        job("t5-base bf16 2x512", preset("t5-base"), "train", attention="eager", batch=2, seq=512),
        job("t5-large bf16 ckpt 4x512", preset("t5-large"), "train", attention="eager", batch=4, seq=512,
            checkpoint=True),
        job("bert-large bf16 8x512", preset("bert-large-uncased"), "train", batch=8, seq=512),
        # Inference forwards and generate.
        job("bert-large forward bf16 32x512", preset("bert-large-uncased"), "infer", batch=32, seq=512),
        job("t5-base forward bf16 8x512", preset("t5-base"), "infer", attention="eager", batch=8, seq=512),
        job("t5-base forward fp32 8x512", preset("t5-base"), "infer", dtype="fp32", attention="eager", batch=8,
            seq=512),
        job("gemma2-2b generate bf16 4x1024+64", GEMMA2_2B, "generate", attention="eager", batch=4,
            new_tokens=64),
        job("gemma2-2b generate fp32 2x1024+32", GEMMA2_2B, "generate", dtype="fp32", attention="eager", batch=2,
            new_tokens=32),
        job("bloom-7b1 forward fp32 1x2048", preset("bloom-7b1"), "infer", dtype="fp32", attention="eager",
            seq=2048),
        # Inside Gemma 3's sliding window of 512: the window's cache was not recorded.
        job("gemma-3-1b generate bf16 4x448+64", model_file("gemma-3-1b"), "generate", batch=4, seq=448,
            new_tokens=64),
        job("qwen3-30b-a3b(8L) generate bf16 2x1024+32", layers(QWEN3_30B_A3B, 8), "generate", batch=2,
            new_tokens=32),
        # LoRA templates of the families recorded since the last GPU.
        job("gemma-2b lora r16 4x1024", preset("gemma-2b"), "lora", batch=4),
        job("phi-3-mini lora r16 2x2048", preset("phi-3-mini"), "lora", batch=2, seq=2048),
        job("mistral-7b lora-qv r8 2x2048", preset("mistral-7b"), "lora", batch=2, seq=2048, rank=8, targets="qv"),
        job("pythia-1b lora r16 4x2048", preset("pythia-1b"), "lora", batch=4, seq=2048),
        job("bert-base lora r16 16x512", preset("bert-base-uncased"), "lora", batch=16, seq=512),
        job("t5-base lora r16 4x512", preset("t5-base"), "lora", attention="eager", batch=4, seq=512),
        job("t5-base lora fp32 r16 4x512", preset("t5-base"), "lora", dtype="fp32", attention="eager", batch=4,
            seq=512),
        job("bert-base lora ckpt r16 16x512", preset("bert-base-uncased"), "lora", batch=16, seq=512,
            checkpoint=True),
        job("mixtral-8x7b(4L) lora r16 1x2048", layers(preset("mixtral-8x7b"), 4), "lora", seq=2048),
    ]


def selected(only):
    """The jobs named in `only` (comma-separated), or all; an unknown name is an error."""
    if not only:
        return jobs()
    names = only.split(",")
    known = {j["name"] for j in jobs()}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"validate_templates: no job named {', '.join(map(repr, unknown))}; the jobs: "
                         + ", ".join(sorted(known)))
    return [j for j in jobs() if j["name"] in names]


HEAD_CLASS = {"bert": "AutoModelForMaskedLM", "t5": "AutoModelForSeq2SeqLM"}
PEFT_TASK = {"bert": None, "t5": "SEQ_2_SEQ_LM"}


# --- plan (any machine) ----------------------------------------------------------------------

def plan_args(j, path):
    args = ["plan", "--model", path, "--gpu", "h200", "--gpu-memory", str(H200_BYTES), "--batch", str(j["batch"]),
            "--seq", str(j["seq"]), "--attention", j["attention"], "--json"]
    if j.get("target"):
        args += ["--target-seq", str(j["target"])]
    if j["kind"] in ("infer", "generate"):
        args += ["--infer", "--framework", "hf", "--weights", j["dtype"]]
        if j.get("quantize"):
            args += ["--quantize", j["quantize"], "--double-quant", "--compute-dtype", "bf16"]
        if j["kind"] == "generate":
            args += ["--new-tokens", str(j["new_tokens"])]
        elif j["config"]["model_type"] != "bert":
            args += ["--all-logits"]
        return args
    args += ["--train", "--precision", j["dtype"], "--checkpoint", "full" if j["checkpoint"] else "none"]
    if j["kind"] in ("lora", "qlora"):
        args += ["--finetune", j["kind"], "--lora-rank", str(j["rank"]), "--lora-targets", j["targets"]]
    return args


def plan(args):
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for j in selected(args.only):
            path = os.path.join(tmp, "config.json")
            with open(path, "w") as f:
                json.dump(j["config"], f)
            cmd = [args.headroom] + plan_args(j, path)
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode > 1:
                out[j["name"]] = {"error": r.stderr.strip()[-600:], "command": cmd[1:]}
            else:
                p = json.loads(r.stdout)
                out[j["name"]] = {k: p.get(k) for k in ("allocated_bytes", "reserved_bytes", "fits")}
                # Training names its template under `program`, inference under `planned_from`.
                out[j["name"]]["program"] = p.get("program") or p.get("planned_from")
                out[j["name"]]["command"] = cmd[1:]
            print(j["name"], json.dumps(out[j["name"]])[:300], flush=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    return 0


# --- measure (the GPU) -----------------------------------------------------------------------

def build(j, torch, transformers, device):
    """The job's model on the GPU, as its user builds it."""
    cfg = dict(j["config"])
    model_type = cfg.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **cfg)
    dtype = torch.bfloat16 if j["dtype"] == "bf16" else torch.float32
    if j["kind"] == "qlora":
        # headroom_gpu.qlora's setup, the recorder's: transformers' bitsandbytes modules built on
        # the meta device with the model's own head, each layer quantized by bitsandbytes as it
        # lands on the GPU, then peft's prepare_model_for_kbit_training (use_gradient_checkpointing
        # as the job asks) and LoRA on every linear layer (or the query and value projections).
        sys.path.insert(0, os.path.join(ROOT, "python"))
        from headroom_gpu import qlora

        config.use_cache = False
        model = qlora.prepare(qlora.build(config, j["attention"]), j["rank"], device=device,
                              checkpointing=j["checkpoint"], targets=j["targets"])
        # A meta model's buffers arrive uninitialized, which fake tensors never read but a GPU
        # does: BERT's embeddings gather by their position and token-type ids.
        with torch.no_grad():
            for name, buf in model.named_buffers():
                if name.endswith("position_ids"):
                    buf.copy_(torch.arange(buf.shape[-1], device=buf.device).expand_as(buf))
                elif name.endswith("token_type_ids"):
                    buf.zero_()
        return model, config
    if j.get("quantize"):
        # Inference over NF4 layers, loaded as from_pretrained loads a BitsAndBytesConfig(load_in_4bit,
        # bnb_4bit_use_double_quant, bnb_4bit_compute_dtype=bfloat16): each weight arriving in bf16
        # and quantized as it lands (validate_infer.py's `--weights int4`).
        sys.path.insert(0, os.path.join(ROOT, "python"))
        from headroom_gpu import qlora

        model = qlora.load(qlora.build(config, j["attention"], model_head="causal-lm"), device=device)
        model.eval()
        return model, config
    cls = getattr(transformers, HEAD_CLASS.get(model_type, "AutoModelForCausalLM"))
    if j["kind"] == "train" or j["kind"] == "lora":
        config.use_cache = False
    with torch.device(device):
        model = cls.from_config(config, attn_implementation=j["attention"], dtype=dtype)
        if model_type == "t5" and j["config"].get("tie_word_embeddings") is False:
            untie_t5(torch, model)
    if j["kind"] == "lora":
        import peft

        lora = peft.LoraConfig(r=j["rank"], lora_alpha=2 * j["rank"], task_type=PEFT_TASK.get(model_type, "CAUSAL_LM"),
                               target_modules="all-linear" if j["targets"] == "all" else None)
        model = peft.get_peft_model(model, lora)
    if j["checkpoint"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train(j["kind"] in ("train", "lora"))
    return model, config


def untie_t5(torch, model):
    """T5 v1.1's output layer a weight of its own, as loading its checkpoint (flan-t5's, T0's,
    mT5's: both weights, different values) leaves it. transformers 5 builds every T5 tied from
    a config, `tie_word_embeddings: false` or not, and the plan of such a config is the untied
    model's: T0-3B's output layer (263,192,576 bytes) was the whole of the two's difference
    (docs/VALIDATION.md). As scripts/validate/step_programs.py's `untie_t5` records it."""
    if model.lm_head.weight.data_ptr() == model.shared.weight.data_ptr():
        model.lm_head.weight = torch.nn.Parameter(model.shared.weight.detach().clone())
        getattr(model, "all_tied_weights_keys", {}).pop("lm_head.weight", None)


def measure_one(j, device="cuda", snapshot=None):
    """The job's peaks on the GPU. `device="cpu"` runs the same code on the CPU with no figures: a
    smoke test of the jobs before a GPU's time is spent on them. `snapshot`: a file to write the
    caching allocator's snapshot of the whole job to (`_record_memory_history` from its first
    request, Python frames included), to set beside the plan's program segment by segment
    (scripts/validate/segments.py)."""
    import torch
    import transformers

    cuda = device == "cuda"
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "device": torch.cuda.get_device_name() if cuda else "cpu"}
    for lib in ("peft", "bitsandbytes"):
        try:
            versions[lib] = __import__(lib).__version__
        except ImportError:
            versions[lib] = None
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        if snapshot:
            torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
    model, config = build(j, torch, transformers, device)
    model_type = j["config"]["model_type"]
    vocab = config.vocab_size
    b, s = j["batch"], j["seq"]
    ids = torch.randint(0, vocab, (b, s), device=device)
    if j["kind"] in ("train", "lora", "qlora"):
        batch = {"input_ids": ids, "labels": ids.clone()}
        if model_type == "t5":
            batch["labels"] = torch.randint(0, vocab, (b, j.get("target") or s), device=device)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, foreach=True)
        for _ in range(3):
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=j["dtype"] == "amp"):
                loss = model(**batch).loss
            loss.backward()
            del loss
            opt.step()
            opt.zero_grad(set_to_none=True)
    elif j["kind"] == "infer":
        extra = {}
        if model_type == "t5":
            labels = torch.randint(0, vocab, (b, s), device=device)
            extra["decoder_input_ids"] = torch.cat([torch.zeros_like(labels[:, :1]), labels[:, :-1]], 1)
        if model_type != "bert":
            extra["use_cache"] = True
        with torch.no_grad():
            for _ in range(3):
                out = model(input_ids=ids, **extra)
                del out
    else:
        model.generation_config.pad_token_id = 0
        mask = torch.ones_like(ids)
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=j["new_tokens"],
                             min_new_tokens=j["new_tokens"], do_sample=False)
        del out
    if not cuda:
        return versions
    torch.cuda.synchronize()
    if snapshot:
        torch.cuda.memory._dump_snapshot(snapshot)
        torch.cuda.memory._record_memory_history(enabled=None)
    return {"allocated": torch.cuda.max_memory_allocated(), "reserved": torch.cuda.max_memory_reserved(), **versions}


def measure(args):
    try:
        import torch
    except ImportError as e:
        print(f"validate_templates: needs torch ({e})", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("validate_templates: no CUDA GPU here; `measure` runs the jobs on one", file=sys.stderr)
        return 2
    plans = {}
    if args.plans:
        with open(args.plans) as f:
            plans = json.load(f)
    todo = selected(args.only)
    budget = torch.cuda.mem_get_info()[1] * 0.9

    def need(j):
        p = plans.get(j["name"], {})
        # Unknown sizes run alone.
        return p["reserved_bytes"] * 1.15 + 2 * GIB if p.get("reserved_bytes") else budget

    running = []  # (process, job, started, size)
    deadline = time.time() + args.budget_s
    with open(args.out, "a") as out:
        while todo or running:
            used = sum(r[3] for r in running)
            while len(running) < args.parallel and time.time() < deadline:
                # The first job, in order of value, that fits beside those running.
                fits = [j for j in todo if not running or used + need(j) <= budget]
                if not fits:
                    break
                j = fits[0]
                todo.remove(j)
                p = subprocess.Popen([sys.executable, __file__, "one", json.dumps(j)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
                running.append((p, j, time.time(), need(j)))
                used += need(j)
            if not running:
                if todo:
                    print(f"not started (past --budget-s): {', '.join(j['name'] for j in todo)}", flush=True)
                break
            time.sleep(0.5)
            for r in list(running):
                p, j, started, _ = r
                late = time.time() - started > args.job_timeout_s
                if p.poll() is None and not late:
                    continue
                if late and p.poll() is None:
                    p.kill()
                stdout, stderr = p.communicate()
                running.remove(r)
                lines = stdout.strip().splitlines()
                row = {"name": j["name"], "seconds": round(time.time() - started, 1)}
                if p.returncode == 0 and lines:
                    row.update(json.loads(lines[-1]))
                else:
                    row["error"] = "timed out" if late else (stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
                    row["stderr_tail"] = stderr[-1500:]
                out.write(json.dumps(row) + "\n")
                out.flush()
                print(json.dumps({k: v for k, v in row.items() if k != "stderr_tail"}), flush=True)
    return 0


# --- table -----------------------------------------------------------------------------------

def table(args):
    with open(args.plans) as f:
        plans = json.load(f)
    with open(args.measured) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    print("| job | template | GPU allocated | plan | diff | GPU reserved | plan | diff |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        p = plans.get(r["name"], {})
        template = (p.get("program") or {}).get("template") or (p.get("program") or {}).get("source") or "closed form"
        if "error" in r or "error" in p:
            print(f"| {r['name']} | {template} | {r.get('error') or ''} | {p.get('error', '')[:80]} | | | | |")
            continue
        a, v = p["allocated_bytes"], p["reserved_bytes"]
        print(f"| {r['name']} | `{template}` | {r['allocated'] / GIB:.2f} GiB | {a / GIB:.2f} GiB | "
              f"{a / r['allocated'] - 1:+.2%} | {r['reserved'] / GIB:.2f} GiB | {v / GIB:.2f} GiB | "
              f"{v / r['reserved'] - 1:+.2%} |")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("plan", help="headroom's plan of every job (no GPU needed)")
    p.add_argument("--headroom", default=os.path.join(ROOT, "target/release/headroom"))
    p.add_argument("--out", required=True)
    p.add_argument("--only", help="comma-separated job names")
    m = sub.add_parser("measure", help="every job on the GPU, a process each")
    m.add_argument("--out", required=True, help="JSONL, appended to as each job ends")
    m.add_argument("--plans", help="plan's output: the jobs' sizes, to run several at once")
    m.add_argument("--only", help="comma-separated job names")
    m.add_argument("--parallel", type=int, default=1, help="jobs at once, where their plans fit together")
    m.add_argument("--job-timeout-s", type=float, default=240)
    m.add_argument("--budget-s", type=float, default=1e9, help="start no job after this many seconds")
    one = sub.add_parser("one", help="one job given as JSON (measure runs each so)")
    one.add_argument("job")
    one.add_argument("--device", default="cuda", help="cpu: run the job's code without figures (a smoke test)")
    one.add_argument("--snapshot", help="write the job's allocator snapshot (a pickle) here")
    t = sub.add_parser("table", help="a markdown table of plan against GPU")
    t.add_argument("--plans", required=True)
    t.add_argument("--measured", required=True)
    args = ap.parse_args()
    if args.verb == "plan":
        return plan(args)
    if args.verb == "measure":
        return measure(args)
    if args.verb == "one":
        print(json.dumps(measure_one(json.loads(args.job), args.device, args.snapshot)))
        return 0
    return table(args)


if __name__ == "__main__":
    sys.exit(main())

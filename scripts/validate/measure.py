#!/usr/bin/env python3
"""Measure real PyTorch training steps and inference forwards on CPU, exactly.

Builds Hugging Face models from small configs with random weights, runs one warm-up
training step (so optimizer state exists, as in every step after the first), then
profiles the next one -- forward with the loss, backward, optimizer step,
zero_grad(set_to_none=True) -- and records every allocation and free of the CPU
allocator (the profiler's memory events). The live bytes over time are the tensors
alive when the step starts (weights, buffers, optimizer state, inputs: counted by
their storages) plus the running sum of those events; the peak of each phase and of
the step is what `torch.cuda.max_memory_allocated()` reports for the same program on
a GPU, less what only a GPU has (cuBLAS workspaces, the caching allocator's 512-byte
rounding, flash kernels).

    python3 -m venv .venv && .venv/bin/pip install -r scripts/validate/requirements.txt
    .venv/bin/python scripts/validate/measure.py --out data/validation/cpu_ground_truth.json

The method is checked first on a step computed by hand (`check_method`); the run
stops if it disagrees. `--compiled` runs only the torch.compile'd steps (each in a process
of its own).

A training step's model is built with its key-value cache off (`no_cache`), as the step
recorders build the model the planner replays. `--replace` measures some cases again in an
earlier output's places (here Phi-3's deep training step without checkpointing, with SDPA):

    .venv/bin/python scripts/validate/measure.py --only phi3 --size deep --training --uncheckpointed --attention sdpa \
        --replace data/validation/cpu_ground_truth.json --out data/validation/cpu_ground_truth.json

`--use-cache` builds them with the config's `use_cache` left on (transformers' default), as the
templates recorded with `step_programs.py --use-cache` (keys with `/cache`) are; each training row
says which (`use_cache`; a row without it was measured before `no_cache`, with the cache on).
Such rows are added to an output with `--merge`:

    .venv/bin/python scripts/validate/measure.py --use-cache --only gpt2 --size deep --training --uncheckpointed \
        --attention sdpa --precision fp32 --out gpt2-cache.json
    .venv/bin/python scripts/validate/measure.py --merge data/validation/cpu_ground_truth.json gpt2-cache.json \
        --out data/validation/cpu_ground_truth.json
"""

import argparse
import gc
import json
import platform
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function

PHASES = ("forward", "backward", "optimizer", "zero_grad")


def storage_bytes(tensors):
    """Bytes of the distinct storages behind `tensors`."""
    seen = {}
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor):
            continue
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def state_tensors(opt):
    for st in opt.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor):
                yield v


def profiled(fn):
    """Runs fn() under the profiler; returns (result, peak of live-byte delta per phase range,
    overall peak delta, final delta). Phases are `record_function` ranges named in PHASES."""
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    events = list(prof.profiler.kineto_results.events())
    mem = sorted((e.start_ns(), i, e.nbytes()) for i, e in enumerate(events) if e.name() == "[memory]")
    ranges = [(e.name(), e.start_ns(), e.end_ns()) for e in events if e.name() in PHASES]
    live, peak, per = 0, 0, {name: None for name, _, _ in ranges}
    at_start = {}
    for t, _, nbytes in mem:
        for name, start, end in ranges:
            if name not in at_start and t >= start:
                at_start[name] = live
        live += nbytes
        peak = max(peak, live)
        for name, start, end in ranges:
            if start <= t <= end:
                per[name] = max(per[name] or 0, live)
    for name, _, _ in ranges:
        if per[name] is None:
            per[name] = at_start.get(name, live)
        per[name] = max(per[name], at_start.get(name, 0))
    return result, per, peak, live


def check_method():
    """A step counted by hand, tensor by tensor: y = x W^T (fp32, no bias), loss = y.sum(), SGD.

    Live at the start: W (n*n*4 bytes) and x (b*n*4), not counted in the deltas.
    Forward: y (b*n*4) and the loss (4).
    Backward: the loss's gradient (4), y's gradient materialised from it for the matmul's
    backward (b*n*4), and W's gradient (n*n*4), with y and the loss still alive.
    Optimizer: SGD updates W in place; alive are y, the loss and W's gradient.
    The profiler's deltas must equal these exactly, or the method is wrong."""
    torch.manual_seed(0)
    n, b, f = 512, 64, 4
    w = torch.nn.Parameter(torch.randn(n, n))
    x = torch.randn(b, n)
    opt = torch.optim.SGD([w], lr=0.1)

    def step():
        with record_function("forward"):
            y = x @ w.t()
            loss = y.sum()
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            opt.step()
        with record_function("zero_grad"):
            opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    _, per, peak, _ = profiled(step)
    want = {
        "forward": b * n * f + f,
        "backward": 2 * b * n * f + 2 * f + n * n * f,
        "optimizer": b * n * f + f + n * n * f,
    }
    for phase, bytes_ in want.items():
        if per[phase] != bytes_:
            raise SystemExit(f"the measuring method disagrees with the hand count: {phase} {per[phase]} != {bytes_}")
    return {"expected": want, "measured": {k: per[k] for k in want}, "peak": peak}


# --- models -------------------------------------------------------------------------------

def small_configs():
    """Two small configs per family, as the planner reads them (config.json fields): `base`
    and `wide` (other hidden size, heads, MLP width, vocabulary and depth)."""
    # head_dim 48 makes heads x head_dim (384) differ from the hidden size (256), so the
    # recipes tell the two apart, as they differ in models such as Gemma and Qwen3.
    llama = dict(model_type="llama", hidden_size=256, num_hidden_layers=3, num_attention_heads=8,
                 num_key_value_heads=4, head_dim=48, intermediate_size=704, vocab_size=4096,
                 max_position_embeddings=2048, tie_word_embeddings=False)
    base = {
        "llama": llama,
        "mistral": dict(llama, model_type="mistral", num_key_value_heads=2, sliding_window=None),
        "qwen2": dict(llama, model_type="qwen2", num_key_value_heads=2, use_sliding_window=False),
        "gemma": dict(model_type="gemma", hidden_size=256, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=1, head_dim=96, intermediate_size=1024, vocab_size=4096,
                      max_position_embeddings=2048),
        "phi3": dict(model_type="phi3", hidden_size=256, num_hidden_layers=3, num_attention_heads=8,
                     num_key_value_heads=8, head_dim=48, intermediate_size=640, vocab_size=4096, max_position_embeddings=2048,
                     tie_word_embeddings=False, pad_token_id=0),
        "mixtral": dict(llama, model_type="mixtral", num_local_experts=4, num_experts_per_tok=2,
                        intermediate_size=384, sliding_window=None),
        "gpt2": dict(model_type="gpt2", n_embd=256, n_layer=3, n_head=8, n_positions=1024, vocab_size=4096),
        # GPT-2's code with one key-value head (StarCoder, OctoCoder): its cache and fused
        # c_attn are kv-wide, not h-wide. Recorded for inference only (infer_recipes.py).
        "gpt_bigcode": dict(model_type="gpt_bigcode", n_embd=256, n_layer=3, n_head=8, n_positions=1024,
                            vocab_size=4096, multi_query=True),
        "gpt_neox": dict(model_type="gpt_neox", hidden_size=256, num_hidden_layers=3, num_attention_heads=8,
                         intermediate_size=1024, vocab_size=4096, max_position_embeddings=2048),
        "bloom": dict(model_type="bloom", hidden_size=256, n_layer=3, n_head=8, vocab_size=4096),
        "bert": dict(model_type="bert", hidden_size=256, num_hidden_layers=3, num_attention_heads=8,
                     intermediate_size=1024, vocab_size=4096, max_position_embeddings=512, type_vocab_size=2),
        "t5": dict(model_type="t5", d_model=256, d_ff=640, d_kv=32, num_heads=8, num_layers=2,
                   num_decoder_layers=2, vocab_size=4096, feed_forward_proj="gated-gelu", tie_word_embeddings=True,
                   decoder_start_token_id=0, pad_token_id=0),
    }
    def set_any(c, names, value):
        """Sets whichever of a field's spellings (Llama's, GPT-2's, T5's) the config has."""
        for k in names:
            if k in c:
                c[k] = value(c[k]) if callable(value) else value

    hidden, layers, heads = ("hidden_size", "n_embd", "d_model"), ("num_hidden_layers", "n_layer", "num_layers"), \
        ("num_attention_heads", "n_head", "num_heads")
    mlp = ("intermediate_size", "d_ff")

    def wide(c):
        c = dict(c)
        set_any(c, hidden, 384)
        set_any(c, layers, 2)
        set_any(c, heads, 6 if c.get("model_type") != "gemma" else 2)
        if "num_key_value_heads" in c:
            c["num_key_value_heads"] = {"llama": 3, "mistral": 2, "qwen2": 1, "gemma": 1, "phi3": 6,
                                        "mixtral": 2}[c["model_type"]]
        set_any(c, ("head_dim",), 64)
        set_any(c, mlp, lambda f: f * 3 // 2)
        c["vocab_size"] = 6000
        return c

    def deep(c):
        """Twice the base's layers (three stacks' worth for T5), a narrower hidden size, other
        heads and widths: the check of how recipes recorded on three layers extrapolate."""
        c = dict(c)
        set_any(c, layers + ("num_decoder_layers",), 6 if c.get("model_type") != "t5" else 4)
        set_any(c, hidden, 192)
        set_any(c, heads, 6 if c.get("model_type") != "gemma" else 4)
        if "num_key_value_heads" in c:
            c["num_key_value_heads"] = {"llama": 2, "mistral": 3, "qwen2": 2, "gemma": 1, "phi3": 6,
                                        "mixtral": 3}[c["model_type"]]
        set_any(c, ("head_dim", "d_kv"), 40)
        set_any(c, mlp, lambda f: f * 5 // 4)
        c["vocab_size"] = 5000
        return c

    return ({(f, "base"): c for f, c in base.items()} | {(f, "wide"): wide(c) for f, c in base.items()}
            | {(f, "deep"): deep(c) for f, c in base.items()})


def recording_config(family):
    """The base config a recipe is recorded on, where the base would hide a term: every unit
    a distinct size, and keys and values repeated per query head."""
    cfg = dict(small_configs()[(family, "base")])
    heads = cfg.get("num_attention_heads")
    if "num_key_value_heads" in cfg and cfg["num_key_value_heads"] in (1, heads):
        # Keys and values are repeated per query head only between the two: a base config
        # with one or all key-value heads is recorded with half, so its copies are seen.
        cfg["num_key_value_heads"] = heads // 2
    if family == "mixtral":
        # Its base MLP width (384) equals heads x head dim (8 x 48).
        cfg["intermediate_size"] = 352
    if family == "t5":
        # Three blocks a stack, as the decoders have: the first, the last and one between;
        # and heads x head dim (8 x 48) apart from the hidden size (256), which the base
        # config's 8 x 32 equals.
        cfg["num_layers"] = cfg["num_decoder_layers"] = 3
        cfg["d_kv"] = 48
    return cfg


HEADS = {"causal-lm": "AutoModelForCausalLM", "masked-lm": "AutoModelForMaskedLM",
         "seq-cls": "AutoModelForSequenceClassification", "seq2seq-lm": "AutoModelForSeq2SeqLM"}


def build(cfg, head, attn, dtype, dropout=False):
    """The model of `cfg` with random weights, in train mode; dropout off unless `dropout`
    (then at the config's own rates, as a user's run has it)."""
    import transformers
    fields = dict(cfg)
    model_type = fields.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **fields)
    config.attn_implementation = attn
    config._attn_implementation = attn
    if head == "seq-cls":
        config.num_labels = 2
        if getattr(config, "pad_token_id", None) is None:
            config.pad_token_id = 0
    cls = getattr(transformers, HEADS[head])
    torch.manual_seed(0)
    model = cls.from_config(config, attn_implementation=attn, dtype=dtype)
    model.train()
    if dropout:
        return model
    # Dropout off (it is 0 in these configs' families' defaults except GPT-2/BERT/T5), kept in train mode.
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        # T5's attention keeps its rate as a number read at each forward (`T5Attention.dropout`),
        # which neither the modules nor the config above reach.
        if isinstance(getattr(m, "dropout", None), float):
            m.dropout = 0.0
    for k in ("attn_pdrop", "resid_pdrop", "embd_pdrop", "hidden_dropout_prob",
              "attention_probs_dropout_prob", "dropout_rate", "attention_dropout", "hidden_dropout"):
        if hasattr(model.config, k):
            setattr(model.config, k, 0.0)
    model.train()
    return model


def no_cache(model):
    """`model` set to build no key-value cache in its forward, as a training script sets it
    (`config.use_cache = False`: the GPU runs' `headroom_gpu`, QLoRA's recording and
    scripts/gpu/validate_templates.py all train so). With the config's default (`use_cache:
    true` in every causal LM's config) transformers makes a `DynamicCache` in a training
    forward too, and its update copies each layer's keys and values (`torch.cat` onto an empty
    cache); SDPA then saves the copies, not the value that is a view of a fused query-key-value
    projection's output, and that output is freed in the forward where a run without the
    cache keeps it to the backward (Phi-3's `qkv_proj`, GPT-NeoX's `query_key_value`: the
    query's and the key's widths a token a layer planned low on an H200)."""
    model.config.use_cache = False
    return model


def inputs(cfg, head, batch, seq, target=None):
    """A batch of `seq` tokens; a sequence-to-sequence job's labels (its decoder's input,
    shifted right) `target` tokens long, or `seq` where not given."""
    vocab = cfg.get("vocab_size")
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    if head == "seq-cls":
        return {"input_ids": ids, "labels": torch.randint(0, 2, (batch,), generator=g)}
    if head == "seq2seq-lm":
        return {"input_ids": ids, "labels": torch.randint(0, vocab, (batch, target or seq), generator=g)}
    return {"input_ids": ids, "labels": ids.clone()}


def optimizer(name, params):
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, foreach=True)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-4, foreach=True)
    if name == "adafactor":
        from transformers.optimization import Adafactor
        return Adafactor(params, lr=1e-4, scale_parameter=False, relative_step=False, warmup_init=False)
    raise ValueError(name)


def train_case(family, cfg, head, precision, opt_name, attn, checkpointing, batch, seq, compiled=False,
               use_cache=False):
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    if compiled:
        # Each case compiles its own model: graphs cached for an earlier one would count
        # against dynamo's recompilation limit.
        torch._dynamo.reset()
    # The cache off, as the step recorders build the model the planner replays (`no_cache`);
    # with `use_cache`, the config's default, as the templates recorded with `--use-cache` are.
    model = build(cfg, head, attn, dtype)
    if not use_cache:
        no_cache(model)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    params = [p for p in model.parameters() if p.requires_grad]
    opt = optimizer(opt_name, params)
    batch_inputs = inputs(cfg, head, batch, seq)
    amp = precision == "amp"
    # torch.compile'd forward (and the backward AOTAutograd derives from it), one graph per
    # shape; the warm-up step below compiles it.
    forward = torch.compile(model, dynamic=False) if compiled else model

    def step():
        with record_function("forward"):
            if amp:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = forward(**batch_inputs).loss
            else:
                loss = forward(**batch_inputs).loss
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            opt.step()
        with record_function("zero_grad"):
            opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    step()  # the first step creates the optimizer state
    gc.collect()
    weights = storage_bytes(list(model.parameters()) + list(model.buffers()))
    state = storage_bytes(list(state_tensors(opt)))
    inp = storage_bytes(batch_inputs.values())
    _, per, peak, _ = profiled(step)
    base = weights + state + inp
    phases = {k: base + v for k, v in per.items()}
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "weight_bytes": weights,
        "optimizer_state_bytes": state,
        "input_bytes": inp,
        "phases": phases,
        "peak_bytes": base + peak,
        "peak_phase": max(per, key=per.get),
        "use_cache": use_cache,
    }


def infer_case(family, cfg, head, precision, attn, batch, seq, logits="all"):
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    model = build(cfg, head, attn, dtype).eval()
    batch_inputs = {"input_ids": inputs(cfg, head, batch, seq)["input_ids"]}

    # generate's first forward keeps the last position's logits only.
    extra = {"logits_to_keep": 1} if logits == "last" else {}

    def fwd():
        with torch.no_grad(), record_function("forward"):
            out = model(**batch_inputs, use_cache=True, **extra)
            return out.logits.shape

    fwd()
    gc.collect()
    weights = storage_bytes(list(model.parameters()) + list(model.buffers()))
    inp = storage_bytes(batch_inputs.values())
    _, per, peak, _ = profiled(fwd)
    return {"params": sum(p.numel() for p in model.parameters()), "weight_bytes": weights, "input_bytes": inp,
            "phases": {"forward": weights + inp + per["forward"]}, "peak_bytes": weights + inp + peak,
            "peak_phase": "forward"}


DECODERS = ["llama", "mistral", "qwen2", "gemma", "phi3", "mixtral", "gpt2", "gpt_neox", "bloom"]
# Families measured and recorded with eager attention alone: BLOOM's transformers code has no
# SDPA path; T5's has had one since transformers#47014 (5.24 runs it by default), which no
# recording or CPU case here takes yet.
NO_SDPA = {"bloom", "t5"}


def grid():
    """The cases. `split` is `tuning` for the base config of every family at batch 2 x 256
    tokens (the cases read while building the model) and `check` for all others. 16-bit
    matmuls are about 20x slower than fp32 on a CPU without AVX-512, so bf16 and AMP get
    fewer and shorter cases."""
    cases = []
    for family in DECODERS + ["bert", "t5"]:
        head = "causal-lm" if family in DECODERS else ("masked-lm" if family == "bert" else "seq2seq-lm")
        attns = ("eager",) if family in NO_SDPA else ("eager", "sdpa")
        for size in ("base", "wide"):
            for precision in ("fp32", "bf16", "amp"):
                for attn in attns:
                    for checkpointing in (False, True):
                        if precision != "fp32" and checkpointing and attn != attns[-1]:
                            continue
                        if precision == "fp32":
                            shapes = ((2, 256), (4, 384), (1, 512)) if size == "base" else ((2, 256), (4, 384))
                        else:
                            shapes = ((2, 256), (1, 192)) if size == "base" else ((1, 192),)
                        for batch, seq in shapes:
                            cases.append(dict(mode="train", family=family, size=size, head=head,
                                              precision=precision, optimizer="adamw", attention=attn,
                                              checkpointing=checkpointing, batch=batch, seq=seq))
                for opt_name in ("sgd", "adafactor"):
                    shape = (2, 256) if precision == "fp32" else (1, 128)
                    cases.append(dict(mode="train", family=family, size=size, head=head, precision=precision,
                                      optimizer=opt_name, attention=attns[-1], checkpointing=False,
                                      batch=shape[0], seq=shape[1]))
    for family in ("llama", "bert"):
        for precision in ("fp32", "bf16"):
            for attn in ("eager", "sdpa"):
                cases.append(dict(mode="train", family=family, size="base", head="seq-cls", precision=precision,
                                  optimizer="adamw", attention=attn, checkpointing=False, batch=2, seq=256))
    for family in DECODERS:
        attns = ("eager",) if family in NO_SDPA else ("eager", "sdpa")
        for size in ("base", "wide"):
            for precision in ("fp32", "bf16"):
                for attn in attns:
                    shapes = ((2, 256), (1, 512), (8, 128)) if precision == "fp32" else ((2, 256),)
                    for batch, seq in shapes:
                        cases.append(dict(mode="infer", family=family, size=size, head="causal-lm",
                                          precision=precision, attention=attn, batch=batch, seq=seq))
    # The deep configs: fp32 only (the slowest precision elsewhere on a CPU), both kernels,
    # with and without checkpointing, and the inference forward.
    for family in DECODERS + ["bert", "t5"]:
        head = "causal-lm" if family in DECODERS else ("masked-lm" if family == "bert" else "seq2seq-lm")
        attns = ("eager",) if family in NO_SDPA else ("eager", "sdpa")
        for attn in attns:
            for checkpointing in (False, True):
                cases.append(dict(mode="train", family=family, size="deep", head=head, precision="fp32",
                                  optimizer="adamw", attention=attn, checkpointing=checkpointing, batch=2, seq=192))
            if family in DECODERS:
                cases.append(dict(mode="infer", family=family, size="deep", head="causal-lm", precision="fp32",
                                  attention=attn, batch=2, seq=192))
    # generate's first forward (the last position's logits): every decoder, size and kernel, fp32.
    for family in DECODERS:
        for size in ("base", "wide", "deep"):
            for attn in ("eager",) if family in NO_SDPA else ("eager", "sdpa"):
                batch, seq = (2, 192) if size == "deep" else (2, 256)
                cases.append(dict(mode="infer", family=family, size=size, head="causal-lm", precision="fp32",
                                  attention=attn, batch=batch, seq=seq, logits="last"))
    # torch.compile'd steps: every decoder, at the tuning shape and the other configs' shapes;
    # fp32, bf16 and AMP without checkpointing, then fp32 with it.
    for precision, checkpointing in (("fp32", False), ("bf16", False), ("amp", False), ("fp32", True)):
        for family in DECODERS:
            attn = "eager" if family in NO_SDPA else "sdpa"
            for size, (batch, seq) in (("base", (2, 256)), ("base", (4, 384)), ("wide", (2, 256)), ("deep", (2, 192))):
                cases.append(dict(mode="train", family=family, size=size, head="causal-lm", precision=precision,
                                  optimizer="adamw", attention=attn, checkpointing=checkpointing, batch=batch,
                                  seq=seq, compiled=True))
    for c in cases:
        c["split"] = "tuning" if c["size"] == "base" and (c["batch"], c["seq"]) == (2, 256) else "check"
    return cases


def _case(c, cfg):
    torch.set_num_threads(1)
    return train_case(c["family"], cfg, c["head"], c["precision"], c["optimizer"], c["attention"],
                      c["checkpointing"], c["batch"], c["seq"], True)


def compiled_case(c, cfg):
    """A torch.compile'd case in a process of its own: compiled graphs and dynamo's caches
    left by an earlier case change what a later one measures in the same process."""
    import multiprocessing
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_case, (c, cfg))


def replaced(path, run):
    """The earlier output at `path` with each case `run` measured again in its place (the same
    job: every field of the grid's case); the versions and seconds of each run noted."""
    with open(path) as f:
        doc = json.load(f)
    fields = ("mode", "family", "size", "head", "precision", "optimizer", "attention", "checkpointing", "batch",
              "seq", "compiled", "logits")
    # A training case without `use_cache` was measured before `no_cache`: with the config's
    # default, the cache on.
    job = lambda c: tuple(c.get(k) for k in fields) + (c.get("use_cache", c["mode"] == "train"),)  # noqa: E731
    fresh = {job(c): c for c in run["cases"]}
    missing = set(fresh) - {job(c) for c in doc["cases"]}
    if missing:
        raise SystemExit(f"{path} has no case {sorted(missing)[0]}")
    doc["cases"] = [fresh.get(job(c), c) for c in doc["cases"]]
    doc["note"] = (doc.get("note", "") + f" {len(fresh)} cases measured again with torch {run['torch']}, "
                   f"transformers {run['transformers']} ({run['seconds']} s).").strip()
    return doc


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", help="run only cases of this family")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--shard", default="0/1", help="I/N: run every N-th case from the I-th (for parallel runs)")
    ap.add_argument("--size", help="run only cases of this config size (base, wide, deep)")
    ap.add_argument("--logits", help="run only inference cases keeping these logits (last)")
    ap.add_argument("--compiled", action="store_true", help="run only the torch.compile'd cases")
    ap.add_argument("--precision", help="run only cases at this precision (fp32, bf16, amp)")
    ap.add_argument("--checkpointed", action="store_true", help="run only cases with gradient checkpointing")
    ap.add_argument("--merge", nargs="+", help="result files whose cases to join into --out (no run)")
    ap.add_argument("--attention", help="run only cases with this attention (eager, sdpa)")
    ap.add_argument("--uncheckpointed", action="store_true", help="run only cases without checkpointing")
    ap.add_argument("--training", action="store_true", help="run only training steps not torch.compile'd")
    ap.add_argument("--use-cache", action="store_true",
                    help="build the training steps' models with the config's use_cache left on (transformers' "
                         "default), as the templates recorded with step_programs.py --use-cache; the rows say "
                         "use_cache: true (add them to an output with --merge)")
    ap.add_argument("--replace", help="an earlier output: the cases run here take the places of its cases of the "
                                      "same job, and the whole is written to --out")
    a = ap.parse_args()
    if a.merge:
        merged = None
        for part in a.merge:
            with open(part) as f:
                doc = json.load(f)
            if merged is None:
                merged = doc
            else:
                merged["cases"] += doc["cases"]
                merged["seconds"] = round(merged["seconds"] + doc["seconds"], 1)
        with open(a.out, "w") as f:
            json.dump(merged, f, indent=1)
            f.write("\n")
        return
    torch.set_num_threads(1)
    method = check_method()
    configs = small_configs()
    results = []
    cases = grid()
    if a.only:
        cases = [c for c in cases if c["family"] == a.only]
    if a.size:
        cases = [c for c in cases if c["size"] == a.size]
    if a.logits:
        cases = [c for c in cases if c.get("logits") == a.logits]
    if a.compiled:
        cases = [c for c in cases if c.get("compiled")]
    if a.precision:
        cases = [c for c in cases if c["precision"] == a.precision]
    if a.checkpointed:
        cases = [c for c in cases if c["checkpointing"]]
    if a.uncheckpointed:
        cases = [c for c in cases if not c.get("checkpointing")]
    if a.attention:
        cases = [c for c in cases if c.get("attention") == a.attention]
    if a.training:
        cases = [c for c in cases if c["mode"] == "train" and not c.get("compiled")]
    i, n = (int(x) for x in a.shard.split("/"))
    cases = cases[i::n]
    if a.limit:
        cases = cases[: a.limit]
    start = time.time()
    for i, c in enumerate(cases):
        cfg = configs[(c["family"], c["size"])]
        try:
            if c["mode"] == "train" and c.get("compiled"):
                r = compiled_case(c, cfg)
            elif c["mode"] == "train":
                r = train_case(c["family"], cfg, c["head"], c["precision"], c["optimizer"], c["attention"],
                               c["checkpointing"], c["batch"], c["seq"], use_cache=a.use_cache)
            else:
                r = infer_case(c["family"], cfg, c["head"], c["precision"], c["attention"], c["batch"], c["seq"],
                               c.get("logits", "all"))
        except Exception as e:  # a combination a family does not support: recorded, not measured
            r = {"error": f"{type(e).__name__}: {e}"[:300]}
        results.append({**c, "config": cfg, **r})
        print(f"[{i + 1}/{len(cases)}] {c} -> {r.get('peak_bytes', r.get('error'))}", file=sys.stderr, flush=True)
    out = {
        "about": "CPU ground truth for headroom plan: scripts/validate/measure.py",
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "python": platform.python_version(),
        "method_check": method,
        "seconds": round(time.time() - start, 1),
        "cases": results,
    }
    if a.replace:
        out = replaced(a.replace, out)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The step recorder against the CPU: each job's live peak as `headroom_gpu`'s recorder records it
under fake tensors, beside the same step run with real tensors and measured by the profiler's
allocator events (scripts/validate/measure.py's method).

    PYTHONPATH=python python3 scripts/validate/recorder_truth.py --out data/validation/recorder_truth.json

A job is a model built from a small config with measure.py's `build` (random weights, dropout
off), its inputs (`inputs`), and either a training step (torch.optim.AdamW with foreach, the
loss's backward, the optimizer step, `zero_grad(set_to_none=True)`; full fine-tuning or peft's
LoRA over every linear layer), an inference forward (`torch.no_grad()`, `use_cache=True`, all
positions' logits), or generate's prefill and decode steps (`headroom_gpu.transformers_step.generate`,
as `record --generate` runs them).

The two sides run the same code on the same objects:
- **CPU**: measure.py's method. A warm-up step, then the profiled one; the peak is the bytes of
  the storages alive when it starts (weights, buffers, optimizer state, inputs) plus the highest
  running sum of the allocator's events in it.
- **recorder**: `StepRecorder(route_sdpa=False)` around the same build and the same two steps,
  under fake tensors; the peak is the highest live bytes of the recording in the second step.
  Attention is left to the CPU's own SDPA choice, as the CPU run takes it (routing it as a GPU
  does is the GPU rule, validated against GPUs elsewhere); everything else is the recorder as
  `python -m headroom_gpu record` runs it.

Mixture-of-experts families run transformers' default experts implementation (`grouped_mm`),
whose tensors' sizes do not depend on the routing; the recorder's routing assumption is not
what is checked here.

What is compared: the storages of more than 8 bytes (`SCALAR`), on both sides. A CPU kernel
makes each Python number it is called with into a 0-dim tensor of its own (8 bytes, then 4 or 2
in the operator's dtype: `mul_(x, 0.9)` in the optimizer's foreach loop allocates both), where a
CUDA kernel takes the number as an argument and allocates nothing; fake tensors run no kernel and
see none. Leaving out every storage of at most 8 bytes on both sides leaves out those, and with
them the few 0-dim tensors of the step itself (the loss, AdamW's step counts, which PyTorch keeps
on the CPU even for a GPU's parameters). The JSON keeps the peaks with every storage too
(`*_all_bytes`), and their difference.

Split, declared before any run: the jobs of Llama and GPT-2 (the families the recorder was
built on) are `tuning`; every other job is `check`. "Exact" is equal to the byte.
"""

import argparse
import gc
import json
import os
import platform
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import measure  # noqa: E402
from torch.profiler import record_function  # noqa: E402

TUNING = ("llama", "gpt2")


def configs():
    """measure.py's base configs, and the families it does not build, made the same way."""
    base = {f: c for (f, size), c in measure.small_configs().items() if size == "base"}
    llama, gemma = base["llama"], base["gemma"]
    base["qwen3"] = dict(llama, model_type="qwen3", num_key_value_heads=2, use_sliding_window=False)
    base["qwen2_moe"] = dict(llama, model_type="qwen2_moe", num_key_value_heads=2, num_experts=4,
                             num_experts_per_tok=2, moe_intermediate_size=192, shared_expert_intermediate_size=320,
                             decoder_sparse_step=1, use_sliding_window=False)
    base["qwen3_moe"] = dict(llama, model_type="qwen3_moe", num_key_value_heads=2, num_experts=4,
                             num_experts_per_tok=2, moe_intermediate_size=192, decoder_sparse_step=1)
    base["gemma2"] = dict(gemma, model_type="gemma2", num_key_value_heads=2, query_pre_attn_scalar=96,
                          sliding_window=128)
    base["gemma3_text"] = dict(gemma, model_type="gemma3_text", num_key_value_heads=2, query_pre_attn_scalar=96,
                               sliding_window=128)
    base.pop("gpt_bigcode", None)
    return base


FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
            "gemma3_text", "phi3", "gpt2", "gpt_neox", "bloom", "bert", "t5")
HEAD = {"bert": "masked-lm", "t5": "seq2seq-lm"}


def has_sdpa(family, head):
    """Whether transformers' model class of this family offers SDPA attention."""
    import transformers
    from transformers.models.auto import modeling_auto as auto

    names = {"causal-lm": auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, "masked-lm": auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
             "seq2seq-lm": auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES}[head]
    cls = getattr(transformers, names[family])
    return family not in measure.NO_SDPA and bool(getattr(cls, "_supports_sdpa", False))


def jobs():
    """Every family: full fine-tuning with each attention it has, LoRA, and the inference forward
    (decoders), in fp32 at 2 x 128; bf16 full fine-tuning of every family at 1 x 64; and generate's
    prefill of 2 x 64 and 4 decode steps (decoders, fp32)."""
    out = []
    for family in FAMILIES:
        head = HEAD.get(family, "causal-lm")
        attns = ("sdpa", "eager") if has_sdpa(family, head) else ("eager",)
        for attn in attns:
            out.append(dict(mode="train", family=family, head=head, precision="fp32", attention=attn, lora=None,
                            batch=2, seq=128))
        out.append(dict(mode="train", family=family, head=head, precision="fp32", attention=attns[0], lora=4,
                        batch=2, seq=128))
        out.append(dict(mode="train", family=family, head=head, precision="bf16", attention=attns[0], lora=None,
                        batch=1, seq=64))
        if head == "causal-lm":
            out.append(dict(mode="infer", family=family, head=head, precision="fp32", attention=attns[0], lora=None,
                            batch=2, seq=128))
            out.append(dict(mode="generate", family=family, head=head, precision="fp32", attention=attns[0],
                            lora=None, batch=2, seq=64, new_tokens=4))
    for j in out:
        j["split"] = "tuning" if j["family"] in TUNING else "check"
    return out


def _model(job, cfg):
    dtype = torch.bfloat16 if job["precision"] == "bf16" else torch.float32
    model = measure.build(cfg, job["head"], job["attention"], dtype)
    if job["lora"]:
        import peft

        lora = peft.LoraConfig(r=job["lora"], lora_alpha=2 * job["lora"], target_modules="all-linear",
                               lora_dropout=0.0)
        model = peft.get_peft_model(model, lora)
    if job["mode"] != "train":
        model.eval()
    return model


def _step_fn(job, cfg, model):
    """The step both sides run, and the tensors alive when it starts that measure.py counts."""
    batch = measure.inputs(cfg, job["head"], job["batch"], job["seq"])
    if job["mode"] == "generate":
        from headroom_gpu.transformers_step import generate

        batch = {"input_ids": batch["input_ids"]}

        def step():
            with torch.no_grad(), record_function("forward"):
                generate(model, model.config, batch["input_ids"], job["new_tokens"])

        return step, batch, None
    if job["mode"] == "infer":
        batch = {"input_ids": batch["input_ids"]}

        def step():
            with torch.no_grad(), record_function("forward"):
                out = model(**batch, use_cache=True)
                return out.logits.shape

        return step, batch, None
    opt = measure.optimizer("adamw", [p for p in model.parameters() if p.requires_grad])

    def step():
        with record_function("forward"):
            loss = model(**batch).loss
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            opt.step()
        with record_function("zero_grad"):
            opt.zero_grad(set_to_none=True)

    return step, batch, opt


SCALAR = 8


def profiled(fn, least):
    """measure.py's `profiled`: the highest running sum of the profiler's allocator events while
    fn() runs, counting only blocks of more than `least` bytes."""
    from torch.profiler import ProfilerActivity, profile

    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = prof.profiler.kineto_results.events()
    mem = sorted((e.start_ns(), i, e.nbytes()) for i, e in enumerate(events) if e.name() == "[memory]")
    live = peak = 0
    for _, _, nbytes in mem:
        if abs(nbytes) > least:
            live += nbytes
            peak = max(peak, live)
    return peak


def storage_bytes(tensors, least):
    seen = {}
    for t in tensors:
        s = t.untyped_storage()
        if s.nbytes() > least:
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def cpu_peak(job, cfg, least):
    """measure.py's measurement of the step's live peak, with real tensors, of the storages of
    more than `least` bytes."""
    torch.manual_seed(0)
    model = _model(job, cfg)
    step, batch, opt = _step_fn(job, cfg, model)
    step()  # the first makes the optimizer's state
    gc.collect()
    alive = list(model.parameters()) + list(model.buffers()) + list(batch.values())
    if opt is not None:
        alive += list(measure.state_tensors(opt))
    return storage_bytes(alive, least) + profiled(step, least)


def recorded_peak(job, cfg):
    """The recorder's live peak in the second step, under fake tensors: of the storages of more
    than SCALAR bytes, and of every storage."""
    from headroom_gpu.recorder import StepRecorder

    with StepRecorder(route_sdpa=False) as rec:
        torch.manual_seed(0)
        model = _model(job, cfg)
        step, _, _ = _step_fn(job, cfg, model)
        for _ in range(2):
            with rec.step():
                step()
    return [second_step_peak(rec, least) for least in (SCALAR, 0)], rec.assumptions


def second_step_peak(rec, least):
    """The live peak of `rec`'s second step, counting storages of more than `least` bytes: the
    bytes live as it starts, then the most live at any event of it or after."""
    start = rec._step_starts[1][0]
    live = peak = 0
    for i, (op, r) in enumerate(rec.events):
        if r.size > least:
            live += r.size if op == "alloc" else -r.size
        if i + 1 == start:
            peak = live
        elif i >= start:
            peak = max(peak, live)
    return peak


def run(job, cfgs):
    cfg = cfgs[job["family"]]
    t = time.time()
    (recorded, recorded_all), assumptions = recorded_peak(job, cfg)
    t_rec = time.time() - t
    measured, measured_all = cpu_peak(job, cfg, SCALAR), cpu_peak(job, cfg, 0)
    return {**job, "cpu_peak_bytes": measured, "recorded_peak_bytes": recorded, "exact": recorded == measured,
            "error": (recorded - measured) / measured, "cpu_peak_all_bytes": measured_all,
            "recorded_peak_all_bytes": recorded_all, "all_difference_bytes": recorded_all - measured_all,
            "assumptions": assumptions, "record_s": round(t_rec, 2)}


def table(path):
    """docs/VALIDATION.md's table of a result file: a row a family, tuning rows first."""
    with open(path) as f:
        doc = json.load(f)
    rows = ["| split | family | jobs | exact | CPU peaks | largest difference |", "|---|---|---:|---:|---|---:|"]
    for split in ("tuning", "check"):
        for family in FAMILIES:
            js = [j for j in doc["jobs"] if j["split"] == split and j["family"] == family]
            if not js:
                continue
            exact = sum(1 for j in js if j["exact"])
            peaks = [j["cpu_peak_bytes"] for j in js if "cpu_peak_bytes" in j]
            worst = max((abs(j["recorded_peak_bytes"] - j["cpu_peak_bytes"]) for j in js if "cpu_peak_bytes" in j),
                        default=0)
            span = f"{min(peaks) / 2**20:.1f}–{max(peaks) / 2**20:.1f} MiB" if peaks else "—"
            rows.append(f"| {split} | {family} | {len(js)} | {exact} | {span} | {worst} B |")
    kinds = (("full fine-tuning, fp32", lambda j: j["mode"] == "train" and not j["lora"] and j["precision"] == "fp32"),
             ("full fine-tuning, bf16", lambda j: j["mode"] == "train" and j["precision"] == "bf16"),
             ("LoRA, fp32", lambda j: bool(j["lora"])), ("inference forward, fp32", lambda j: j["mode"] == "infer"),
             ("generate: prefill and 4 decode steps, fp32", lambda j: j["mode"] == "generate"))
    for split in ("tuning", "check"):
        for name, kind in kinds:
            js = [j for j in doc["jobs"] if j["split"] == split and kind(j)]
            rows.append(f"| {split} | {name} | {len(js)} | {sum(1 for j in js if j['exact'])} | | |")
        js = [j for j in doc["jobs"] if j["split"] == split]
        rows.append(f"| **{split}** | all | **{len(js)}** | **{sum(1 for j in js if j['exact'])}** | | |")
    print("\n".join(rows))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="the result file to write")
    ap.add_argument("--only", help="run only jobs of this family")
    ap.add_argument("--mode", help="run only jobs of this mode (train, infer, generate)")
    ap.add_argument("--into", metavar="FILE", help="a result file whose jobs the jobs run replace or join (in the "
                                                   "grid's order), written to --out")
    ap.add_argument("--table", metavar="FILE", help="print docs/VALIDATION.md's table of a result file (no run)")
    a = ap.parse_args()
    if a.table:
        table(a.table)
        return
    if not a.out:
        ap.error("--out FILE: where to write the results (or --table FILE to print a table of them)")
    torch.set_num_threads(1)
    measure.check_method()
    cfgs = configs()
    todo = [j for j in jobs() if (not a.only or j["family"] == a.only) and (not a.mode or j["mode"] == a.mode)]
    results = []
    start = time.time()
    for i, job in enumerate(todo):
        try:
            r = run(job, cfgs)
        except Exception as e:  # a combination a family does not support: kept, and counted as not exact
            r = {**job, "exact": False, "failed": f"{type(e).__name__}: {e}"[:300]}
        results.append(r)
        print(f"[{i + 1}/{len(todo)}] {job['family']} {job['mode']} {job['precision']} {job['attention']} "
              f"lora={job['lora']}: cpu {r.get('cpu_peak_bytes')} recorded {r.get('recorded_peak_bytes')} "
              f"{'exact' if r['exact'] else r.get('failed', 'OFF')} (all storages: {r.get('all_difference_bytes')} B)", file=sys.stderr, flush=True)
    seconds = round(time.time() - start, 1)
    if a.into:
        with open(a.into) as f:
            earlier = json.load(f)
        def key(j):
            return tuple(j.get(k) for k in ("mode", "family", "head", "precision", "attention", "lora", "batch", "seq",
                                             "new_tokens"))

        by_key = {key(j): j for j in earlier["jobs"]} | {key(r): r for r in results}
        results = [by_key[key(j)] for j in jobs() if key(j) in by_key]
        seconds = round(seconds + earlier["seconds"], 1)
    summary = {split: {"jobs": sum(1 for r in results if r["split"] == split),
                       "exact": sum(1 for r in results if r["split"] == split and r["exact"])}
               for split in ("tuning", "check")}
    out = {"about": "the recorder's live peak against the same step measured on CPU: "
                    "scripts/validate/recorder_truth.py",
           "torch": torch.__version__, "transformers": __import__("transformers").__version__,
           "peft": __import__("peft").__version__, "python": platform.python_version(),
           "tuning_families": list(TUNING), "seconds": seconds, "summary": summary,
           "jobs": results}
    if a.into:
        out["runs"] = earlier.get("runs", "the grid") + f"; then {len(todo)} jobs run again or added (--into)"
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(json.dumps(summary), file=sys.stderr)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""What a Hugging Face transformers forward with a cache holds at each moment, per token, by
family, precision and attention kernel: the inference recipes `headroom plan --infer
--framework hf` uses.

A forward of a causal LM with `use_cache=True` under `torch.no_grad()` (an evaluation
loop's forward: every position's logits) allocates the same sequence of tensors for every
batch and length. This script records that sequence with the profiler's memory timeline
for each family's base config (the tuning config of measure.py, adjusted by
`measure.recording_config` where it would hide a term) at three shapes, and for
every allocation in the last layer and after it (final norm, head) writes what is alive at
that moment, less the weights and the input ids, in the model's dimensions:

- `per_layer`: what each earlier layer left behind (its keys and values in the cache);
- `once`: everything else alive, as bytes per token per unit (h, q, kv, f, V... as in
  recipes.py), with `heads_s` for s x s matrices with a head axis (eager attention's scores),
  `s` for those without (the causal mask), and `q_rep` for the keys and values `repeat_kv`
  copies once per query head (only where 1 < key-value heads < heads: with one key-value
  head the copy is a view, with as many as heads there is none; a base config with either
  is measured with half as many key-value heads as heads), and `qkv` for a fused projection's
  output (q + 2 kv wide);
- `once_per_position`: what does not grow with the batch (rotary tables), per position.

The planner evaluates every moment at the asked shape and takes the largest, so whichever
tensor dominates at that shape -- eager attention's scores at long sequences, the logits at
large vocabularies -- decides the peak as it does in PyTorch. Moments that another moment
dominates unit by unit are dropped. A tensor that fits no unit stops the run.

    .venv/bin/python scripts/validate/infer_recipes.py --out data/recipes/hf_inference.json
    .venv/bin/python scripts/validate/infer_recipes.py --out data/recipes/hf_inference.json --only gpt_bigcode --merge
"""

import argparse
import contextlib
import json
import re
import sys

import torch
from torch.profiler import ProfilerActivity, profile, record_function
from torch.profiler._memory_profiler import Action

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import measure  # noqa: E402
import recipes  # noqa: E402

# Projections that compute queries, keys and values in one matrix multiply.
FUSED_QKV = ("qkv_proj", "query_key_value", "c_attn")
LAYER = re.compile(r"(?:.*\.)?(?:layers|h)\.(\d+)")


def timeline(family, precision, attn, batch, seq, last):
    """[(layer index or None, allocation key, bytes, is_create, `repeat_kv`/`fused_qkv` or None)]
    in order, for
    one forward after a warm-up; and the model's dimensions and layer count."""
    cfg = measure.recording_config(family)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    model = measure.build(cfg, "causal-lm", attn, dtype).eval()
    ids = measure.inputs(cfg, "causal-lm", batch, seq)["input_ids"]
    layers = 0
    for name, m in model.named_modules():
        if name.rsplit(".", 1)[-1] in FUSED_QKV:
            m.register_forward_pre_hook(lambda m, a: setattr(m, "_fused", record_function("fused_qkv").__enter__()))
            m.register_forward_hook(lambda m, a, o: m._fused.__exit__(None, None, None))
        hit = LAYER.fullmatch(name)
        if hit:
            layers = max(layers, int(hit.group(1)) + 1)

            def pre(m, a, n=hit.group(1)):
                m._range = record_function(f"layer:{n}")
                m._range.__enter__()

            m.register_forward_pre_hook(pre)
            m.register_forward_hook(lambda m, a, o: m._range.__exit__(None, None, None))

    # generate's first forward computes the last position's logits only.
    extra = {"logits_to_keep": 1} if last else {}

    def forward():
        with torch.no_grad(), repeats_marked():
            model(input_ids=ids, use_cache=True, **extra)

    forward()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        forward()
    ranges = [(int(e.name()[6:]), e.start_ns(), e.end_ns()) for e in prof.profiler.kineto_results.events()
              if e.name().startswith("layer:")]
    marked = [(e.name(), e.start_ns(), e.end_ns()) for e in prof.profiler.kineto_results.events()
              if e.name() in ("repeat_kv", "fused_qkv")]

    def layer_at(t):
        for n, start, end in ranges:
            if start <= t <= end:
                return n
        # After the last layer's range began: the final norm and the head.
        return None if not ranges or t < min(s for _, s, _ in ranges) else layers

    events = []
    for t, action, (key, _), nbytes in prof._memory_profile().timeline:
        if action == Action.CREATE:
            tag = next((name for name, start, end in marked if start <= t <= end), None)
            events.append((layer_at(t), key, nbytes, True, tag))
        elif action == Action.DESTROY:
            events.append((layer_at(t), key, nbytes, False, None))
    return events, recipes.dims(model, cfg), layers


@contextlib.contextmanager
def repeats_marked(mark=record_function):
    """Marks transformers' `repeat_kv` (keys and values copied once per query head) with
    `mark("repeat_kv")` (a profiler range, or a recorder's own mark), so its copies are told
    apart from the queries of the same size."""
    patched = []
    for name, mod in list(sys.modules.items()):
        fn = getattr(mod, "repeat_kv", None) if name.startswith("transformers.") else None
        if callable(fn) and not getattr(fn, "_marked", False):
            def marked(*args, _fn=fn, **kwargs):
                with mark("repeat_kv"):
                    return _fn(*args, **kwargs)
            marked._marked = True
            setattr(mod, "repeat_kv", marked)
            patched.append((mod, fn))
    try:
        yield
    finally:
        for mod, fn in patched:
            setattr(mod, "repeat_kv", fn)


def moments(events, layers):
    """For each allocation in the last layer and after it: the live tensors then, as
    [(layer they were made in, or None before the layers, bytes, tag)] in creation order."""
    live = {}
    out = []
    for where, key, nbytes, create, tag in events:
        if create:
            live[key] = (where, nbytes, tag)
            if where is not None and where >= layers - 1:
                out.append(list(live.values()))
        else:
            live.pop(key, None)
    return out


def scales(n1, n2, n3, b, s1, s2):
    """Whether a tensor grows as batch x sequence, the sequence alone, s x s, or the batch
    alone."""
    grow, per_batch = n2 / n1, n3 / n1 * b
    if abs(grow - 1) < 1e-9 and abs(per_batch - 3) < 1e-9:
        return True
    by_batch = abs(per_batch - b) < 1e-9 or abs(per_batch - 3) < 1e-9
    return by_batch and (abs(grow - s2 / s1) < 1e-9 or abs(grow - (s2 / s1) ** 2) < 1e-9)


def classify(n1, n2, n3, b, s1, s2, d, w, what):
    """(kind, unit, bytes per unit) of one tensor seen at (b, s1), (b, s2) and (3, s1):
    kind `token` (grows with batch x sequence) or `position` (with the sequence alone)."""
    grow, per_batch = n2 / n1, n3 / n1 * b
    square = abs(grow - (s2 / s1) ** 2) < 1e-9
    if abs(grow - 1) < 1e-9 and abs(per_batch - 3) < 1e-9:
        # Per sequence, whatever its length: generate's last-position logits.
        c = recipes.classify(n1 / b, w, d, False)
        if c is None:
            raise SystemExit(f"{what}: {n1 / b} bytes a sequence fit no unit of {d}")
        return ("sequence",) + c
    if abs(per_batch - b) < 1e-9:
        kind, per = "position", n1 / s1
    elif abs(per_batch - 3) < 1e-9:
        kind, per = "token", n1 / (b * s1)
    else:
        raise SystemExit(f"{what}: a tensor of {n1} bytes grows {per_batch / b}x from batch {b} to 3")
    if per <= 8 and not square:
        return kind, "one", per  # ids, positions, a norm's statistics: no model dimension is this small
    if square:
        c = per / s1 / w
        if abs(c - 1) < 1e-9:
            return kind, "s", float(w)
        if abs(c - d["heads"]) < 1e-9:
            return kind, "heads_s", float(w)
        raise SystemExit(f"{what}: an s x s tensor of {c} elements a position fits neither 1 nor heads")
    if abs(grow - s2 / s1) > 1e-9:
        raise SystemExit(f"{what}: a tensor of {n1} bytes grows {grow}x with the sequence")
    c = recipes.classify(per, w, d, False)
    if c is None:
        raise SystemExit(f"{what}: {per} bytes a {kind} ({w}-byte elements) fit no unit of {d}")
    return (kind,) + c


def recipe(family, precision, attn, last):
    b, s1, s2 = 2, 80, 136
    runs = [timeline(family, precision, attn, bb, ss, last) for bb, ss in ((b, s1), (b, s2), (3, s1))]
    d, layers = runs[0][1], runs[0][2]
    elem = 2 if precision == "bf16" else 4
    what = f"{family}/{precision}/{attn}"
    found = [moments(r[0], layers) for r in runs]
    if not len(found[0]) == len(found[1]) == len(found[2]):
        raise SystemExit(f"{what}: the forward allocates differently at different shapes")
    out = []
    for m1, m2, m3 in zip(*found):
        if not len(m1) == len(m2) == len(m3):
            raise SystemExit(f"{what}: a moment holds different tensors at different shapes")
        first_layer, last_before = {}, {}
        once, once_pos, once_seq = {}, {}, {}
        current = layers - 1 if any(w == layers - 1 for w, _, _ in m1) and all(
            w is None or w <= layers - 1 for w, _, _ in m1) else layers
        for (where, n1, tag), (_, n2, _), (_, n3, _) in zip(m1, m2, m3):
            if n1 == n2 == n3 and n1 <= 4096:
                continue  # positions, counters: bytes, not a term
            if max(n1, n2, n3) <= 65536 and not scales(n1, n2, n3, b, s1, s2):
                # A kernel's scratch sized by its blocking, not by the tensors (the CPU's
                # flash attention): kilobytes, not a term.
                continue
            # Element width: the model's, except index tensors (int64) and masks (bool) where
            # the bytes say so; classify tries the model's width first.
            widths = [elem] + [w for w in (4, 8, 1, 2) if w != elem]
            if tag == "fused_qkv":
                widths, kind, u, v = [], "token" if abs(n3 / n1 - 1.5) < 1e-9 else "position", None, None
            for i, w in enumerate(widths):
                try:
                    kind, u, v = classify(n1, n2, n3, b, s1, s2, d, w, what)
                    break
                except SystemExit:
                    if i == len(widths) - 1:
                        raise
            if tag == "fused_qkv":
                # One projection for queries, keys and values: q + 2 kv wide, which no single
                # unit follows when the key-value heads change.
                width = d["q"] + 2 * d["kv"]
                per_elem = (n1 / (b * s1)) / width
                if abs(per_elem - round(per_elem)) > 1e-9 or kind != "token":
                    raise SystemExit(f"{what}: a fused projection of {n1} bytes is not q + 2 kv wide")
                u, v = "qkv", per_elem
            if tag == "repeat_kv":
                if d[u] != d["q"]:  # (Mixtral's base MLP width equals heads x head dim)
                    raise SystemExit(f"{what}: repeat_kv made a tensor of unit {u}, not heads x head dim")
                u = "q_rep"  # there only when 1 < key-value heads < heads
            if where == 0 and current > 0:
                bucket = first_layer
            elif where == current - 1 and current > 1:
                bucket = last_before
            elif where is not None and 0 < where < current - 1:
                continue  # the middle layers repeat the first's
            else:
                bucket = {"token": once, "position": once_pos, "sequence": once_seq}[kind]
            bucket[u] = bucket.get(u, 0) + v
        # The layer before the current one left what every earlier layer left (the cache)
        # and the stream (its output): the difference is counted once.
        for u, v in last_before.items():
            extra = v - first_layer.get(u, 0)
            if extra < 0:
                raise SystemExit(f"{what}: the layer before holds less than the first")
            if extra:
                once[u] = once.get(u, 0) + extra
        out.append({"in_last_layer": current == layers - 1, "per_layer": first_layer,
                    "once": once, "once_per_position": once_pos, "once_per_sequence": once_seq})
    return {"moments": pareto(out)}


def pareto(moments):
    """The moments no other moment dominates term by term."""
    def terms(m):
        t = {("L", u): v for u, v in m["per_layer"].items()}
        t |= {("T", u): v for u, v in m["once"].items()}
        t |= {("P", u): v for u, v in m["once_per_position"].items()}
        t |= {("S", u): v for u, v in m["once_per_sequence"].items()}
        return t

    def dominated(a, b):
        ta, tb = terms(a), terms(b)
        return (a["in_last_layer"] or not b["in_last_layer"]) and all(v <= tb.get(k, 0) for k, v in ta.items())

    kept = []
    for i, m in enumerate(moments):
        if any(j != i and dominated(m, o) and (not dominated(o, m) or j < i) for j, o in enumerate(moments)):
            continue
        kept.append(m)
    return kept


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only")
    ap.add_argument("--merge", action="store_true",
                    help="keep the other recipes already in --out (with --only: record one family)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    out = {}
    if a.merge:
        with open(a.out) as f:
            out = json.load(f)["recipes"]
    # GPTBigCode is planned for inference only: training plans none of its steps.
    for family in measure.DECODERS + ["gpt_bigcode"]:
        if a.only and family != a.only:
            continue
        for precision in ("fp32", "bf16"):
            for attn in ("eager",) if family in measure.NO_SDPA else ("eager", "sdpa"):
                for last in (False, True):
                    r = recipe(family, precision, attn, last)
                    out[f"{family}/{precision}/{attn}" + ("/last" if last else "")] = r
                    print(family, precision, attn, "last" if last else "all", len(r["moments"]), "moments",
                          file=sys.stderr, flush=True)
    versions = {"torch": torch.__version__, "transformers": __import__("transformers").__version__}
    doc = {"about": "What a transformers forward with a cache holds, per token: scripts/validate/infer_recipes.py",
           **versions, "recipes": out}
    if a.merge:
        # The other families keep the versions they were recorded with; this one says its own.
        with open(a.out) as f:
            old = json.load(f)
        doc.update({k: old[k] for k in ("torch", "transformers")})
        doc["recorded_apart"] = dict(old.get("recorded_apart", {}), **{a.only or "all": versions})
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()

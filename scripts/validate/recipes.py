#!/usr/bin/env python3
"""What Hugging Face transformers keeps for the backward, per token, by family, precision and
attention kernel: the activation recipes `headroom plan` uses for Hugging Face training.

For each family's base config (the tuning config of measure.py) it runs one forward with the
loss under `torch.autograd.graph.saved_tensors_hooks`, collects every distinct storage
autograd saves (parameters excluded), and expresses each in the model's dimensions:
elements per token as a small multiple of one of h (hidden), f (MLP width), q (heads x head
dim), kv (key-value heads x head dim), kf and kh (the MLP width and hidden size times the
experts a token is routed to), heads, kv_heads, d (head dim), V (vocabulary), E (experts),
k (experts per token) or 1; or, for the s x s attention matrices of eager attention, heads x
s per token (found by running two sequence lengths). Tensors of a fixed size (AMP's 16-bit
weight copies) are counted as bytes per parameter of the linear layers they copy. A tensor
that fits no unit stops the run: the recipe must account for every byte.

    .venv/bin/python scripts/validate/recipes.py --out data/recipes/hf_activations.json

Output, per "family/precision/attention": `layer`, `outside` (embeddings, final norm, head,
loss) and `layer_checkpointed` (with gradient checkpointing) as {unit: bytes per unit per
token}, and `layer_weight_copy` / `outside_weight_copy` as bytes per linear parameter.

`--compiled` adds, per decoder at fp32, "family/fp32/attention/compiled": what the step run
through torch.compile saves, recorded on the config and on the config with one layer more
(module hooks do not run inside a compiled graph, so a layer's share is their difference).
"""

import argparse
import json
import re
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import measure  # noqa: E402

UNIT_ORDER = ["h", "f", "q", "kv", "kf", "kh", "heads", "kv_heads", "d", "V", "one", "E", "k"]


def dims(model, cfg):
    c = model.config
    h = getattr(c, "hidden_size", None) or getattr(c, "n_embd", None) or c.d_model
    heads = getattr(c, "num_attention_heads", None) or getattr(c, "n_head", None) or c.num_heads
    head_dim = getattr(c, "head_dim", None) or getattr(c, "d_kv", None) or h // heads
    # GPTBigCode says `multi_query` (one key-value head) instead of a count.
    kv_heads = 1 if getattr(c, "multi_query", False) else getattr(c, "num_key_value_heads", None) or heads
    f = getattr(c, "intermediate_size", None) or getattr(c, "n_inner", None) or getattr(c, "d_ff", None) or 4 * h
    experts = getattr(c, "num_local_experts", 1) or 1
    k = getattr(c, "num_experts_per_tok", 1) if experts > 1 else 1
    return {"h": h, "f": f, "q": heads * head_dim, "kv": kv_heads * head_dim, "kf": k * f, "kh": k * h,
            "heads": heads, "kv_heads": kv_heads, "d": head_dim, "V": c.vocab_size, "E": experts, "k": k, "one": 1}


def saved(family, precision, attn, batch, seq, checkpointing):
    """[(where, storage bytes, element bytes)] of what autograd saves, parameters excluded, and
    the model's dimensions and the element counts of its linear layers' weights."""
    cfg = measure.small_configs()[(family, "base")]
    head = "causal-lm" if family in measure.DECODERS else ("masked-lm" if family == "bert" else "seq2seq-lm")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    model = measure.build(cfg, head, attn, dtype)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    inputs = measure.inputs(cfg, head, batch, seq)
    stack = ["top"]
    for name, m in model.named_modules():
        if name:
            m.register_forward_pre_hook(lambda m, a, n=name: stack.append(n))
            m.register_forward_hook(lambda m, a, o: (stack.pop(), None)[1])
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in seen and st.data_ptr() not in params and st.nbytes() > 0:
            seen[st.data_ptr()] = (stack[-1], st.nbytes(), t.element_size())
        return t

    torch.manual_seed(0)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if precision == "amp":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                model(**inputs).loss
        else:
            model(**inputs).loss
    linear = {}
    sizes = set()
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D":
            where = place(name)
            linear[where] = linear.get(where, 0) + m.weight.numel()
            sizes.add(m.weight.numel())
    for name, p in model.named_parameters():
        if p.dim() == 3:  # stacked expert weights
            where = place(name)
            linear[where] = linear.get(where, 0) + p.numel()
            sizes.add(p.numel())
    return list(seen.values()), dims(model, cfg), linear, sizes


def place(module):
    """`layer` for the first layer's modules, `other-layer` for the rest, `outside` otherwise."""
    m = re.search(r"(?:layers|\.h|layer|block)\.(\d+)", module)
    if not m:
        return "outside"
    return "layer" if m.group(1) == "0" else "other-layer"


def classify(nbytes_per_token, width, d, seq_sensitive):
    """(unit, bytes per unit) for a tensor of `nbytes_per_token`."""
    e = round(nbytes_per_token / width, 6)
    if abs(e - round(e)) < 0.05:  # shifted labels: one element more or less than a token each
        e = float(round(e))
    best = None
    for mult in (1, 2, 3, 4, 5, 6, 8):
        for u in UNIT_ORDER:
            if abs(e - mult * d[u]) < 1e-9:
                best = (u, mult * width)
                break
        if best:
            return best
    return None


def recipe(family, precision, attn, checkpointing):
    """Runs the forward at three shapes and classifies each saved tensor by how it grows: with
    batch and sequence (per token: a unit, or heads x s for s x s matrices), with the sequence
    alone (per position: rotary tables), or not at all (weight copies)."""
    # Lengths that equal no dimension of the tuning configs, so no s x s matrix looks like an s x d one.
    b, s1, s2 = 2, 80, 136
    # Batches of 2 and 3: at batch 1 an MQA model's repeated keys and values are views in eager
    # attention (the planner says so apart), which would hide them here.
    runs = [saved(family, precision, attn, bb, ss, checkpointing) for bb, ss in ((b, s1), (b, s2), (3, s1))]
    (first, d, linear, sizes), (second, _, _, _), (single, _, _, _) = runs
    if not len(first) == len(second) == len(single):
        raise SystemExit(f"{family}/{precision}/{attn}: the saved tensors differ in number between shapes")
    out = {"layer": {}, "outside": {}, "layer_per_position": {}, "outside_per_position": {},
           "layer_weight_copy": 0.0, "outside_weight_copy": 0.0}
    copies = {"layer": 0, "outside": 0}
    for (where, n1, w), (_, n2, _), (_, n3, _) in zip(first, second, single):
        where = place(where)
        if where == "other-layer":
            continue
        key = "layer" if where == "layer" else "outside"
        if n1 == n2 == n3:  # a fixed size: a 16-bit copy of a weight (AMP), or a small constant
            if n1 // w in sizes:
                copies[key] += n1
                continue
            if n1 <= 4096:
                continue  # counters and shapes: bytes, not a term
            raise SystemExit(f"{family}/{precision}/{attn}: a fixed tensor of {n1} bytes in {where}")
        per_batch = n3 / n1 * b  # the batch this tensor behaves as if it had at batch 3: 3 per token, b per position
        grow = n2 / n1
        if abs(per_batch - b) < 1e-9:  # the same for every sequence of the batch: per position
            if abs(grow - (s2 / s1) ** 2) < 1e-9:  # T5's relative position bias, heads x s x s
                per = n1 / (s1 * s1 * d["heads"])
                out[key + "_per_position"]["heads_s"] = out[key + "_per_position"].get("heads_s", 0) + per
                continue
            c = classify(n1 / s1, w, d, False)
            if c is None or abs(grow - s2 / s1) > 1e-9:
                raise SystemExit(f"{family}/{precision}/{attn}: a per-position tensor of {n1} bytes in {where}")
            u, v = c
            out[key + "_per_position"][u] = out[key + "_per_position"].get(u, 0) + v
            continue
        if abs(per_batch - 3) > 0.03 * 3:
            raise SystemExit(f"{family}/{precision}/{attn}: a tensor in {where} grows {per_batch}x with batch {b}")
        if abs(grow - (s2 / s1) ** 2) < 1e-9:  # s x s attention matrices
            per = n1 / (b * s1 * s1 * d["heads"])
            out[key]["heads_s"] = out[key].get("heads_s", 0) + per
            continue
        # Shifted labels are one element longer in one layout than the other: a few bytes.
        if abs(grow - s2 / s1) > 0.03 * s2 / s1:
            raise SystemExit(f"{family}/{precision}/{attn}: a tensor in {where} grows {grow}x with the sequence")
        c = classify(n1 / (b * s1), w, d, False)
        if c is None:
            raise SystemExit(f"{family}/{precision}/{attn}: {n1 / (b * s1)} bytes a token ({w}-byte elements) "
                             f"in {where} fit no unit of {d}")
        u, v = c
        out[key][u] = out[key].get(u, 0) + v
    for key in ("layer", "outside"):
        if copies[key]:
            out[key + "_weight_copy"] = copies[key] / linear[key]
    return out


def compiled_saved(family, cfg, attn, batch, seq):
    """[(storage bytes, element bytes)] of what the compiled step saves for its backward,
    parameters excluded. Under torch.compile the modules' hooks run while tracing, not in the
    step, so the saved tensors cannot be placed by module: `compiled_recipe` tells a layer's
    from the rest by adding one."""
    head = "causal-lm"
    model = measure.build(cfg, head, attn, torch.float32)
    inputs = measure.inputs(cfg, head, batch, seq)
    torch._dynamo.reset()
    # One graph per shape, as a training run of fixed shapes compiles it.
    step = torch.compile(model, dynamic=False)
    step(**inputs).loss.backward()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in seen and st.data_ptr() not in params and st.nbytes() > 0:
            seen[st.data_ptr()] = (st.nbytes(), t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step(**inputs).loss
    return list(seen.values())


def isolated_saved(family, cfg, attn, batch, seq):
    """`compiled_saved` in a process of its own (see measure.compiled_case)."""
    import multiprocessing
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(compiled_saved, (family, cfg, attn, batch, seq))


def compiled_units(family, cfg, attn):
    """{unit: bytes per unit per token} over the whole compiled model, each saved tensor
    classified as `recipe` classifies them (three shapes), and the per-position ones apart."""
    b, s1, s2 = 2, 80, 136
    first, second, third = (isolated_saved(family, cfg, attn, bb, ss) for bb, ss in ((b, s1), (b, s2), (3, s1)))
    if not len(first) == len(second) == len(third):
        raise SystemExit(f"{family}/compiled: the saved tensors differ in number between shapes")
    model = measure.build(cfg, "causal-lm", attn, torch.float32)
    d = dims(model, cfg)
    out, per_position = {}, {}
    for (n1, w), (n2, _), (n3, _) in zip(first, second, third):
        per_batch = n3 / n1 * b
        grow = n2 / n1
        if abs(grow - (s2 / s1) ** 2) < 1e-9:  # s x s attention matrices
            out["heads_s"] = out.get("heads_s", 0) + n1 / (b * s1 * s1 * d["heads"])
            continue
        if abs(per_batch - b) < 1e-9:  # per position (rotary tables), or a fixed size
            if abs(grow - 1) < 1e-9:
                if n1 <= 4096:
                    continue
                raise SystemExit(f"{family}/compiled: a fixed tensor of {n1} bytes")
            c = classify(n1 / s1, w, d, False)
            if c is None:
                raise SystemExit(f"{family}/compiled: a per-position tensor of {n1} bytes")
            per_position[c[0]] = per_position.get(c[0], 0) + c[1]
            continue
        if abs(per_batch - 3) > 0.03 * 3 or abs(grow - s2 / s1) > 0.03 * s2 / s1:
            raise SystemExit(f"{family}/compiled: a tensor of {n1} bytes grows {per_batch}x with batch, {grow}x with s")
        c = classify(n1 / (b * s1), w, d, False)
        if c is None:
            raise SystemExit(f"{family}/compiled: {n1 / (b * s1)} bytes a token fit no unit of {d}")
        out[c[0]] = out.get(c[0], 0) + c[1]
    return out, per_position


def compiled_recipe(family, attn):
    """The compiled step's recipe, fp32, no checkpointing: the recording config's saved
    tensors (the base config with every unit a distinct size, as the step recipes are
    recorded) and those of the same config with one layer more; their difference is a layer's."""
    base = measure.recording_config(family)
    deeper = dict(base)
    key = next(k for k in ("num_hidden_layers", "n_layer") if k in deeper)
    layers = deeper[key]
    deeper[key] = layers + 1
    (whole, pos), (whole1, pos1) = compiled_units(family, base, attn), compiled_units(family, deeper, attn)
    diff = lambda a, b: {u: b.get(u, 0) - a.get(u, 0) for u in set(a) | set(b) if b.get(u, 0) != a.get(u, 0)}
    layer, layer_pos = diff(whole, whole1), diff(pos, pos1)
    outside = {u: v - layers * layer.get(u, 0) for u, v in whole.items() if v - layers * layer.get(u, 0) != 0}
    outside_pos = {u: v - layers * layer_pos.get(u, 0) for u, v in pos.items() if v - layers * layer_pos.get(u, 0) != 0}
    for part in (layer, outside, layer_pos, outside_pos):
        if any(v < 0 for v in part.values()):
            raise SystemExit(f"{family}/compiled: a negative term {part}: the layers do not add up")
    # Checkpointing under compile is not recorded: the eager recipe's checkpointed layer stands.
    return {"layer": layer, "outside": outside, "layer_per_position": layer_pos,
            "outside_per_position": outside_pos, "layer_weight_copy": 0.0, "outside_weight_copy": 0.0}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only")
    ap.add_argument("--compiled", action="store_true",
                    help="record the torch.compile recipes (fp32, every decoder) into --out, keeping its others")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.compiled:
        with open(a.out) as f:
            doc = json.load(f)
        for family in measure.DECODERS:
            if a.only and family != a.only:
                continue
            attn = "eager" if family in measure.NO_SDPA else "sdpa"
            eager = doc["recipes"][f"{family}/fp32/{attn}"]
            r = compiled_recipe(family, attn)
            for k in ("layer_checkpointed", "layer_checkpointed_per_position", "layer_checkpointed_weight_copy"):
                r[k] = eager[k]
            doc["recipes"][f"{family}/fp32/{attn}/compiled"] = r
            print(family, "compiled", r, file=sys.stderr, flush=True)
        doc["compiled_torch"] = torch.__version__
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.write("\n")
        return
    recipes = {}
    for family in measure.DECODERS + ["bert", "t5"]:
        if a.only and family != a.only:
            continue
        attns = ("eager",) if family in measure.NO_SDPA else ("eager", "sdpa")
        for precision in ("fp32", "bf16", "amp"):
            for attn in attns:
                r = recipe(family, precision, attn, False)
                ck = recipe(family, precision, attn, True)
                r["layer_checkpointed"] = ck["layer"]
                r["layer_checkpointed_per_position"] = ck["layer_per_position"]
                r["layer_checkpointed_weight_copy"] = ck["layer_weight_copy"]
                recipes[f"{family}/{precision}/{attn}"] = r
                print(family, precision, attn, r, file=sys.stderr, flush=True)
    out = {"about": "What transformers saves for the backward, per token: scripts/validate/recipes.py",
           "torch": torch.__version__, "transformers": __import__("transformers").__version__,
           "recipes": recipes}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()

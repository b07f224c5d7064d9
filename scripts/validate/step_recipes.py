#!/usr/bin/env python3
"""What a Hugging Face transformers training step holds at each moment of its forward and
backward, by family, precision, attention kernel, checkpointing and head: the step recipes
`headroom plan` uses for the forward and backward phases of a transformers step.

A step allocates the same sequence of tensors at every shape. This script records it with
the profiler's memory timeline (forward with the loss, then backward; the optimizer step is
modelled apart) for each family's base config (the tuning config of measure.py, adjusted by
`recording_config` where it would hide a term) at three
shapes, and writes, for the allocations where a peak can fall, what is alive then beyond the
weights, optimizer state and inputs, in the model's dimensions (the units of recipes.py):

- `below`: what each layer under the current one holds (its saved activations or, with
  checkpointing, its input), counted for every such layer;
- `above`: what each layer whose backward is done holds (its weights' gradients),
  counted for every such layer;
- `once`: the rest per token (the current layer's tensors, the loss's, the stream), with
  `heads_s` and `s` for s x s matrices; `once_per_position` for what does not grow with the
  batch; `fixed`: tensors of a fixed size, as bytes per parameter of one layer (`layer`),
  per vocabulary x hidden element (`Vh`: the head's and embedding's gradients and copies),
  per hidden x hidden (`hh`), per position table element (`Ph`) or per vocabulary entry
  (`Vb`: a head's bias).

Moments are taken in the top layer and the bottom one (what every layer holds grows or
shrinks linearly between them), before the first layer's backward (the loss) and after the
last (the embeddings), each with where it is: `forward_top`, `forward_head`,
`backward_head`, `backward_top`, `backward_bottom`, `backward_embed`. T5 has two stacks: its
encoder's blocks are counted apart (`below_enc`, `above_enc`, a `layer_enc` unit) and its
moments include the encoder's top and bottom blocks and the gap between the stacks
(`forward_enc_top`, `forward_mid`, `backward_mid`, `backward_enc_top`,
`backward_enc_bottom`). Moments another dominates term by term are dropped. A tensor that
fits no unit stops the run.

    .venv/bin/python scripts/validate/step_recipes.py --out data/recipes/hf_steps.json   # 40 CPU-minutes
    # or in halves, side by side, then merged:
    .venv/bin/python scripts/validate/step_recipes.py --only llama,qwen2,phi3,gpt2,bloom --out a.json &
    .venv/bin/python scripts/validate/step_recipes.py --only mistral,gemma,mixtral,gpt_neox,bert --out b.json
    .venv/bin/python scripts/validate/step_recipes.py --merge a.json b.json --out data/recipes/hf_steps.json
"""

import argparse
import json
import re
import sys

import torch
from torch.profiler import ProfilerActivity, profile, record_function
from torch.profiler._memory_profiler import Action

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import infer_recipes  # noqa: E402
import measure  # noqa: E402
import recipes  # noqa: E402

def layer_pattern(family):
    """A layer's module name, with its stack for T5: `model.layers.7`, `encoder.block.3`
    (T5's blocks hold sub-layers named `layer.0`, which are not layers here)."""
    if family == "t5":
        return re.compile(r"(encoder|decoder)\.block\.(\d+)")
    return re.compile(r"()(?:.*\.)?(?:layers|h|layer)\.(\d+)")


def timeline(family, head, precision, attn, checkpointing, batch, seq):
    """Allocations of one step after a warm-up: [(phase, layer or None, key, bytes, create)],
    the dimensions, the layer count and the parameters of one layer."""
    cfg = infer_recipes.recording_config(family)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    model = measure.build(cfg, head, attn, dtype)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    inputs = measure.inputs(cfg, head, batch, seq)
    layers = {"enc": 0, "main": 0}
    pattern = layer_pattern(family)
    for name, m in model.named_modules():
        hit = pattern.fullmatch(name)
        if not hit:
            continue
        stack, n = "enc" if hit.group(1) == "encoder" else "main", int(hit.group(2))
        layers[stack] = max(layers[stack], n + 1)

        def enter(m, *a, tag=f"{stack}:{n}"):
            m._ranges = getattr(m, "_ranges", [])
            m._ranges.append(record_function(f"layer:{tag}"))
            m._ranges[-1].__enter__()

        def leave(m, *a):
            m._ranges.pop().__exit__(None, None, None)

        m.register_forward_pre_hook(enter)
        m.register_forward_hook(leave)
        m.register_full_backward_pre_hook(enter)
        m.register_full_backward_hook(leave)

    def step():
        with record_function("forward"):
            if precision == "amp":
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = model(**inputs).loss
            else:
                loss = model(**inputs).loss
        with record_function("backward"):
            loss.backward()
        model.zero_grad(set_to_none=True)

    step()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        step()
    events = prof.profiler.kineto_results.events()
    def tag(name):
        stack, n = name[6:].split(":")
        return stack, int(n)

    ranges = sorted(((tag(e.name()), e.start_ns(), e.end_ns()) for e in events if e.name().startswith("layer:")),
                    key=lambda r: r[2] - r[1])
    phases = {e.name(): (e.start_ns(), e.end_ns()) for e in events if e.name() in ("forward", "backward")}

    def layer_at(t):
        # The innermost range: a recomputed layer's forward runs inside its backward.
        return next((n for n, start, end in ranges if start <= t <= end), None)

    def phase_at(t):
        return next((p for p, (start, end) in phases.items() if start <= t <= end), None)

    mp = prof._memory_profile()
    out = []
    for t, action, (key, _), nbytes in mp.timeline:
        if action in (Action.CREATE, Action.DESTROY):
            out.append((phase_at(t), layer_at(t), key, nbytes, action == Action.CREATE))
    d = recipes.dims(model, cfg)
    c = model.config
    d["P"] = getattr(c, "max_position_embeddings", None) or getattr(c, "n_positions", 0) or 0
    # Parameters of one layer of each stack (its last: T5's first blocks hold the position tables).
    params = {}
    in_layer = re.compile(pattern.pattern + r"\.")
    for name, p in model.named_parameters():
        hit = in_layer.match(name)
        if hit:
            key = ("enc" if hit.group(1) == "encoder" else "main", int(hit.group(2)))
            params[key] = params.get(key, 0) + p.numel()
    layer_params = {stack: params.get((stack, n - 1), 0) for stack, n in layers.items()}
    return out, d, layers, layer_params


# Where each moment is, as a position in the forward's order of layers: T5's encoder
# blocks 0..E-1, then the main stack's (T5's decoder, every other model's layers) E..E+L-1;
# between two layers, a half.
def position(where, layers):
    e, m = layers["enc"], layers["main"]
    return {"forward_enc_top": e - 1, "forward_mid": e - 0.5, "forward_top": e + m - 1, "forward_head": e + m,
            "backward_head": e + m, "backward_top": e + m - 1, "backward_bottom": e, "backward_mid": e - 0.5,
            "backward_enc_top": e - 1, "backward_enc_bottom": 0, "backward_embed": -0.5}[where]


def order(tag, layers):
    stack, n = tag
    return n if stack == "enc" else layers["enc"] + n


def moments(events, layers):
    """(where, live tensors [(layer made, bytes)]) for every allocation in the top and bottom
    layers of each stack and outside them."""
    e, m = layers["enc"], layers["main"]
    top, bottom, enc_top, enc_bottom = ("main", m - 1), ("main", 0), ("enc", e - 1), ("enc", 0)
    live, out = {}, []
    seen_backward = set()
    for phase, layer, key, nbytes, create in events:
        if not create:
            live.pop(key, None)
            continue
        live[key] = (layer, nbytes)
        made = {w for w, _ in live.values()}
        if phase == "forward":
            if layer == top:
                where = "forward_top"
            elif e and layer == enc_top:
                where = "forward_enc_top"
            elif layer is None and top in made:
                where = "forward_head"
            elif layer is None and e and enc_top in made:
                where = "forward_mid"
            else:
                continue
        elif phase == "backward":
            if layer is not None:
                seen_backward.add(layer)
            if layer == top:
                where = "backward_top"
            elif layer == bottom:
                where = "backward_bottom"
            elif e and layer == enc_top:
                where = "backward_enc_top"
            elif e and layer == enc_bottom:
                where = "backward_enc_bottom"
            elif layer is None:
                if e and enc_bottom in seen_backward or not e and bottom in seen_backward:
                    where = "backward_embed"
                elif bottom in seen_backward:
                    where = "backward_mid"
                else:
                    where = "backward_head"
            else:
                continue
        else:
            continue
        out.append((where, list(live.values())))
    return out


def fixed_unit(nbytes, d, layer_params, widths, stack, what):
    """(unit, bytes per unit) of a tensor of a fixed size: in a layer, bytes per parameter of
    one layer of its stack (its gradients, AMP's copies of its weights); outside, a table's
    elements."""
    if stack is not None:
        return ("layer" if stack == "main" else "layer_enc"), nbytes / layer_params[stack]
    for w in widths:
        n = nbytes / w
        for unit, size in (("Vh", d["V"] * d["h"]), ("Ph", d["P"] * d["h"]), ("hh", d["h"] * d["h"]), ("Vb", d["V"])):
            if size and abs(n - size) < 1e-9:
                return unit, float(w)
    raise SystemExit(f"{what}: a fixed tensor of {nbytes} bytes outside the layers")


def bucket(tag, p, layers):
    """Which count a tensor made by layer `tag` speaks for at a moment at position `p`: `once`
    (the current layer, or outside), `below`/`above` (its stack's farthest layer, like every
    other), the nearest layer's (`below_next`/`above_next`: every layer's and the stream),
    or none (the layers between, which repeat the farthest). `_enc` for T5's encoder."""
    if tag is None:
        return "once"
    i = order(tag, layers)
    if i == p:
        return "once"
    stack = tag[0]
    suffix = "_enc" if stack == "enc" else ""
    first = 0 if stack == "enc" else layers["enc"]
    last = first + layers[stack] - 1
    if i < p:
        nearest = min(last, int(p - 0.5) if p != int(p) else int(p) - 1)
        return "below" + suffix if i == first else ("below_next" + suffix if i == nearest else None)
    nearest = max(first, int(p + 0.5) if p != int(p) else int(p) + 1)
    return "above" + suffix if i == last else ("above_next" + suffix if i == nearest else None)


def recipe(family, head, precision, attn, checkpointing):
    # Lengths that equal no dimension of the base configs (a training step in bf16 is slow
    # on a CPU: shorter than the inference recipes' 80 and 136).
    b, s1, s2 = 2, 56, 88
    runs = [timeline(family, head, precision, attn, checkpointing, bb, ss) for bb, ss in ((b, s1), (b, s2), (3, s1))]
    d, layers, layer_params = runs[0][1], runs[0][2], runs[0][3]
    elem = 4 if precision == "fp32" else 2
    widths = [elem] + [x for x in (4, 8, 1, 2) if x != elem]
    what = f"{family}/{head}/{precision}/{attn}/{'ckpt' if checkpointing else 'full'}"
    found = [moments(r[0], layers) for r in runs]
    if not len(found[0]) == len(found[1]) == len(found[2]):
        raise SystemExit(f"{what}: the step allocates differently at different shapes "
                         f"({len(found[0])}, {len(found[1])}, {len(found[2])} moments)")
    buckets = [k + sfx for sfx in ("", "_enc") for k in ("below", "below_next", "above", "above_next")] + ["once"]
    out = []
    for (where, m1), (w2, m2), (w3, m3) in zip(*found):
        if not where == w2 == w3 or not len(m1) == len(m2) == len(m3):
            raise SystemExit(f"{what}: a moment holds different tensors at different shapes")
        p = position(where, layers)
        terms = {k: {} for k in buckets}
        for (tag, n1), (_, n2), (_, n3) in zip(m1, m2, m3):
            into = bucket(tag, p, layers)
            if into is None:
                continue
            if n1 == n2 == n3:
                if n1 <= 4096:
                    continue  # counters, scalars: bytes, not a term
                u, v = fixed_unit(n1, d, layer_params, widths, None if tag is None else tag[0], what)
            elif max(n1, n2, n3) <= 65536 and not infer_recipes.scales(n1, n2, n3, b, s1, s2):
                continue  # a kernel's blocking scratch: kilobytes
            else:
                for i, wd in enumerate(widths):
                    try:
                        kind, u, v = infer_recipes.classify(n1, n2, n3, b, s1, s2, d, wd, what)
                        break
                    except SystemExit:
                        if i == len(widths) - 1:
                            raise
                if kind == "position":
                    u = "pos:" + u
            terms[into][u] = terms[into].get(u, 0) + v
        # Every layer between holds what both the farthest and the nearest layer hold; what
        # one of them holds beyond that (the stream into the current layer, a first layer's
        # own tensors) is counted once.
        for sfx in ("", "_enc"):
            for near, far in (("below_next" + sfx, "below" + sfx), ("above_next" + sfx, "above" + sfx)):
                a, z = terms[far], terms.pop(near)
                if not z:
                    continue  # no layer between the farthest and the current one
                common = {u: min(a.get(u, 0), z.get(u, 0)) for u in set(a) | set(z)}
                for u in set(a) | set(z):
                    extra = a.get(u, 0) + z.get(u, 0) - 2 * common[u]
                    if extra > 1e-9:
                        terms["once"][u] = terms["once"].get(u, 0) + extra
                terms[far] = {u: v for u, v in common.items() if v > 0}
        if not layers["enc"]:
            del terms["below_enc"], terms["above_enc"]
        out.append({"where": where} | terms)
    return {"moments": pareto(out)}


def pareto(moments):
    """The moments no other moment at the same place dominates term by term."""
    def flat(m):
        return {(k, u): v for k in m if k != "where" for u, v in m[k].items()}

    kept = []
    for i, m in enumerate(moments):
        fm = flat(m)
        beaten = False
        for j, o in enumerate(moments):
            if j == i or o["where"] != m["where"]:
                continue
            fo = flat(o)
            if all(v <= fo.get(k, 0) + 1e-12 for k, v in fm.items()) and (fm != fo or j < i):
                beaten = True
                break
        if not beaten:
            kept.append(m)
    return kept


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", help="families, comma-separated (run halves side by side, then --merge)")
    ap.add_argument("--merge", nargs="+", help="recipe files to merge into --out")
    a = ap.parse_args()
    torch.set_num_threads(1)
    out = {}
    for part in a.merge or []:
        with open(part) as f:
            out |= json.load(f)["recipes"]
    for family in [] if a.merge else measure.DECODERS + ["bert", "t5"]:
        if a.only and family not in a.only.split(","):
            continue
        first = {"bert": "masked-lm", "t5": "seq2seq-lm"}.get(family, "causal-lm")
        heads = [first] + (["seq-cls"] if family in ("llama", "bert") else [])
        for head in heads:
            for precision in ("fp32", "bf16", "amp"):
                for attn in ("eager",) if family in measure.NO_SDPA else ("eager", "sdpa"):
                    for ck in (False, True):
                        r = recipe(family, head, precision, attn, ck)
                        out[f"{family}/{head}/{precision}/{attn}/{'ckpt' if ck else 'full'}"] = r
                        print(family, head, precision, attn, ck, len(r["moments"]), "moments", file=sys.stderr, flush=True)
                        write(a.out, out)  # as it goes: a full run takes the better part of an hour
    write(a.out, out)


def write(path, recipes_):
    """One recipe a line (the file is a megabyte), numbers to 7 significant digits."""
    def rounded(x):
        if isinstance(x, float):
            return float(f"{x:.7g}")
        if isinstance(x, dict):
            return {k: rounded(v) for k, v in x.items()}
        if isinstance(x, list):
            return [rounded(v) for v in x]
        return x

    head = {"about": "What a transformers training step holds, per token: scripts/validate/step_recipes.py",
            "torch": torch.__version__, "transformers": __import__("transformers").__version__}
    with open(path, "w") as f:
        f.write(json.dumps(head, sort_keys=True)[:-1] + ', "recipes": {\n')
        lines = [f"{json.dumps(k)}: {json.dumps(rounded(v), sort_keys=True, separators=(',', ':'))}"
                 for k, v in sorted(recipes_.items())]
        f.write(",\n".join(lines) + "\n}}\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""What a Hugging Face transformers training step holds at each moment of its forward and
backward, by family, precision, attention kernel, checkpointing and head: the step recipes
`headroom plan` uses for the forward and backward phases of a transformers step.

A step allocates the same sequence of tensors at every shape. This script records it with
the profiler's memory timeline (forward with the loss, then backward; the optimizer step is
modelled apart) for each family's base config (the tuning config of measure.py, adjusted by
`measure.recording_config` where it would hide a term) at three
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
`backward_enc_bottom`). Moments another dominates term by term are dropped. A CPU kernel's
own scratch is left out first, as the step programs leave it out (`cpu_scratch_events`), and so
is the generator state checkpointing saves, a host tensor on a GPU too (`rng_state_events`); a
tensor that fits no unit stops the run.

    .venv/bin/python scripts/validate/step_recipes.py --out data/recipes/hf_steps.json   # 40 CPU-minutes
    # or in halves, side by side, then merged:
    .venv/bin/python scripts/validate/step_recipes.py --only llama,qwen2,phi3,gpt2,bloom --out a.json &
    .venv/bin/python scripts/validate/step_recipes.py --only mistral,gemma,mixtral,gpt_neox,bert --out b.json
    .venv/bin/python scripts/validate/step_recipes.py --merge a.json b.json --out data/recipes/hf_steps.json

`--keys` records only the recipes whose key matches (the SDPA checkpointed ones: `--keys
'*/sdpa/ckpt'`), to be merged with the others.

`--compiled` adds the steps run through `torch.compile` (fp32, bf16 and AMP, every decoder, no
checkpointing; keys ending `/compiled`), whose layers run inside one graph where nothing can
be placed in a layer: each is recorded at two depths and three shapes, the runs lined up
allocation by allocation, and every moment of the forward and backward written as `once`
plus `below` per layer (`forward_compiled`, `backward_compiled`; see `compiled_recipe`).

    .venv/bin/python scripts/validate/step_recipes.py --compiled --out data/recipes/hf_steps.json   # 30 CPU-minutes
"""

import argparse
import difflib
import fnmatch
import json
import re
import sys
from fractions import Fraction

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile, record_function
from torch.profiler._memory_profiler import Action

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import infer_recipes  # noqa: E402
import measure  # noqa: E402
import recipes  # noqa: E402
import step_programs  # noqa: E402
from layer_marks import hook_layers, layer_pattern  # noqa: E402


def profiled_step(forward, model, inputs, precision):
    """One step (`forward` with the loss, the backward, `zero_grad(set_to_none=True)`) after
    a warm-up, under the profiler with its memory timeline: the profile, its events and the
    forward's and the backward's (start, end)."""
    def step():
        with record_function("forward"):
            if precision == "amp":
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = forward(**inputs).loss
            else:
                loss = forward(**inputs).loss
        with record_function("backward"):
            loss.backward()
        model.zero_grad(set_to_none=True)

    step()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        step()
    events = prof.profiler.kineto_results.events()
    phases = {e.name(): (e.start_ns(), e.end_ns()) for e in events if e.name() in ("forward", "backward")}
    return prof, events, phases


def timeline(family, head, precision, attn, checkpointing, batch, seq):
    """Allocations of one step after a warm-up: [(phase, layer or None, key, bytes, create)],
    the dimensions, the layer count and the parameters of one layer."""
    cfg = measure.recording_config(family)
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
    hook_layers(model, family)

    prof, events, phases = profiled_step(model, model, inputs, precision)

    def tag(name):
        stack, n = name[6:].split(":")
        return stack, int(n)

    ranges = sorted(((tag(e.name()), e.start_ns(), e.end_ns()) for e in events if e.name().startswith("layer:")),
                    key=lambda r: r[2] - r[1])

    def layer_at(t):
        # The innermost range: a recomputed layer's forward runs inside its backward.
        return next((n for n, start, end in ranges if start <= t <= end), None)

    def phase_at(t):
        return next((p for p, (start, end) in phases.items() if start <= t <= end), None)

    states = rng_state_events(prof)
    if checkpointing and not states:
        # Non-reentrant checkpointing saves the generator's state at every layer: none found
        # means the profile no longer names the call, and the states would be counted.
        raise SystemExit(f"{family}: no generator state found in a checkpointed step")
    scratch = cpu_scratch_events(prof) | states
    mp = prof._memory_profile()
    out = []
    for t, action, (key, _), nbytes in mp.timeline:
        if action in (Action.CREATE, Action.DESTROY) and (t, abs(nbytes)) not in scratch:
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


def cpu_scratch_events(prof):
    """(time, bytes) of each allocation and free of the CPU kernels' own scratch, by the rule
    the step programs leave it out by (`step_programs.cpu_scratch`): a 16-bit GEMM's packed
    operands follow the CPU's blocking (an AVX-512 bf16 core packs rows of 64, an affine size
    in the tokens), not the model's dimensions, and a GPU's cuBLAS makes none of them."""
    live, out = {}, set()
    for t, ptr, size, ops in step_programs.allocations(prof):
        if size > 0:
            live[ptr] = (t, size, ops)
        elif ptr in live:
            t0, made, made_ops = live.pop(ptr)
            if step_programs.cpu_scratch(made_ops, ops):
                out |= {(t0, made), (t, made)}
    return out


# `torch.Generator.get_state` as the profiler's Python tracer names its calls: what
# `torch.get_rng_state` and `torch.cuda.get_rng_state` call.
GENERATOR_STATE = re.compile(r"<built-in method get_state of torch\._C\.Generator object")


def rng_state_events(prof):
    """(time, bytes) of each allocation and free of a generator's state, as non-reentrant
    checkpointing saves it (`torch.get_rng_state()` at each checkpointed layer's forward, and
    `fork_rng`'s at its recomputation; on CUDA `torch.cuda.get_rng_state()` too): a host tensor
    on a GPU as well, never device memory, which the step programs leave out as made outside
    any operator. Told by the call that makes it (the profile's Python stack, `with_stack`),
    not by its size."""
    allocs = []

    def walk(node, inside):
        if node.tag == _EventType.Allocation:
            a = node.extra_fields
            allocs.append((node.start_time_ns, a.ptr, a.alloc_size, inside))
            return
        inside = inside or (node.tag in (_EventType.PyCall, _EventType.PyCCall)
                            and bool(GENERATOR_STATE.match(node.name)))
        for c in node.children:
            walk(c, inside)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root, False)
    live, out = {}, set()
    for t, ptr, size, inside in sorted(allocs, key=lambda a: a[0]):
        if size > 0:
            live[ptr] = (t, size, inside)
        elif ptr in live:
            t0, made, state = live.pop(ptr)
            if state:
                out |= {(t0, made), (t, made)}
    return out


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
    seen_forward, seen_backward = set(), set()
    for phase, layer, key, nbytes, create in events:
        if not create:
            live.pop(key, None)
            continue
        live[key] = (layer, nbytes)
        made = {w for w, _ in live.values()}
        if phase == "forward":
            if layer is not None:
                seen_forward.add(layer)
            if layer == top:
                where = "forward_top"
            elif e and layer == enc_top:
                where = "forward_enc_top"
            elif layer is None and top in seen_forward:
                # After the top layer's forward, whether or not a tensor it made is alive: under
                # checkpointing none may be by the logits (a 16-bit model's final norm keeps its
                # own fp32 copy of the top layer's output).
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
            # Over both moments' terms: a compiled moment's may be negative.
            if all(fm.get(k, 0) <= fo.get(k, 0) + 1e-12 for k in fm.keys() | fo.keys()) and (fm != fo or j < i):
                beaten = True
                break
        if not beaten:
            kept.append(m)
    return kept


# --- torch.compile'd steps -------------------------------------------------------------------
#
# Under torch.compile the layers run inside one graph: module hooks fire while it is traced,
# not while it runs, so no allocation can be placed in a layer. What a layer adds is told
# instead by recording the step at two depths and lining the two up: the deeper step
# allocates the same sequence with one layer's more, and a moment found in both holds, at
# any depth N, `once` + N x `below` -- the difference of the two is what one layer adds
# there (its saved tensors in the forward and early in the backward, its gradients late in
# it), the rest is `once`.

COMPILED_DEPTHS = (2, 3)


def compiled_timeline(family, precision, checkpointing, layers, batch, seq):
    """The allocations of one torch.compile'd step (the forward with the loss and the
    backward) after the warm-up that compiles it, at `layers` layers: [(phase, tensor number,
    bytes, create)], the dimensions and one layer's parameters."""
    torch.set_num_threads(1)
    cfg = dict(measure.recording_config(family))
    depth = next(k for k in ("num_hidden_layers", "n_layer") if k in cfg)
    cfg[depth] = layers
    attn = "eager" if family in measure.NO_SDPA else "sdpa"
    torch._dynamo.reset()
    model = measure.build(cfg, "causal-lm", attn, torch.bfloat16 if precision == "bf16" else torch.float32)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    inputs = measure.inputs(cfg, "causal-lm", batch, seq)
    # One graph per shape, as a training run of fixed shapes compiles it (measure.py's cases).
    forward = torch.compile(model, dynamic=False)

    prof, _, phases = profiled_step(forward, model, inputs, precision)
    # Every allocation and free, told apart by address: inductor's buffers carry no tensor
    # identity, so the memory profiler's timeline gives them all one key.
    allocations = sorted(((e.start_time_ns, e.typed[1].ptr, e.typed[1].alloc_size)
                          for e in prof._memory_profile()._op_tree.dfs() if e.typed[0] == _EventType.Allocation),
                         key=lambda a: a[0])
    at, out = {}, []
    for t, ptr, size in allocations:
        phase = next((p for p, (start, end) in phases.items() if start <= t <= end), None)
        if size > 0:
            at[ptr] = n = len(out)
            out.append((phase, n, size, True))
        elif ptr in at:  # a free of what the step allocated (not of a tensor from before it)
            out.append((phase, at.pop(ptr), -size, False))
    d = recipes.dims(model, cfg)
    c = model.config
    d["P"] = getattr(c, "max_position_embeddings", None) or getattr(c, "n_positions", 0) or 0
    first = re.compile(layer_pattern(family).pattern.replace(r"(\d+)", "(0)") + r"\.")
    layer = [p.numel() for name, p in model.named_parameters() if first.match(name)]
    return out, d, (sum(layer), set(layer))


def isolated(fn, *args):
    """`fn(*args)` in a process of its own: graphs and dynamo's caches left by an earlier
    compile change what a later one allocates (measure.compiled_case)."""
    import multiprocessing
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, args)


def same_tensors(a, shape_a, b, shape_b):
    """Index pairs of the tensors two runs of a step at two shapes make alike, and how many
    of them are in the same order in both. Two can match where they are in the same phase
    and their sizes agree as a tensor of a fixed size, or per token, position, token x
    position or position x position would. First the longest common subsequence of the two
    runs' allocations; then, since inductor may order a shape's kernels otherwise, each
    tensor left over is paired with the nearest left over in the other run (by its place in
    its run) that can match it."""
    def signature(nbytes, shape):
        bb, ss = shape
        return {("fixed", nbytes), ("token", Fraction(nbytes, bb * ss)), ("position", Fraction(nbytes, ss)),
                ("token_s", Fraction(nbytes, bb * ss * ss)), ("position_s", Fraction(nbytes, ss * ss)),
                ("sequence", Fraction(nbytes, bb))}

    sa = [(phase, signature(nbytes, shape_a)) for phase, _, nbytes in a]
    sb = [(phase, signature(nbytes, shape_b)) for phase, _, nbytes in b]
    alike = lambda x, y: x[0] == y[0] and not x[1].isdisjoint(y[1])
    n, m = len(sa), len(sb)
    # lcs[i][j]: the longest common subsequence of a[i:] and b[j:].
    lcs = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        row, below = lcs[i], lcs[i + 1]
        for j in range(m - 1, -1, -1):
            row[j] = below[j + 1] + 1 if alike(sa[i], sb[j]) else max(below[j], row[j + 1])
    pairs, i, j = [], 0, 0
    while i < n and j < m:
        if alike(sa[i], sb[j]) and lcs[i][j] == lcs[i + 1][j + 1] + 1:
            pairs.append((i, j))
            i, j = i + 1, j + 1
        elif lcs[i + 1][j] >= lcs[i][j + 1]:
            i += 1
        else:
            j += 1
    free_b = set(range(m)) - {j for _, j in pairs}
    for i in sorted(set(range(n)) - {i for i, _ in pairs}):
        near = sorted((abs(j / m - i / n), j) for j in free_b if alike(sa[i], sb[j]))
        if near:
            pairs.append((i, near[0][1]))
            free_b.discard(near[0][1])
    return pairs, lcs[0][0]


def compiled_recipe(family, precision, checkpointing=False):
    """The compiled step's moments, forward and backward: `{"moments": [...]}` with `where`
    `forward_compiled` or `backward_compiled`, `below` what each layer adds and `once` the
    rest (`once` may hold negative terms: a moment in the bottom layer's backward is `once`
    less one layer's gradients plus N layers' worth of them)."""
    b, s1, s2 = 2, 56, 88
    shapes = ((b, s1), (b, s2), (3, s1))
    what = f"{family}/{precision}/{'ckpt' if checkpointing else 'full'}/compiled"
    elem = 4 if precision == "fp32" else 2
    widths = [elem] + [x for x in (4, 8, 1, 2) if x != elem]
    fixed_widths = {"fp32": [4], "bf16": [2], "amp": [4, 2]}[precision]
    per_depth = {}
    for layers in COMPILED_DEPTHS:
        runs = [isolated(compiled_timeline, family, precision, checkpointing, layers, bb, ss) for bb, ss in shapes]
        d, (layer_params, layer_sizes) = runs[0][1], runs[0][2]
        events = [r[0] for r in runs]
        # Inductor plans each shape's graph apart and may fuse, reuse or order a buffer
        # otherwise at one shape, so the runs are lined up tensor by tensor (`same_tensors`),
        # from the run whose order the other two share most (moments are taken in its order);
        # a tensor of it without a counterpart in both others is left out, and the bytes that
        # leaves out are reported.
        made = [[(phase, n, nbytes) for phase, n, nbytes, create in ev if create] for ev in events]

        def lined_up(ref):
            sizes, in_order = {n: [None, None, None] for _, n, _ in made[ref]}, 0
            for _, n, nbytes in made[ref]:
                sizes[n][ref] = nbytes
            for other in {0, 1, 2} - {ref}:
                pairs, common = same_tensors(made[ref], shapes[ref], made[other], shapes[other])
                in_order += common
                for i, j in pairs:
                    sizes[made[ref][i][1]][other] = made[other][j][2]
            return in_order, ref, sizes

        _, ref, sizes = max(lined_up(r) for r in range(3))
        unmatched = {n for n, sz in sizes.items() if None in sz}
        print(f"{what}, {layers} layers, from {shapes[ref]}: {len(unmatched)} of {len(sizes)} tensors unmatched "
              f"across the shapes ({sum(sizes[n][ref] for n in unmatched)} of "
              f"{sum(sz[ref] for sz in sizes.values())} bytes)", file=sys.stderr, flush=True)

        def unit(n1, n2, n3):
            if n1 == n2 == n3:
                if n1 <= 4096:
                    return None  # counters, scalars
                # A gradient of one of a layer's weights, or AMP's copy of one, or a buffer
                # holding several: bytes per parameter of a layer. A table outside the layers
                # (the embeddings', the head's) only where its size is no layer weight's, in the
                # widths a gradient or a copy has: the recording config's tables are the size of
                # a layer's few weights at another width.
                if any(n1 % w == 0 and n1 // w in layer_sizes for w in fixed_widths):
                    return "layer", n1 / layer_params
                try:
                    return fixed_unit(n1, d, {"main": layer_params}, fixed_widths, None, what)
                except SystemExit:
                    return "layer", n1 / layer_params
            if max(n1, n2, n3) <= 65536 and not infer_recipes.scales(n1, n2, n3, b, s1, s2):
                return None  # a kernel's blocking scratch
            for wd in widths:
                try:
                    kind, u, v = infer_recipes.classify(n1, n2, n3, b, s1, s2, d, wd, what)
                    return ("pos:" + u if kind == "position" else u), v
                except SystemExit:
                    pass
            # A size no law of the model's dimensions gives: the CPU's matrix kernels pad
            # their blocks (rows to a multiple of 64, for one), which a GPU's do not
            # allocate through PyTorch. Left out, and reported.
            unclassified.add((n1, n2, n3))
            return None

        unclassified = set()
        units = {n: None if n in unmatched else unit(*sz) for n, sz in sizes.items()}
        if unclassified:
            print(f"{what}, {layers} layers: left out, no unit fits: {sorted(unclassified)}", file=sys.stderr, flush=True)
        live, moments = set(), {"forward": [], "backward": []}
        # Each event as what it makes or frees in the model's units, the same at any shape:
        # what lines the two depths up.
        tokens = {"forward": [], "backward": []}
        for phase, n, nbytes, create in events[ref]:
            if phase in tokens:
                tokens[phase].append(("+" if create else "-", units[n]))
            if not create:
                live.discard(n)
                continue
            live.add(n)
            if phase in moments:
                terms = {}
                for m in live:
                    if units[m] is not None:
                        u, v = units[m]
                        terms[u] = terms.get(u, 0) + v
                moments[phase].append(terms)
        per_depth[layers] = (moments, tokens, d, layer_params)
    (l1, (m1, t1, d, layer_params)), (l2, (m2, t2, _, _)) = sorted(per_depth.items())
    tables = {"Vh": d["V"] * d["h"], "Ph": d["P"] * d["h"], "Vb": d["V"]}
    out, crossed = [], 0
    for phase in ("forward", "backward"):
        # Create events only, in order, to index the moments.
        creates1 = [i for i, (op, _) in enumerate(t1[phase]) if op == "+"]
        creates2 = [i for i, (op, _) in enumerate(t2[phase]) if op == "+"]
        at1, at2 = {e: k for k, e in enumerate(creates1)}, {e: k for k, e in enumerate(creates2)}
        matcher = difflib.SequenceMatcher(None, t1[phase], t2[phase], autojunk=False)
        paired = [(block.a + i, block.b + i) for block in matcher.get_matching_blocks() for i in range(block.size)]
        # The phase's last allocation is the same place at any depth, however the layers'
        # allocations and frees interleave before it (where the alignment may pair moments a
        # few allocations apart): all the layers' gradients, at the backward's end.
        paired.append((creates1[-1], creates2[-1]))
        for e1, e2 in paired:
            if e1 not in at1:
                continue
            a, z = m1[phase][at1[e1]], m2[phase][at2[e2]]
            per_layer = {u: (z.get(u, 0) - a.get(u, 0)) / (l2 - l1) for u in set(a) | set(z)}
            if any(v < -1e-9 for v in per_layer.values()):
                # Paired a few allocations apart, or across the layers' order: no moment
                # of a model of any depth.
                crossed += 1
                continue
            once = {u: a.get(u, 0) - l1 * per_layer.get(u, 0) for u in set(a) | set(per_layer)}
            # What every layer adds is never a table outside the layers: a tensor taken for
            # one by its size is a layer's, in bytes per parameter of a layer.
            for u, size in tables.items():
                if u in per_layer:
                    per_layer["layer"] = per_layer.get("layer", 0) + per_layer.pop(u) * size / layer_params
            clean = lambda t: {u: v for u, v in t.items() if abs(v) > 1e-9}
            out.append({"where": f"{phase}_compiled", "below": clean(per_layer), "above": {},
                        "once": clean(once)})
    print(f"{what}: {len(out)} moments in both depths, {crossed} paired a few allocations apart or across the layers' order left out",
          file=sys.stderr, flush=True)
    return {"moments": pareto(out)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", help="families, comma-separated (run halves side by side, then --merge)")
    ap.add_argument("--merge", nargs="+", help="recipe files to merge into --out")
    ap.add_argument("--keys", help="only the recipes whose key matches one of these patterns, comma-separated "
                                   "(fnmatch: '*/sdpa/ckpt')")
    ap.add_argument("--compiled", action="store_true",
                    help="record the torch.compile'd steps (every decoder) into --out, keeping its others")
    ap.add_argument("--precision", default="fp32,bf16,amp", help="with --compiled: precisions, comma-separated")
    ap.add_argument("--checkpointed", action="store_true", help="with --compiled: the steps with gradient checkpointing")
    a = ap.parse_args()
    torch.set_num_threads(1)
    out = {}
    if a.compiled:
        with open(a.out) as f:
            out = json.load(f)["recipes"]
        for family in measure.DECODERS:
            if a.only and family not in a.only.split(","):
                continue
            attn = "eager" if family in measure.NO_SDPA else "sdpa"
            ck = "ckpt" if a.checkpointed else "full"
            for precision in a.precision.split(","):
                try:
                    r = compiled_recipe(family, precision, a.checkpointed)
                except (SystemExit, Exception) as e:  # inductor's own errors too: the others are still recorded
                    print(family, precision, ck, "compiled: not recorded:", e, file=sys.stderr, flush=True)
                    continue
                out[f"{family}/causal-lm/{precision}/{attn}/{ck}/compiled"] = r
                print(family, precision, "compiled", len(r["moments"]), "moments", file=sys.stderr, flush=True)
                write(a.out, out)
        return
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
                        key = f"{family}/{head}/{precision}/{attn}/{'ckpt' if ck else 'full'}"
                        if a.keys and not any(fnmatch.fnmatchcase(key, k) for k in a.keys.split(",")):
                            continue
                        r = recipe(family, head, precision, attn, ck)
                        out[key] = r
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

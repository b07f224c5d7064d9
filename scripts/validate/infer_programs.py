#!/usr/bin/env python3
"""What transformers' inference allocates and frees, tensor by tensor, in order: the
inference programs `headroom plan --infer --framework hf` replays through its allocator.

The same method as `step_programs.py` (the training templates), for two jobs a user runs:

- `generate`: `model.generate(input_ids, attention_mask=..., max_new_tokens=4,
  do_sample=False)` (greedy, transformers' `DynamicCache`). Its sections: `setup` (the
  model built, the ids and the mask), `prefill` (from the call to the start of the second
  forward: the prompt's forward with the last position's logits, the first token chosen),
  `decode1` (the first decode step: the cache grows from the prompt's length by one), and
  `decode` (a later one, the third forward). The fourth forward and generate's return are
  not kept: they end the loop, which the planner ends itself.
- `forward`: `model(input_ids, use_cache=True)` under `torch.no_grad()`, every position's
  logits (an evaluation loop): `setup` and `prefill`.

An encoder-decoder's `generate` (T5's, `ENCODER_DECODER`) runs its encoder once over the
input, in `prefill` with the decoder's first step from its start token (one token: every
tensor there sized by the input's length). Its decode steps grow two lengths: the decoder's
past (its self-attention's cache, 1 in `decode1`, 2 in `decode`) and the encoder's input
(cross-attention's scores and mask; its keys and values, made in the first decoder step over
the encoder's output, are kept, transformers' `EncoderDecoderCache`). Each tensor grows with
one of them: recorded with one new token more, the fourth forward (`decode2`, the past one
longer, read for its laws alone) beside `decode` at the three shapes tells which
(`fit_decode`: the same bytes at the longer input, a law in the past; the same in the longer
past, a law in the input, the tensor listed in the template's `by_encoder`); a tensor that
grows with both is refused. `decode1` is checked against those laws at a past of 1.

Sizes are laws in the model's dimensions (as step_programs.py's; a law the recording's heads
cannot tell from another is refused as there, `step_programs.refuse_rivals`), over the batch and a
length: the prompt's for `setup` and `prefill`, the cache's length before the step (the
past) for a decode step, so a step deep into a generation is the recorded step at a longer
past. A decode step's keys and values are made anew each step (`torch.cat` of the cache and
the step's token) and the previous step's freed: a free of what the step before made is
event kind 2, naming this step's tensor made at the same point (the planner frees the
previous step's instance). `decode1`'s tensors are `decode`'s, made in the same order with
the same laws at a past one shorter (checked); `decode1` frees what the prefill made.

The families (`FAMILIES`): Llama, Qwen2, Qwen3, GPT-2, Mistral, Phi-3, Gemma, Gemma-2, Gemma-3,
GPT-NeoX, BLOOM, Mixtral, Qwen2-MoE and Qwen3-MoE, in step_programs.py's recording configs, with
SDPA and eager attention, or eager alone where transformers has no SDPA (BLOOM, Gemma-2);
BERT's forward, and T5's forward and generate (SDPA, routed as a GPU routes it onto the
memory-efficient kernel's CPU stand-in, `step_programs.gpu_sdpa`, and eager; v1.0's ReLU MLP,
tied; v1.1's gated MLP under keys ending `/gated`); the
keys shipped are those data/programs/hf-infer.tpl holds. A Mixture of Experts runs
transformers' default experts implementation (every tensor sized by the tokens times the
experts a token takes, whatever the routing). Gemma-3's window is set beyond every recorded
length: past its window transformers keeps a sliding layer's last tokens as a view of the
step's whole keys, which the templates do not carry, and the planner refuses that.

At fp32 the families whose released models group their key-value heads (`GROUPED`) are
recorded on SDPA's math path too (`<family>/<mode>/fp32/sdpa-math`), asked for on the CPU
(`sdpa_kernel([SDPBackend.MATH])`) as step_programs.py records training's: a GPU takes it for
fp32 with grouped heads (no fused kernel takes them; transformers passes `enable_gqa` where the
mask is none, as in generate's and the forward's), and keeps the keys and values copied to
every query head and the scores and probabilities of every query against every key. BERT's
masked-LM forward (SDPA) and T5's evaluation forward (SDPA and eager, its encoder a stack of its own)
are recorded alone; T5 with v1.0's MLP (ReLU, tied: t5-base) and with v1.1's (`/gated`: a
gated-GELU pair, its output layer its own, the decoder's output unscaled: flan-t5, T0, mT5).

Over bitsandbytes' 4-bit layers as QLoRA loads them (NF4, double quantization, bf16 compute: keys
ending `/nf4`) and as `BitsAndBytesConfig(load_in_4bit=True)` loads them by default (no double
quantization, fp32 compute: keys ending `/nf4-fp32-nodq`, in `data/programs/hf-infer-4bit.tpl`),
and LLM.int8() (keys ending `/int8`), every family, at bf16 with each attention a bf16 model of the
family runs (SDPA and eager), as `quant_infer.py` records them: loaded
and quantized as transformers loads them, bitsandbytes' operators allocating what their CUDA
kernels allocate, at widths whose every quantized weight is whole blocks (qlora_programs.py's);
each such template carries what its recording assumed of the kernels (`assumed`).

Recorded at five layers (the middle one repeated by the planner for every layer between) and
three shapes (batch x prompt 2x56, 2x88, 3x56), checked at seven layers as step_programs.py
does (`check`: each section's events, their bytes in order and the live peak, which the
planner's expansion reproduces; `cargo test -p headroom-plan program_templates`).

    /work/venv-torch/bin/python scripts/validate/infer_programs.py --out data/programs/hf-infer.tpl
    /work/venv-torch/bin/python scripts/validate/infer_programs.py --only llama/generate/bf16/sdpa --out a.json
    /work/venv-torch/bin/python scripts/validate/infer_programs.py --only t5/forward/bf16/eager/gated --out b.json
    PYTHONPATH=python /work/venv-torch/bin/python scripts/validate/infer_programs.py --only llama/generate/bf16/sdpa/nf4 --out c.json
    /work/venv-torch/bin/python scripts/validate/infer_programs.py --merge data/programs/hf-infer.tpl a.json b.json c.json --out data/programs/hf-infer.tpl
    PYTHONPATH=python /work/venv-torch/bin/python scripts/validate/infer_programs.py --only llama/generate/bf16/sdpa/nf4-fp32-nodq --out d.json
    /work/venv-torch/bin/python scripts/validate/infer_programs.py --merge data/programs/hf-infer-4bit.tpl d.json --out data/programs/hf-infer-4bit.tpl
"""

import argparse
import contextlib
import json
import os
import re
import sys

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import infer_recipes  # noqa: E402
import measure  # noqa: E402
import quant_infer as qi  # noqa: E402
import step_programs as sp  # noqa: E402
import template_file  # noqa: E402

FAMILIES = ("llama", "qwen2", "qwen3", "gpt2", "mistral", "phi3", "gemma", "gemma2", "gemma3_text", "gpt_neox", "bloom",
            "mixtral", "qwen2_moe", "qwen3_moe", "bert", "t5")
# What each family is built as: BERT as a masked LM, T5 as a sequence-to-sequence LM, every
# other family as a causal LM (step_programs.py's heads).
HEADS = {"bert": "masked-lm", "t5": "seq2seq-lm"}
# Families with no generate: an encoder runs one forward over its input.
FORWARD_ONLY = ("bert",)
NO_GENERATE = FORWARD_ONLY
# Families whose generate runs an encoder once over the input and a decoder from one start
# token: a decode step's tensors are sized by the encoder's input (cross-attention's) or by the
# decoder's past (its own cache's), each by one of the two (`fit_decode`).
ENCODER_DECODER = ("t5",)
# The attention transformers gives a family by default: eager where the family has no SDPA
# (Gemma-2's softcapping, BLOOM's ALiBi), as the training templates record them. T5's SDPA is
# recorded as a GPU runs it, on the memory-efficient kernel (`step_programs.ROUTED_SDPA`).
EAGER_ONLY = ("gemma2", "bloom")
# Families whose released models group their key-value heads (Gemma's 2B one, MQA), which a
# GPU runs at fp32 on SDPA's math path (no fused kernel takes fp32 with grouped heads, and
# transformers passes `enable_gqa` when there is no mask): recorded at fp32 on that path too
# (`sdpa-math`), asked for on the CPU as step_programs.py asks for it. Each recording config
# groups its key-value heads (step_programs.py's GQA, 15 over 5; the bundled templates of
# Gemma's and Gemma-3's at 4 over 2 were recorded before it), so the math path's copies of keys
# and values at every query head are recorded.
GROUPED = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "gemma", "gemma3_text", "phi3")
# T5 comes with v1.0's MLP (one ReLU projection in, tied: t5-base) or v1.1's gated pair with an
# output layer of its own (flan-t5, T0, mT5): the second recorded under keys ending `/gated`.
VARIANTS = {"t5": ("", "gated")}
MODES = ("generate", "forward")
NEW_TOKENS = 4
SECTIONS = ("setup", "prefill", "decode1", "decode")


def config(family, layers, variant=""):
    """The training templates' recording config, a sliding window beyond every recorded length:
    the planner serves a sliding cache only within its window (transformers keeps the window's
    last tokens as a view of the step's whole keys past it, which the templates do not carry)."""
    cfg = sp.config(family, layers)
    if family == "gemma3_text":
        cfg["sliding_window"] = 4096
    if family == "t5" and "gated" in qi.parts(variant):
        # T5 v1.1's gated MLP (`wi_0`, `wi_1`, gelu) and its decoder's output unscaled, as
        # `tie_word_embeddings: false` in v1.1's config.json says (`T5Config` reads it so); the
        # output layer is untied after the model is built (`untie_t5`).
        cfg.update(feed_forward_proj="gated-gelu", tie_word_embeddings=False)
    elif family == "t5":
        # T5 v1.0's MLP (one ReLU projection in, not v1.1's gated pair), with its output layer
        # tied to the embeddings: the T5 a tied template serves (v1.1's is untied, and gated).
        cfg["feed_forward_proj"] = "relu"
    if family == "gemma2":
        # Gemma-2 alternates sliding and global layers, whose caches grow in different orders
        # (a sliding layer concatenates keys and values before it lets the previous step's go, a
        # global one frees each as it replaces it), and the planner repeats the middle recorded
        # layer, a sliding one, for every layer between the edges. At five layers this is
        # Gemma-2's own alternation; deeper, the layers between are the middle one's kind, as
        # the planner lays them out.
        kind = ("sliding_attention", "full_attention")
        cfg["layer_types"] = [kind[min(i, sp.EDGE) % 2] if i < layers - sp.EDGE
                              else kind[(sp.LAYERS - layers + i) % 2] for i in range(layers)]
    # bitsandbytes' blocks whole in every quantized weight (quant_infer.py).
    return qi.config(cfg, family, layers) if qi.quant_of(variant) else cfg


def key(family, mode, precision, attn, variant=""):
    return f"{family}/{mode}/{precision}/{attn}" + (f"/{variant}" if variant else "")


# T5 v1.1's output layer, a weight of its own, as the training recordings make it.
untie_t5 = sp.untie_t5


# The marks an inference recording puts in its profile: the training recordings' and the call's
# own ranges.
MARKS = re.compile(sp.ANNOTATION.pattern + "|run|forward")


def allocations(prof):
    """An inference profile's allocator events with the operators each happened inside
    (`step_programs.allocations`), this recording's marks left out."""
    return sp.allocations(prof, MARKS)


class InferJob:
    """One recorded run: every allocation and free in time order, by section and layer."""

    def __init__(self, family, mode, precision, attn, batch, seq, layers, variant=""):
        cfg = config(family, layers, variant)
        quant = qi.quant_of(variant)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[precision]
        torch.manual_seed(0)
        head = HEADS.get(family, "causal-lm")
        # Built on the meta device outside the profiler (nothing allocated), loaded inside it.
        meta = qi.build(cfg, head, "sdpa" if attn == "sdpa-math" else attn, quant) if quant else None
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof, \
                infer_recipes.repeats_marked(), qi.CudaPath() if quant else contextlib.nullcontext():
            with record_function("setup"):
                model = qi.load(meta, quant) if quant else \
                    measure.build(cfg, head, "sdpa" if attn == "sdpa-math" else attn, dtype)
                if "gated" in qi.parts(variant):
                    untie_t5(model)
                model.eval()
                sp.hook_layers(model, family)
                given = measure.inputs(cfg, head, batch, seq)
                ids = given["input_ids"]
                # T5's evaluation forward: the decoder's input as long as the encoder's (labels
                # of the input's length, shifted right, as a training step's).
                # (Shifted as `_shift_right` shifts them, without its temporary copy.)
                labels = given["labels"]
                extra = {"decoder_input_ids": torch.cat([torch.zeros_like(labels[:, :1]), labels[:, :-1]], 1)} \
                    if family == "t5" and mode == "forward" else {}
                del labels
                del given
                mask = torch.ones_like(ids)
            ranges = []

            def enter(m, a):
                ranges.append(record_function("forward"))
                ranges[-1].__enter__()

            model.register_forward_pre_hook(enter)
            model.register_forward_hook(lambda m, a, o: ranges.pop().__exit__(None, None, None))
            # `sdpa-math` asked for on the CPU, whose fused kernel would run otherwise; T5's SDPA
            # routed as a GPU routes it.
            routed = sp.gpu_sdpa(f"{family}/{mode}") if family in sp.ROUTED_SDPA and attn == "sdpa" \
                else contextlib.nullcontext()
            with record_function("run"), sp.sdpa_backend(attn), routed:
                if mode == "generate":
                    model.generation_config.pad_token_id = 0
                    # An encoder-decoder's fourth forward is a whole decode step too (`decode2`,
                    # its decoder's past one longer than `decode`'s), read for its laws alone.
                    n = NEW_TOKENS + (family in ENCODER_DECODER)
                    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n,
                                         do_sample=False, min_new_tokens=n)
                else:
                    with torch.no_grad():
                        # An encoder keeps no cache.
                        cache = {} if family in FORWARD_ONLY else {"use_cache": True}
                        out = model(input_ids=ids, **cache, **extra)
            del out
        self.params = []
        pattern = sp.layer_pattern(family)
        for name, p in model.named_parameters():
            hit = re.match(pattern.pattern + r"\.", name)
            layer = ["enc" if hit.group(1) == "encoder" else "main", int(hit.group(2))] if hit else None
            shape, nbytes = qi.param_entry(p)
            self.params.append({"name": name, "shape": shape, "bytes": nbytes, "layer": layer,
                                "ptr": p.untyped_storage().data_ptr()})
        self.dims = sp.dims(model, cfg)
        persistent = {p["ptr"]: ("param", i) for i, p in enumerate(self.params)}
        persistent.update({b.untyped_storage().data_ptr(): ("buffer", None) for b in model.buffers()})
        if quant:
            persistent.update({ptr: ("buffer", None) for ptr in qi.persistent(model)})
        persistent.update({t.untyped_storage().data_ptr(): ("input", None) for t in (ids, mask, *extra.values())})
        self._read(prof, persistent)

    def _read(self, prof, persistent):
        events = list(prof.profiler.kineto_results.events())
        self.ranges = sorted(((sp.layer_tag(e.name()), e.start_ns(), e.end_ns()) for e in events
                              if e.name().startswith("layer:")), key=lambda r: r[2] - r[1])
        setup = next((e.start_ns(), e.end_ns()) for e in events if e.name() == "setup")
        run = next((e.start_ns(), e.end_ns()) for e in events if e.name() == "run")
        # Each step begins where the model's forward begins.
        forwards = sorted(e.start_ns() for e in events if e.name() == "forward")
        bounds = [run[0]] + forwards[1:] + [run[1] + 1]
        names = ["prefill", "decode1", "decode", "decode2", "rest", "rest", "rest"]
        self.sections = [("setup", setup[0], setup[1])]
        for i in range(len(bounds) - 1):
            self.sections.append((names[i], bounds[i], bounds[i + 1] - 1))
        allocs = allocations(prof)
        self.tensors, self.events, live = [], [], {}
        for t, ptr, size, ops in allocs:
            if size > 0:
                live[ptr] = len(self.tensors)
                self.tensors.append({"size": size, "ops": ops, "ptr": ptr, "section": self.section_at(t),
                                     "layer": self.layer_at(t), "freed": None})
                self.events.append(("a", live[ptr]))
            elif ptr in live:
                i = live.pop(ptr)
                self.tensors[i]["freed"] = {"ops": ops, "section": self.section_at(t), "layer": self.layer_at(t)}
                self.events.append(("f", i))
        for tensor in self.tensors:
            tensor["role"] = persistent.get(tensor["ptr"]) if tensor["freed"] is None else None
            tensor["kernel"] = next((tag for tag, rx in sp.KERNEL_TAGS
                                     if any(rx.fullmatch(name) for name, _ in tensor["ops"])), None)
            tensor["scratch"] = bool(tensor["freed"]) and sp.cpu_scratch(tensor["ops"], tensor["freed"]["ops"])

    def section_at(self, t):
        return next((name for name, start, end in self.sections if start <= t <= end), None)

    def layer_at(self, t):
        inside = next((tag for tag, start, end in self.ranges if start <= t <= end), None)
        if inside is not None:
            return inside, inside
        began = next((start for name, start, end in self.sections if start <= t <= end), 0)
        ended = [(end, tag) for tag, start, end in self.ranges if began <= start and end < t]
        return None, (max(ended)[1] if ended else None)


def kept(job):
    """The tensors a template keeps (made in a kept section), and why each other is left out."""
    keep, left = [], {}
    for i, t in enumerate(job.tensors):
        why = None
        if t["section"] not in SECTIONS:
            why = "after the kept steps"
        elif t["scratch"]:
            why = "CPU kernel scratch"
        if why:
            left[why] = left.get(why, 0) + 1
        else:
            keep.append(i)
    return keep, left


def home(job, t):
    tensor = job.tensors[t]
    role = tensor["role"]
    if role and role[0] == "param":
        layer = job.params[role[1]]["layer"]
        return (layer[0], int(layer[1])) if layer else None
    inside, last = tensor["layer"]
    return inside if inside is not None else last


def sequence(job, keep):
    """The kept events by section, [(kind, tensor, layer)], as step_programs.sequence assigns
    layers: the layer whose module ran; between layers the one that ran last, but in a run
    that touches three or more layers' tensors (a loop over the layers), each tensor's own."""
    keep = set(keep)
    raw = {s: [] for s in SECTIONS}
    for kind, t in job.events:
        if t not in keep:
            continue
        tensor = job.tensors[t]
        where = tensor["freed"] if kind == "f" else tensor
        if where["section"] not in raw:
            continue
        inside, last = where["layer"]
        raw[where["section"]].append([kind, t, inside, last, home(job, t)])
    out = {}
    for section, events in raw.items():
        i = 0
        while i < len(events):
            if events[i][2] is not None:
                i += 1
                continue
            end = i
            while end < len(events) and events[end][2] is None:
                end += 1
            homes = {}
            for e in events[i:end]:
                if e[4] is not None:
                    homes.setdefault(e[4][0], set()).add(e[4][1])
            loop = any(len(v) >= 3 for v in homes.values())
            for e in events[i:end]:
                e[2] = (e[4] if e[4] is not None else e[3]) if loop else (e[3] if e[3] is not None else e[4])
            i = end
        i = 0
        while i < len(events):
            end = i
            while end < len(events) and events[end][0] == "f":
                end += 1
            if end > i + 1:
                events[i:end] = sorted(events[i:end], key=lambda e: (e[2] or ("", -1), e[1]))
            i = max(end, i + 1)
        out[section] = [(k, t, (c[0], int(c[1])) if c else None) for k, t, c, _, _ in events]
    return out


def fit(ns, points, d, param_shapes, what, widths, fractions=None, ops=()):
    """A size seen at three (batch, length) points [(b, x1), (b, x2), (b3, x1)] as
    {kind: {unit: bytes}}: `fixed`, `tok` (b x len), `tok_s` (b x len^2), `seq` (b), `pos`
    (len), `pos_s` (len^2); a length's law may carry a constant per sequence (a decode step's
    token beside the past's)."""
    (b, x1), (_, x2), (b3, _) = points
    n1, n2, n3 = ns
    if n1 == n2 == n3:
        if fractions:
            # A 4-bit model's: bitsandbytes' fractions of a layer's weight read too (quant_infer.py).
            return qi.fixed_law(n1, param_shapes, fractions, d, what, widths, ops)
        if n1 <= sp.TINY:
            return {"fixed": {"one": float(n1)}}
        for shape, units, coef in param_shapes:
            for w in (2, 4, 1, 8):
                if n1 == w * shape:
                    return {"fixed": {units: float(w * coef)}}
        return {"fixed": sp.per_unit(n1, d, what, widths)}
    grows_b = n3 * b == n1 * b3
    if not (grows_b or n3 == n1):
        raise sp.Unexplained(f"{what}: {ns} bytes at {points} grow with the batch in part")
    g1, g2 = (n1 / b, n2 / b) if grows_b else (n1, n2)
    kind, kind_s, kind_1 = ("tok", "tok_s", "seq") if grows_b else ("pos", "pos_s", "fixed")
    if g2 * x1 * x1 == g1 * x2 * x2:
        # Bytes a pair; per head or not by what made it (`per_head_laws.head_law`).
        return {kind_s: {"one": g1 / (x1 * x1)}}
    slope = (g2 - g1) / (x2 - x1)
    const = g1 - slope * x1
    if slope == 0:
        return {kind_1: sp.per_unit(const, d, what, widths)}
    if slope < 0 or abs(slope - round(slope)) > 1e-9:
        raise sp.Unexplained(f"{what}: {ns} bytes at {points}: no law")
    out = {kind: sp.per_unit(slope, d, what, (4, 2, 1, 8) if kind == "pos" else widths)}
    if abs(const) > 1e-9:
        if const < 0:
            raise sp.Unexplained(f"{what}: {ns} bytes at {points}: a negative constant")
        out[kind_1] = sp.per_unit(const, d, what, widths)
    return out


def law_bytes(lw, b, x, d):
    total = 0
    for kind, units in lw.items():
        for u, c in units.items():
            v = c
            for part in u.split("*"):
                v *= 1 if part == "one" else d[part]
            total += v * {"fixed": 1, "tok": b * x, "tok_s": b * x * x, "seq": b, "pos": x, "pos_s": x * x}[kind]
    return total


def points(mode, section):
    """The (batch, length) each recorded shape gives a section's laws: the prompt, or a decode
    step's past (the prompt plus the steps before it)."""
    past = {"decode1": 0, "decode": 1}.get(section, 0)
    return [(b, s + past) for b, s in sp.SHAPES]


def first_past(family, mode, s):
    """The decoder's past in the first decode step: the prompt's length, or one (the start
    token) where an encoder took the prompt."""
    return 1 if mode == "generate" and family in ENCODER_DECODER else s


def fit_decode(ns, past, what, fit_at):
    """An encoder-decoder's decode step's tensor, seen at shape 0, at shape 1 (a longer
    encoder input), at shape 2 (a larger batch) and in the step after shape 0's (a longer
    decoder past), as (its law, whether its length is the encoder's input): the law in the
    one length it grows with, the other held (`fit_at(ns, points)` fits one length); `past`:
    shape 0's in `decode`."""
    n0, n_enc, n_batch, n_past = ns
    (b, s), (_, s2), (b3, _) = sp.SHAPES
    if n0 == n_enc:
        return fit_at([n0, n_past, n_batch], [(b, past), (b, past + 1), (b3, past)]), False
    if n0 == n_past:
        return fit_at([n0, n_enc, n_batch], [(b, s), (b, s2), (b3, s)]), True
    raise sp.Unexplained(f"{what}: {ns} bytes grow with the encoder's input and with the decoder's past")


def per_head(lw, heads):
    """`lw` per head where it is one query position's scores against a length (a decode step's
    attention, the decoder's start token's against the encoder's input: `b x heads x 1 x len`):
    a whole number of at least two bytes a head each position, read by `per_unit` as bytes
    (`one`) at or under 16 a position. Its constant (the step's own position) with it."""
    grows = [c for kind in ("tok", "pos") for u, c in lw.get(kind, {}).items() if u == "one"]
    if not grows or any(c % heads or c < 2 * heads for c in grows):
        return lw
    return {kind: {("heads" if u == "one" and c % heads == 0 else u): (c / heads if u == "one" and c % heads == 0
                                                                      else c) for u, c in units.items()}
            for kind, units in lw.items()}


def tiny_sets(jobs, seqs, enc_dec, what):
    """Python numbers the CPU wraps as tensors (a GPU keeps them on the host), and a few bytes a
    sequence: what is a few bytes at the first shape (the check's) and not a weight or an input,
    each job's tensors matched to the first's by position. An encoder-decoder's first decode
    step (its decoder's past 1) is judged at the next step's sizes: a few bytes a position of
    the past are a few bytes there, and more in a long generation."""
    tiny = [set() for _ in jobs]
    for name in SECTIONS:
        made = [[t for k, t, _ in s[name] if k == "a"] for s in seqs]
        src = "decode" if enc_dec and name == "decode1" else name
        ref = [t for k, t, _ in seqs[0][src] if k == "a"]
        if len(ref) != len(made[0]):
            raise sp.Unexplained(f"{what}: decode1 makes {len(made[0])} tensors, decode {len(ref)}")
        for pos in range(len(made[0])):
            t0 = jobs[0].tensors[ref[pos]]
            if t0["size"] <= sp.TINY and t0["role"] is None:
                for i, m in enumerate(made):
                    tiny[i].add(m[pos])
    return tiny


def template(family, mode, precision, attn, variant=""):
    what = key(family, mode, precision, attn, variant)
    enc_dec = mode == "generate" and family in ENCODER_DECODER
    jobs = [isolated(family, mode, precision, attn, b, s, sp.LAYERS, variant) for b, s in sp.SHAPES]
    deep = isolated(family, mode, precision, attn, *sp.SHAPES[0], sp.CHECK_LAYERS, variant)
    base = jobs[0]
    keeps = [kept(j) for j in jobs]
    seqs = [sequence(j, k[0]) for j, k in zip(jobs, keeps)]
    for name in SECTIONS:
        if len({len(s[name]) for s in seqs}) != 1:
            raise sp.Unexplained(f"{what}: {name} has {[len(s[name]) for s in seqs]} events at {sp.SHAPES}")
    tiny = tiny_sets(jobs, seqs, enc_dec, what)
    # Dropped before the events are put in order: a run of frees sorts the same without them.
    seqs = [sequence(j, [t for t in k[0] if t not in tiny[i]]) for i, (j, k) in enumerate(zip(jobs, keeps))]
    d = base.dims
    widths = sp.widths_of("fp32" if precision == "fp32" else "bf16")
    fracs = qi.fractions(base.params, d)
    param_shapes, params = [], []
    for p in base.params:
        n = 1
        for x in p["shape"]:
            n *= x
        coef, units = sp.shape_units(p["shape"], d)
        param_shapes.append((n, units, coef))
        params.append({"name": p["name"], "units": units, "count": coef, "bytes": p["bytes"], "layer": p["layer"]})
    # The tensors each section makes, in order, matched across the shapes by position.
    made = {name: [[t for k, t, _ in s[name] if k == "a"] for s in seqs] for name in SECTIONS}
    if enc_dec:
        # The step after `decode` at shape 0, made as `decode` makes (kept as `sequence` keeps,
        # what `decode` drops as a few bytes dropped at the same places).
        after = [i for i, t in enumerate(base.tensors) if t["section"] == "decode2" and not t["scratch"]]
        decode = [t for k, t, _ in sequence(base, keeps[0][0])["decode"] if k == "a"]
        if len(after) != len(decode):
            raise sp.Unexplained(f"{what}: decode2 makes {len(after)} tensors, decode {len(decode)}")
        after = [t for t, d in zip(after, decode) if d not in tiny[0]]
    tensors, index = [], {}  # index: (shape 0's tensor) -> template tensor
    section_of = {}
    for name in ("setup", "prefill", "decode"):
        for pos, t in enumerate(made[name][0]):
            ts = [j.tensors[m[pos]] for j, m in zip(jobs, made[name])]
            role = ts[0]["role"]
            by_encoder = False
            if role and role[0] == "param":
                p = params[role[1]]
                lw = {"fixed": {p["units"]: float(p["bytes"] * p["count"])}}
            elif enc_dec and name == "decode":
                lw, by_encoder = fit_decode([x["size"] for x in ts] + [base.tensors[after[pos]]["size"]],
                                            first_past(family, mode, sp.SHAPES[0][1]) + 1, f"{what} {name} {pos}",
                                            lambda ns, pts: fit(ns, pts, d, param_shapes, f"{what} {name} {pos}",
                                                                widths, fracs, ts[0]["ops"]))
            else:
                lw = fit([x["size"] for x in ts], points(mode, name), d, param_shapes, f"{what} {name} {pos}",
                         widths, fracs, ts[0]["ops"])
            leaf = next((n for n, _ in reversed(ts[0]["ops"])), "")
            top = next((n for n, _ in ts[0]["ops"]), "")
            if not (role and role[0] == "param"):
                lw = sp.head_law(lw, d["heads"], top if top == leaf else f"{top} > {leaf}", d.get("kv_heads"))
            if enc_dec and not role:
                lw = per_head(lw, d["heads"])
            if not (role and role[0] == "param"):
                sp.refuse_rivals(lw, d, f"{what} {name} {pos} ({top} > {leaf})")
            if role and role[0] in ("param", "buffer"):
                term = "weights"
            elif role and role[0] == "input":
                term = "inputs"
            elif any("V" in u.split("*") for kk, units in lw.items() if kk != "fixed" for u in units):
                term = "logits"
            else:
                term = "activations"
            entry = {"law": lw, "term": term, "site": top if top == leaf else f"{top} > {leaf}"}
            if role and role[0] == "param":
                entry["param"] = role[1]
            if ts[0]["kernel"] == "sdpa":
                entry["kernel"] = "sdpa"
            if by_encoder:
                entry["by_encoder"] = True
            index[t] = len(tensors)
            section_of[len(tensors)] = name
            tensors.append(entry)
    # decode1 makes decode's tensors, at a past one shorter.
    dec = made["decode"][0]
    if mode == "generate":
        if len(made["decode1"][0]) != len(dec):
            raise sp.Unexplained(f"{what}: decode1 makes {len(made['decode1'][0])} tensors, decode {len(dec)}")
        for si, (j, m1) in enumerate(zip(jobs, made["decode1"])):
            b, s = sp.SHAPES[si]
            for pos, t in enumerate(m1):
                x = tensors[index[dec[pos]]]
                want = law_bytes(x["law"], b, s if x.get("by_encoder") else first_past(family, mode, s), d)
                if j.tensors[t]["size"] != want:
                    raise sp.Unexplained(f"{what}: decode1's tensor {pos} is {j.tensors[t]['size']} bytes at "
                                         f"{b}x{s}, decode's law gives {want}")
        for pos, t in enumerate(made["decode1"][0]):
            index[t] = index[dec[pos]]
    homes = {}
    for t, i in index.items():
        homes.setdefault(i, home(base, t))
    # Events: decode's frees of what decode1 made are kind 2 (the previous step's instance).
    prev = set(made["decode1"][0])
    sections, check_sizes = {}, {}
    for name in SECTIONS:
        evs = []
        for k, t, c in seqs[0][name]:
            if t not in index:
                raise sp.Unexplained(f"{what}: {name} frees a tensor made where the template keeps none")
            kind = 0 if k == "a" else (2 if name == "decode" and t in prev else 1)
            if name == "decode" and k == "f" and kind == 1 and section_of[index[t]] != "decode":
                if t not in set(made["decode"][0]):
                    raise sp.Unexplained(f"{what}: a decode step frees what {section_of[index[t]]} made")
            evs.append([kind, index[t], list(c) if c else None])
        sections[name] = evs
    if mode == "generate":
        # Nothing a decode step makes may outlive the next one: a step keeps what the one before
        # made, and no more.
        freed_later = {t for k, t, _ in seqs[0]["decode"] if k == "f"}
        for t in made["decode1"][0]:
            if t not in freed_later and base.tensors[t]["freed"] and \
                    base.tensors[t]["freed"]["section"] not in ("decode1",):
                raise sp.Unexplained(f"{what}: decode1's tensor {t} outlives the next step")
    else:
        sections["decode1"] = sections["decode"] = []
    check = {"layers": sp.CHECK_LAYERS, "batch": sp.SHAPES[0][0], "seq": sp.SHAPES[0][1]}
    dk, _ = kept(deep)
    small = tiny_sets([deep], [sequence(deep, dk)], enc_dec, what)[0]
    dk = [t for t in dk if t not in small]
    dseq = sequence(deep, dk)
    for name in SECTIONS:
        if mode != "generate" and name.startswith("decode"):
            continue
        b, s = sp.SHAPES[0]
        x = s if name in ("setup", "prefill") else first_past(family, mode, s) + (name == "decode")
        flat, live, peak, n = [], 0, 0, 0
        mine = [(k, i, tuple(c) if c else None) for k, i, c in sections[name]]
        expanded = sp.expand([("a" if k == 0 else "f", (i, k), c) for k, i, c in mine],
                             {(i, k): homes.get(i) for k, i, _ in mine},
                             {"main": sp.CHECK_LAYERS, "enc": sp.CHECK_LAYERS})
        for kind, ((i, k), _) in expanded:
            at = s if tensors[i].get("by_encoder") else x - 1 if k == 2 else x
            nbytes = int(law_bytes(tensors[i]["law"], b, at, d))
            live += nbytes if kind == "a" else -nbytes
            peak = max(peak, live)
            flat += [kind, nbytes]
            n += 1
        mine = {"events": n, "peak": peak, "digest": sp.digest(flat)}
        theirs = sp.check_of([(k, (t, None)) for k, t, _ in dseq[name]], {t: deep.tensors[t]["size"] for t in dk})
        if mine != theirs:
            import os
            if os.environ.get("INFER_PROGRAMS_CACHE"):
                with open(f"{os.environ['INFER_PROGRAMS_CACHE']}/check-{name}.json", "w") as f:
                    json.dump({"mine": flat, "theirs": [x for k, t, _ in dseq[name]
                                                        for x in (k, deep.tensors[t]["size"])],
                               "sites": [deep.tensors[t]["ops"][-1:] for k, t, _ in dseq[name]],
                               "layers": [c for k, t, c in dseq[name]]}, f)
            raise sp.Unexplained(f"{what}: the {name} section at {sp.CHECK_LAYERS} layers is not the template's "
                                 f"expansion ({theirs} recorded, {mine} expanded)")
        check[name] = mine
    return {"dims": d, "params": params, "tensors": tensors, "homes": {str(k): v for k, v in homes.items() if v},
            **sections, "check": check, "left_out": keeps[0][1], **({"encoder_decoder": True} if enc_dec else {})}


def isolated(*args):
    """A recording in a process of its own, so one recording's caches cannot change another's."""
    import multiprocessing
    import os
    import pickle
    cache = os.environ.get("INFER_PROGRAMS_CACHE")
    if cache:
        path = f"{cache}/{'-'.join(map(str, args)).replace('/', '_')}.pickle"
        if os.path.exists(path):
            with open(path, "rb") as f:
                return pickle.load(f)
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            job = pool.apply(_run, args)
        with open(path, "wb") as f:
            pickle.dump(job, f)
        return job
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_run, args)


def _run(*args):
    job = InferJob(*args)
    job.__dict__.pop("ranges", None)
    for t in job.tensors:
        t["ops"] = [(n, 0) for n, _ in t["ops"]]
        if t["freed"]:
            t["freed"]["ops"] = []
    return job


def keys(only):
    out = []
    for family in FAMILIES:
        for mode in MODES:
            if mode == "generate" and family in NO_GENERATE:
                continue
            # fp16 lays out as bf16 does, and `plan --weights` has no fp16.
            # Eager attention too wherever transformers offers both, as `--attention eager` asks.
            attns = [("bf16", "eager"), ("fp32", "eager")] if family in EAGER_ONLY else \
                [("bf16", "sdpa"), ("fp32", "sdpa"), ("bf16", "eager"), ("fp32", "eager")] \
                + ([("fp32", "sdpa-math")] if family in GROUPED else [])
            # bitsandbytes' layers at bf16 compute, over each attention a bf16 model of the family runs.
            quants = [("bf16", a, q) for p, a in attns if p == "bf16" for q in qi.QUANTS]
            for precision, attn, quant in [(p, a, "") for p, a in attns] + quants:
                for variant in ["/".join(filter(None, (v, quant))) for v in VARIANTS.get(family, ("",))]:
                    k = key(family, mode, precision, attn, variant)
                    if not only or family in only or k in only:
                        out.append((family, mode, precision, attn, variant))
    return out


TERMS = sp.TERMS


def compact(t):
    """A template as the planner reads it (`program_template.rs`): laws and sites in tables;
    each tensor `[law, term, site, param, -1, kernel, home]`; each section a flat list of
    `kind, tensor, layer` (0 allocates, 1 frees, 2 frees the previous decode step's)."""
    if "error" in t or "laws" in t:
        return t
    laws, sites, law_index, site_index = [], [], {}, {}

    def layer(c):
        return -1 if not c else sp.STACKS.index(c[0]) * 100 + int(c[1])

    rows = []
    for x in t["tensors"]:
        lk = json.dumps(x["law"], sort_keys=True)
        if lk not in law_index:
            law_index[lk] = len(laws)
            laws.append(x["law"])
        if x["site"] not in site_index:
            site_index[x["site"]] = len(sites)
            sites.append(x["site"])
        rows.append([law_index[lk], TERMS.index(x["term"]), site_index[x["site"]], x.get("param", -1), -1,
                     x.get("kernel", "")])
    for i, r in enumerate(rows):
        r.append(layer(t["homes"].get(str(i))))

    def flat(events):
        return [v for k, i, c in events for v in (k, i, layer(c))]

    by_encoder = [i for i, x in enumerate(t["tensors"]) if x.get("by_encoder")]
    return {"dims": t["dims"], "params": [[p["name"], p["units"], p["count"], p["bytes"], layer(p["layer"])]
                                          for p in t["params"]],
            "laws": laws, "sites": sites, "tensors": rows, "setup": flat(t["setup"]),
            "prefill": flat(t["prefill"]), "decode1": flat(t["decode1"]), "decode": flat(t["decode"]),
            **({"by_encoder": by_encoder} if t.get("encoder_decoder") else {}),
            "check": t["check"], "left_out": t["left_out"]}


def stated(k, t):
    """A template with what its recording assumed of kernels the CPU does not run (quant_infer.py)."""
    quant = qi.quant_of(k.split("/", 4)[4] if k.count("/") >= 4 else "")
    if quant and "error" not in t:
        t = {**t, "assumed": qi.ASSUMED_INT8 if quant == "int8" else qi.ASSUMED}
    return t


def write(path, templates):
    """`templates` in the planner's form, to `path` (packed where it ends in `.tpl`)."""
    import transformers
    template_file.write(path, {
        "about": "What transformers' inference allocates and frees: scripts/validate/infer_programs.py",
        "torch": torch.__version__, "transformers": transformers.__version__, "shapes": sp.SHAPES,
        "layers": sp.LAYERS, "edge": sp.EDGE, "new_tokens": NEW_TOKENS,
        "templates": {k: stated(k, compact(v)) for k, v in templates.items()}})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", help="comma-separated families, or whole keys (family/mode/precision/attn[/gated])")
    ap.add_argument("--merge", nargs="*", help="merge these outputs (later ones win) instead of recording")
    args = ap.parse_args()
    if args.merge:
        merged = {}
        for path in args.merge:
            for k, t in template_file.read(path)["templates"].items():
                if "error" in t and k in merged and "error" not in merged[k]:
                    continue
                merged[k] = t
        write(args.out, merged)
        return
    only = set(args.only.split(",")) if args.only else set()
    out = {}
    for job in keys(only):
        name = key(*job)
        try:
            out[name] = template(*job)
            print(f"{name}: {len(out[name]['tensors'])} tensors, left out {out[name]['left_out']}", flush=True)
        except sp.Unexplained as e:
            print(f"{name}: not recorded: {e}", file=sys.stderr, flush=True)
            out[name] = {"error": str(e)}
        write(args.out, out)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""What transformers' eager code asks of the GPU in a training step, operator by operator:
the kernel launches and the bytes their memory-bound kernels move, per layer and for the
rest of the step, for each family, precision and checkpointing. `headroom plan` times a
step from them (crates/headroom-plan/src/time.rs).

The profiler's CPU events name the ATen operators a step dispatches, the same ones a GPU
runs: each job here is recorded on the CPU with random weights and tokens, as a user's
script runs it (forward with the loss, backward, `opt.step()` of `torch.optim.AdamW`
(foreach), `opt.zero_grad(set_to_none=True)`), one steady step (the second) profiled with
shapes. For every phase (forward, backward, optimizer) it counts

- `ops`: operators dispatched from Python or from the autograd engine (the host's work:
  each costs the interpreter, the dispatcher and, where it computes, a launch);
- `nodes`: autograd functions the backward evaluates;
- `kernels`: operators that compute (what a GPU launches a kernel for: not views, not
  allocations, not composites that only call others), `matmuls` among them (timed by shape
  in the planner), and `attention` (SDPA calls, whose kernels the planner takes from the
  backend the GPU picks; their CPU kernels are left out);
- `modules`: `nn.Module` calls, and `saved`: tensors autograd saves (what non-reentrant
  checkpointing packs, repacks when it recomputes and unpacks);
- `bytes`: what the memory-bound kernels read and write, as laws in the model's
  dimensions: per token, per position, per layer parameter and, outside the layers, per
  embedding row — each a sum of `coefficient x unit`, the unit recognised from the tensor's
  shape (the recording config gives every dimension a distinct size).

A layer's figures are the difference between the model at three layers and at two; the
rest, the two-layer model less two layers. The laws are checked against a recording at
another shape before they are written.

GPU kernels that differ from the CPU's are counted as the GPU runs them: dropout is one
fused kernel writing a one-byte mask; SDPA is left to the planner.

    .venv/bin/python scripts/validate/kernel_counts.py --out data/kernels/hf.json
    .venv/bin/python scripts/validate/kernel_counts.py --only llama --precision bf16   # print one
    .venv/bin/python scripts/validate/kernel_counts.py --only gpt2 --merge --out data/kernels/hf.json

Gemma 2 has no SDPA path in transformers (its logits soft-capping runs eager attention):
the planner takes Gemma's recording for it. GPT-NeoX (rotary on part of each head) and BLOOM
(ALiBi) make tensors whose widths are no unit named here yet; the planner takes Llama's.
"""

import argparse
import collections
import contextlib
import json
import sys

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import measure  # noqa: E402

# Batch and sequence recorded, and the shape the laws are checked at: sizes no model
# dimension takes.
SHAPE = (3, 56)
CHECK = (5, 88)
DEPTHS = (2, 3)

# Grouped-query families: 15 query heads of 40, 3 key-value heads, hidden 240, MLP 704,
# vocabulary 4096, so that no unit below equals another (checked).
GQA = dict(hidden_size=240, num_attention_heads=15, num_key_value_heads=3, head_dim=40, intermediate_size=704,
           vocab_size=4096, max_position_embeddings=2048, tie_word_embeddings=False)
CONFIGS = {
    "llama": dict(GQA, model_type="llama"),
    "mistral": dict(GQA, model_type="mistral", sliding_window=None),
    "qwen2": dict(GQA, model_type="qwen2", use_sliding_window=False),
    "qwen3": dict(GQA, model_type="qwen3", use_sliding_window=False),
    "gemma": dict(GQA, model_type="gemma"),
    # Phi-3's head width is its hidden size over its heads: its query width is its hidden size.
    "phi3": dict(GQA, model_type="phi3", hidden_size=600, pad_token_id=0),
    # Multi-head families: the query, key and value widths are the hidden size by construction.
    "gpt2": dict(model_type="gpt2", n_embd=300, n_head=10, n_inner=800, n_positions=1024, vocab_size=4096),
}
PRECISIONS = ("fp32", "bf16", "amp")

# Operators that launch nothing: views, allocations, metadata, and composites whose work
# is the operators they call (counted there).
NO_KERNEL = {
    "empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "view", "_unsafe_view", "reshape",
    "_reshape_alias", "t", "transpose", "as_strided", "slice", "select", "unsqueeze", "squeeze", "expand",
    "expand_as", "permute", "narrow", "split", "split_with_sizes", "chunk", "unbind", "alias", "detach",
    "detach_", "lift_fresh", "resolve_conj", "resolve_neg", "item", "_local_scalar_dense", "resize_", "set_",
    "contiguous", "to", "_to_copy", "view_as", "flatten", "unflatten", "clone", "zeros_like", "ones_like",
    "zeros", "ones", "full", "full_like", "new_zeros", "new_ones", "new_full", "linear", "matmul",
    "layer_norm", "cross_entropy_loss", "log_softmax", "softmax", "nll_loss", "nll_loss_nd", "pad",
    "constant_pad_nd", "embedding", "embedding_backward", "is_nonzero", "_has_compatible_shallow_copy_type",
    "broadcast_tensors", "result_type", "dropout", "feature_dropout", "lift_fresh_copy", "rsub", "_reshape_copy",
    "repeat_interleave", "size", "stride", "numel", "dim", "is_same_size", "_shape_as_tensor", "diagonal",
    "sum_to_size", "masked_fill",
}
MATMULS = {"mm", "addmm", "bmm", "baddbmm", "addmv", "mv", "addbmm", "_addmm_activation", "dot"}
# Operators that write their output and read nothing of the same size.
WRITE_ONLY = {"fill_", "zero_", "normal_", "uniform_", "bernoulli_", "arange", "randint", "random_"}
# In-place operators that read only their other inputs (the first is overwritten).
OVERWRITE = {"copy_", "masked_fill_", "index_put_", "index_fill_"}
# Reductions: read the inputs, write something small.
REDUCTIONS = {"sum", "mean", "amax", "amin", "max", "min", "all", "any", "norm", "var", "std", "var_mean",
              "linalg_vector_norm", "_foreach_norm", "argmax", "logsumexp", "prod", "count_nonzero"}
SDPA_FORWARD = "aten::scaled_dot_product_attention"
SDPA_BACKWARD = "ScaledDotProduct"
LAYER_UNITS = ("1", "a", "k", "d", "d/2", "d/4", "d/8", "h", "q", "kv", "q/2", "kv/2", "q/4", "kv/4", "q/8", "kv/8",
               "f", "2f", "2h", "3h", "4h", "q+2kv", "V")


def dims(cfg):
    """The model's dimensions, by unit."""
    c = {k: v for k, v in cfg.items()}
    h = c.get("hidden_size", c.get("n_embd"))
    a = c.get("num_attention_heads", c.get("n_head"))
    k = c.get("num_key_value_heads", a)
    d = c.get("head_dim", h // a)
    f = c.get("intermediate_size", c.get("n_inner") or 4 * h)
    return {"1": 1, "a": a, "k": k, "d": d, "d/2": d / 2, "d/4": d / 4, "d/8": d / 8, "h": h, "q": a * d, "kv": k * d,
            "q/2": a * d / 2, "kv/2": k * d / 2, "q/4": a * d / 4, "kv/4": k * d / 4, "q/8": a * d / 8,
            "kv/8": k * d / 8, "f": f, "2f": 2 * f,
            "2h": 2 * h, "3h": 3 * h, "4h": 4 * h, "q+2kv": a * d + 2 * k * d, "V": c["vocab_size"],
            "P": c.get("max_position_embeddings", c.get("n_positions", 0))}


def unit_of(width, units, what):
    """The first unit whose size is `width` (units equal by construction, such as a
    multi-head model's query width and its hidden size, take the first named)."""
    for name in LAYER_UNITS:
        if abs(units[name] - width) < 1e-9:
            return name
    raise SystemExit(f"{what}: a tensor {width} wide per token is no unit of {units}")


# Units a family makes equal: a multi-head model's query and key widths are its hidden
# size (and its key heads its heads); Phi-3's query width is its hidden size.
MHA = [{"h", "q", "kv"}, {"a", "k"}, {"q/2", "kv/2"}, {"q/4", "kv/4"}, {"q/8", "kv/8"}, {"3h", "q+2kv"}]
SAME = {"gpt2": MHA, "phi3": [{"h", "q"}]}


def check_distinct(family, units):
    """No two units the same size, but for those the family makes equal."""
    seen = {}
    for name in LAYER_UNITS:
        v = units[name]
        if v in seen and not any({seen[v], name} <= group for group in SAME.get(family, [])):
            raise SystemExit(f"{family}: units {seen[v]} and {name} are both {v}: pick other dimensions")
        seen.setdefault(v, name)


class Part:
    """One phase's figures for the layers or the rest."""

    def __init__(self):
        self.n = collections.Counter()
        self.bytes = collections.Counter()

    def sub(self, other, times=1):
        p = Part()
        for k in set(self.n) | set(other.n):
            p.n[k] = self.n[k] - times * other.n[k]
        for k in set(self.bytes) | set(other.bytes):
            p.bytes[k] = self.bytes[k] - times * other.bytes[k]
        return p

    def json(self):
        laws = collections.defaultdict(dict)
        for (cls, unit), b in sorted(self.bytes.items()):
            if abs(b) > 1e-9:
                laws[cls][unit] = round(b, 6)
        return {**{k: v for k, v in sorted(self.n.items())}, "bytes": laws}


def tensors(node):
    for i in node.extra_fields.inputs:
        if isinstance(i, list):
            yield from (t for t in i if hasattr(t, "sizes"))
        elif hasattr(i, "sizes"):
            yield i


def elt(t):
    return torch.empty((), dtype=t.dtype).element_size() if t.dtype is not None else 0


class Recorder:
    def __init__(self, family, cfg, batch, seq, params):
        self.family, self.batch, self.seq = family, batch, seq
        self.units = dims(cfg)
        self.params = params  # numel of each parameter, by data pointer

    def law(self, t):
        """(class, unit, elements) of a tensor: per token (batch and sequence in its shape),
        per position (sequence only), per parameter (a parameter's shape) or per row of an
        embedding table."""
        b, s = self.batch, self.seq
        # The loss pads the labels by one position and shifts them: such a tensor is taken
        # as one a position long per position (1/s off, in integer labels).
        sizes = [s if x in (s - 1, s + 1) else x for x in t.sizes]
        numel = 1
        for x in sizes:
            numel *= x
        tokens = b * s
        if tokens in sizes or (b in sizes and s in sizes):
            if sizes.count(s) >= 2 or (tokens in sizes and s in sizes):
                raise SystemExit(f"{self.family}: a tensor of shape {sizes} grows with the square of the sequence")
            return "token", unit_of(numel / tokens, self.units, f"{self.family} {sizes}"), tokens
        if s in sizes:
            return "position", unit_of(numel / s, self.units, f"{self.family} {sizes}"), s
        u = self.units
        for rows, unit in ((u["V"], "V*h"), (u["P"], "P*h")):
            if len(sizes) == 2 and sizes[0] == rows and sizes[1] == u["h"]:
                return "table", unit, numel
        return "params", "param", 1

    def add(self, part, t, times=1.0):
        if t.dtype is None or _numel(t) == 0:
            return
        cls, unit, per = self.law(t)
        # Bytes per token (or position) per element of the unit: the coefficient of its law.
        size = self.units[unit] if cls in ("token", "position") else 1
        part.bytes[(cls, unit)] += times * _numel(t) * elt(t) / per / size

    def kernel(self, node, part):
        """One operator that computes: its launch and, unless timed elsewhere, its bytes."""
        name = node.name[6:]
        part.n["kernels"] += 1
        if name in MATMULS:
            part.n["matmuls"] += 1
            return
        ins = list(tensors(node))
        if not ins:
            return
        if name == "index_select":
            # An embedding's lookup: the rows the indices name, read and written, and the indices.
            table, index = ins[0], ins[-1]
            cls, _, per = self.law(index)
            width = unit_of(table.sizes[-1], self.units, f"{self.family} table {list(table.sizes)}")
            part.bytes[(cls, width)] += 2 * elt(table) * _numel(index) / per
            self.add(part, index)
            return
        if name == "embedding_dense_backward":
            # The table's gradient zeroed, then the output's gradient added row by row (read,
            # and each row read and written).
            grad = ins[0]
            rows = next(a for a in node.extra_fields.inputs if isinstance(a, int) and a > 1)
            self.add(part, grad, 3.0)
            table = "V*h" if rows == self.units["V"] else "P*h"
            part.bytes[("table", table)] += elt(grad)
            return
        if name in ("nll_loss_forward", "nll_loss2d_forward", "gather", "index_add_", "scatter_add_"):
            # Only the entries the indices name: as many as the indices.
            self.add(part, ins[-1] if name != "index_add_" else ins[-1], 2.0)
            return
        if name in ("nll_loss_backward", "nll_loss2d_backward"):
            # Writes the gradient of the log-probabilities; reads only the targets.
            self.add(part, ins[1])
            return
        if name in WRITE_ONLY:
            self.add(part, ins[0])
            return
        if name in OVERWRITE:
            for t in ins:
                self.add(part, t)
            return
        for t in ins:
            self.add(part, t)
        if name in REDUCTIONS:
            return
        # The output: as large as the largest input (elementwise, broadcast), or the first
        # input written again in place.
        if name.endswith("_"):
            self.add(part, ins[0])
        else:
            self.add(part, max(ins, key=lambda t: _numel(t) * elt(t)))

    def dropout(self, node, part):
        """A GPU's dropout: one kernel reading the input, writing the output and a one-byte mask."""
        part.n["kernels"] += 1
        x = next(tensors(node))
        self.add(part, x, 2.0 + 1.0 / elt(x))


def _numel(t):
    n = 1
    for s in t.sizes:
        n *= s
    return n


# What CUDA's autocast runs in fp32 and the CPU's does not (aten/src/ATen/autocast_mode.cpp,
# the `fp32` lists of the two backends): the GPU casts a 16-bit input of these up, and what
# follows in the same expression runs in fp32 (GPT-2's tanh GELU after its `pow`).
CUDA_FP32_ONLY = {"pow", "exp", "log", "log10", "log2", "log1p", "expm1", "reciprocal", "rsqrt", "acos", "asin",
                  "cosh", "sinh", "tan", "erfinv", "softplus", "layer_norm", "group_norm", "softmax", "log_softmax",
                  "sum", "prod", "cumsum", "norm", "dist", "renorm", "logsumexp", "cosine_similarity"}


@contextlib.contextmanager
def cuda_autocast():
    """CUDA's autocast policy on the CPU: while CPU autocast is on, the 16-bit floating inputs
    of an op CUDA runs in fp32 are cast to fp32 first, as the GPU would (the casts are
    recorded). The functions are wrapped where Python finds them, so a checkpointed layer's
    recomputed forward, run from the backward, is wrapped too."""

    def wrap(f):
        def upcast(*args, **kwargs):
            if torch.is_autocast_enabled("cpu"):
                up = lambda x: x.float() if isinstance(x, torch.Tensor) and x.dtype in (torch.bfloat16, torch.float16) else x
                args = tuple(up(a) for a in args)
                kwargs = {k: up(v) for k, v in kwargs.items()}
            return f(*args, **kwargs)
        return upcast

    saved = []
    for space in (torch, torch.Tensor, torch.nn.functional):
        for name in CUDA_FP32_ONLY | {f"__{n}__" for n in CUDA_FP32_ONLY}:
            f = getattr(space, name, None)
            if callable(f):
                saved.append((space, name, f))
                setattr(space, name, wrap(f))
    try:
        yield
    finally:
        for space, name, f in saved:
            setattr(space, name, f)


def record(family, precision, checkpointing, layers, batch, seq):
    """The phases' figures of one job: {phase: Part} for the whole model."""
    cfg = dict(CONFIGS[family])
    cfg["n_layer" if family == "gpt2" else "num_hidden_layers"] = layers
    # A GPU's fused SDPA kernel drops out inside the kernel; the CPU would take SDPA's math
    # path for attention with dropout and record its operators one by one. Attention
    # dropout is left out (the other dropouts stay: a GPU runs them as kernels).
    for k in ("attn_pdrop", "attention_dropout"):
        if k in cfg or family == "gpt2":
            cfg[k] = 0.0
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    torch.manual_seed(0)
    model = measure.build(cfg, "causal-lm", "sdpa", dtype, dropout=True)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg["vocab_size"], (batch, seq), generator=g)
    counts = collections.Counter()
    now = {"phase": None}

    def step():
        now["phase"] = "forward"
        with record_function("forward"):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "amp"):
                loss = model(input_ids=ids, labels=ids.clone()).loss
        now["phase"] = "backward"
        with record_function("backward"):
            loss.backward()
        now["phase"] = "optimizer"
        with record_function("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)

    def pack(t):
        counts[("saved", now["phase"])] += 1
        return t

    def module_call(m, args):
        counts[("modules", now["phase"])] += 1

    # CUDA's autocast stays on through the backward: a checkpointed layer's recomputed
    # forward runs under the autocast state checkpointing restores.
    with cuda_autocast() if precision == "amp" else contextlib.nullcontext():
        step()
        handle = torch.nn.modules.module.register_module_forward_pre_hook(module_call)
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                counts.clear()
                with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                    step()
        finally:
            handle.remove()
    params = {p.data_ptr(): p.numel() for p in model.parameters()}
    rec = Recorder(family, cfg, batch, seq, params)
    phases = {k: Part() for k in ("forward", "backward", "optimizer")}
    for (what, phase), n in counts.items():
        # Saved tensors: what the forward saves for the backward (checkpointing's own hooks
        # take the place of these inside checkpointed layers, so a checkpointed job counts
        # only those outside them); modules: the forward's, and the recomputed forward's.
        phases[phase].n[what] = n
    phases["optimizer"].n["params"] = len(params)
    phases["forward"].n["param_elements"] = sum(params.values())

    def walk(node, phase, top):
        name = node.name
        if name in phases:
            phase = name
        if node.tag != _EventType.TorchOp or phase is None:
            for c in node.children:
                walk(c, phase, top)
            return
        part = phases[phase]
        if name.startswith("autograd::engine::evaluate_function: "):
            part.n["nodes"] += 1
            if SDPA_BACKWARD in name:
                part.n["attention"] += 1
                return
            for c in node.children:
                walk(c, phase, True)
            return
        if not name.startswith("aten::"):
            for c in node.children:
                walk(c, phase, top)
            return
        if top:
            part.n["ops"] += 1
        if name == SDPA_FORWARD:
            part.n["attention"] += 1
            return
        short = name[6:]
        if short in ("dropout", "native_dropout", "feature_dropout") and any(
                isinstance(a, float) and a > 0 for a in node.extra_fields.inputs):
            rec.dropout(node, part)
            return
        if short in NO_KERNEL:
            for c in node.children:
                walk(c, phase, False)
            return
        rec.kernel(node, part)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root, None, True)
    return phases


def job(family, precision, checkpointing, shape=SHAPE):
    """Per layer and the rest, for every phase."""
    few, more = (record(family, precision, checkpointing, n, *shape) for n in DEPTHS)
    # A layer's weight-sized traffic (autocast's copies of its weights) per parameter of the
    # layer; the rest's, in bytes (norms and scalars: the tables are laws of their own).
    layer_params = more["forward"].n["param_elements"] - few["forward"].n["param_elements"]
    out = {}
    for phase in few:
        layer = more[phase].sub(few[phase])
        rest = few[phase].sub(layer, DEPTHS[0])
        fixed = layer.bytes.pop(("params", "param"), 0.0)
        if fixed:
            layer.bytes[("params", "param")] = fixed / layer_params
        fixed = rest.bytes.pop(("params", "param"), 0.0)
        if fixed:
            rest.bytes[("fixed", "1")] = fixed
        for part in (layer, rest):
            part.n.pop("param_elements", None)
        out[phase] = {"layer": layer, "rest": rest}
    return out


def bytes_at(part, units, batch, seq, layer_params, rows):
    total = 0.0
    for (cls, unit), b in part.bytes.items():
        per = {"token": batch * seq, "position": seq, "params": layer_params, "table": rows.get(unit, 0),
               "fixed": 1}[cls]
        total += b * units[unit] * per if cls in ("token", "position") else b * per
    return total


def check(family, precision, checkpointing, laws):
    """The laws read at `SHAPE` must give what is recorded at `CHECK`, byte for byte."""
    other = job(family, precision, checkpointing, CHECK)
    units = dims(CONFIGS[family])
    for phase in laws:
        for part in ("layer", "rest"):
            want = bytes_at(other[phase][part], units, *CHECK, 1, {})
            got = bytes_at(laws[phase][part], units, *CHECK, 1, {})
            # Per-parameter and table bytes do not depend on the shape; both sides read them alike.
            if abs(want - got) > 1e-3 * max(1.0, abs(want)):
                raise SystemExit(f"{family} {precision} {checkpointing} {phase} {part}: the laws give {got} bytes "
                                 f"at {CHECK}, the recording {want}")
            for k in ("ops", "kernels", "nodes", "attention", "matmuls"):
                if laws[phase][part].n[k] != other[phase][part].n[k]:
                    raise SystemExit(f"{family} {precision} {checkpointing} {phase} {part}: {k} "
                                     f"{laws[phase][part].n[k]} at {SHAPE}, {other[phase][part].n[k]} at {CHECK}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--only", help="families, comma-separated")
    ap.add_argument("--precision", help="precisions, comma-separated")
    ap.add_argument("--merge", action="store_true", help="keep the other families already in --out")
    args = ap.parse_args()
    torch.set_num_threads(1)
    families = args.only.split(",") if args.only else list(CONFIGS)
    precisions = args.precision.split(",") if args.precision else PRECISIONS
    out = {
        "about": "kernel launches and memory-bound bytes of transformers' eager training step, per layer and "
                 "for the rest (scripts/validate/kernel_counts.py)",
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "shape": list(SHAPE),
        "families": {},
    }
    if args.merge:
        with open(args.out) as f:
            out["families"] = json.load(f)["families"]
    for family in families:
        check_distinct(family, dims(CONFIGS[family]))
        for precision in precisions:
            for ckpt in ("none", "full"):
                laws = job(family, precision, ckpt == "full")
                check(family, precision, ckpt == "full", laws)
                key = f"{family}/{precision}/{ckpt}"
                out["families"][key] = {phase: {p: laws[phase][p].json() for p in ("layer", "rest")}
                                        for phase in laws}
                print(key, json.dumps(out["families"][key]), file=sys.stderr if args.out else sys.stdout,
                      flush=True)
        if args.out:
            # After each family: a long recording keeps what it has done.
            with open(args.out, "w") as f:
                json.dump(out, f, indent=1, sort_keys=True)
                f.write("\n")


if __name__ == "__main__":
    main()

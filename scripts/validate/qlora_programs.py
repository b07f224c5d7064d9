"""QLoRA's step for the step programs (`step_programs.py --qlora all|qv`): peft's LoRA over
bitsandbytes' 4-bit base, recorded as `python -m headroom_gpu record --qlora` records it —
under fake tensors, with CUDA's rules (`headroom_gpu.qlora`: NF4 packing, double-quantized
absmax, `gemm_4bit` as its dequantize-then-matmul path, `prepare_model_for_kbit_training`'s
fp32 casts, and its checkpointing where the key asks for it: `/ckpt`, its default, or `/full`,
`use_gradient_checkpointing=False`; the adapters on every linear layer, `all`, or on the query
and value projections, `qv`, the same targets as the LoRA steps' `lora-qv`) — and read into the same tensors and events a CPU recording
under the profiler gives (`step_programs.Job`), so that the law fit, the expansion's check
and the template writer are the same.

bitsandbytes has no CPU kernels for the CUDA path (its CPU backend dequantizes otherwise), so
the profiler cannot record it; the fake recorder's operators are the ones CUDA runs, and its
allocations their outputs. What the profiler gives by time, this gives by the order of the
recorder's events: a tensor's operator (the one dispatched when it was made or freed), its
step and phase, and the layer whose module ran (forward and backward hooks, each layer's
loading, peft's adapters made inside the layer they adapt), and what each `F.dropout` call made
(its noise a GPU's one-byte mask, its output and its backward's the tensor each consumed where a
replay has no dropout: `_dropouts`).

The 4-bit base's tensors are fractions of their layer's weight (out x in elements): the packed
weight half a byte an element, the dequantized absmax `1/16` (fp32, one a block of 64), its
8-bit form `1/64`, the second-level absmax `1/4096` (fp32, one a block of 256 blocks), exact
where out x in is a multiple of 16,384, as every recorded config's and every catalog model's
(dimensions multiples of 128) is; the NF4 code (16 fp32), the 8-bit dynamic map (256 fp32) and
the offset are constants.
"""

import contextlib
import re

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import step_programs as sp

# Fractions of a quantized layer's elements that bitsandbytes' tensors take, in bytes.
FRACTIONS = (0.5, 1 / 16, 1 / 64, 1 / 4096)
# bitsandbytes' constants: the NF4 code (16 fp32) and the dynamic map (256 fp32).
CONSTANTS = (64, 1024)
# Heads of 12 over 4 key-value heads for the math path's keys (`sdpa-math`), or over 12 for the
# memory-efficient kernel's (`sdpa`: `qlora_config(grouped=False)`) (no power-of-two ratio, so no weight's fraction equals
# another's, and no law of the recorded QLoRA steps has a rival reading: law_ambiguity.py), 80 wide, over a hidden size of 768 (a multiple of the
# heads, as Llama's config asks): every layer's out x in a multiple of 16,384, so bitsandbytes'
# blocks divide every weight exactly.
HEADS = {"hidden_size": 768, "num_attention_heads": 12, "num_key_value_heads": 4, "head_dim": 80}
# bitsandbytes' blocks behind FRACTIONS: (bytes a block, elements a block).
BLOCKS = ((1, 2), (4, 64), (1, 64), (4, 16384))
# The attention each key records, as transformers names it.
ATTENTION = {"sdpa": "sdpa", "sdpa-math": "sdpa", "eager": "eager"}
# The kernel a GPU runs for the key's SDPA (`headroom_gpu.sdpa`), held to the recording: fp32
# (QLoRA's at bf16 and fp32 compute), so the fused one is the memory-efficient kernel.
KERNELS = {"sdpa": "efficient", "sdpa-math": "math", "eager": None}
# Under autocast (`amp-cuda`) CUDA's policy casts SDPA's fp32 inputs to bf16, which the fused
# kernels take over grouped heads too: flash without a mask, the memory-efficient kernel with one
# (GPT-2's). Never the math path, which has no `amp-cuda` key.
FUSED = {"flash", "efficient"}
# QLoRA's precisions as the keys name them: bitsandbytes' compute dtype (`headroom_gpu.qlora.
# COMPUTE_DTYPES`; `amp-cuda` is `record --qlora --dtype amp`, under CUDA's autocast policy).
COMPUTE = {"bf16": "bf16", "fp32": "fp32", sp.AMP_CUDA: "amp"}
# The MLP width of its own some families are recorded at (`step_programs.MLP_WIDTH`, 1,184) makes
# 1,184 x 768 elements, 55.5 blocks of 16,384: its second-level absmax rounds up to 56 and fits
# no law in out x in. 1,216 = 19 x 64 keeps that width's purpose (no small multiple, half or
# twice the hidden size, the heads' widths, the vocabulary or the rank) with whole blocks.
MLP_WIDTH = 1216
# Qwen2-MoE's shared expert likewise: 832 = 13 x 64, whole blocks with the hidden size of 768, and
# no small multiple, half or twice another width of its recording config (the experts' 352, the
# heads' 960 and 320, the rank).
SHARED_EXPERT_WIDTH = 832


class _Named(TorchDispatchMode):
    """Names the operator running while the recorder sees its outputs (or a free inside it)."""

    def __init__(self, rec):
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        outer, self.rec.op = self.rec.op, f"{func.namespace}::{func.overloadpacket.__name__}"
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.rec.op = outer


def _recorder_class():
    from headroom_gpu.recorder import StepRecorder

    class Traced(StepRecorder):
        """The recorder, with each event's operator and section, and the layers' ranges in
        event order (an event at position k happens at time k; a range opened or closed
        between events at k - 0.5)."""

        def __init__(self, **kw):
            # The CPU's dropout: `_dropouts` tags its noise `dropout-mask`, which the planner sizes
            # by device (one byte an element on a GPU), as for the CPU profiler's templates.
            super().__init__(cuda_dropout=False, **kw)
            self.op = None
            self.at = {}
            self.ranges = []

        def _note(self, before):
            for k in range(before, len(self.events)):
                self.at[k] = (self.op, self._when())

        def _seen(self, t):
            before = len(self.events)
            super()._seen(t)
            self._note(before)

        def _freed(self, rec):
            before = len(self.events)
            super()._freed(rec)
            self._note(before)

        @contextlib.contextmanager
        def mark(self, tag):
            entry = [tag, len(self.events) - 0.5, None]
            self.ranges.append(entry)
            try:
                yield
            finally:
                entry[2] = len(self.events) - 0.5

    return Traced


def _layer_of(name):
    """The layer range of a module or parameter path: T5's encoder blocks a stack of their own
    (`enc`), its decoder's and every other family's layers the main one."""
    hit = re.search(r"(?:^|\.)(?:(encoder)\.block|decoder\.block|layers|h|layer)\.(\d+)(?:\.|$)", name)
    return f"layer:{'enc' if hit.group(1) else 'main'}:{hit.group(2)}" if hit else None


def _first_tensor(value):
    """The first tensor of a module's input or output (a tensor, or a tuple or list holding one)."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        return next((v for v in value if isinstance(v, torch.Tensor)), None)
    return getattr(value, "last_hidden_state", None)


def _hook_layers(model, family, rec):
    """Each layer's forward and backward marked as a range (the forward's end even where
    non-reentrant checkpointing stops a recomputation early). The backward's range opens when the
    gradient of the layer's output is made and closes when its input's is, by hooks on those two
    tensors: a module's full backward hooks would wrap its inputs and outputs in autograd nodes of
    their own, which keep the gradient the layer hands down alive until the hooks have run (one
    b x s x h fp32 tensor more at the backward's peak than `record --qlora`'s step, at BERT's
    recorded shape)."""
    pattern = sp.layer_pattern(family)
    for name, m in model.named_modules():
        hit = pattern.fullmatch(name)
        if not hit:
            continue
        tag = ("enc" if hit.group(1) == "encoder" else "main", int(hit.group(2)))

        def enter(m, *a, tag=tag):
            m._marks = getattr(m, "_marks", [])
            m._marks.append(rec.mark(tag))
            m._marks[-1].__enter__()

        def leave(m, args, output, tag=tag):
            if getattr(m, "_marks", None):
                m._marks.pop().__exit__(None, None, None)
            out, given = _first_tensor(output), _first_tensor(args)
            if out is None or given is None or not (out.requires_grad and given.requires_grad):
                return
            m._grad_marks = getattr(m, "_grad_marks", [])

            def grad_out(grad, m=m):
                m._grad_marks.append(rec.mark(tag))
                m._grad_marks[-1].__enter__()

            def grad_in(grad, m=m):
                if m._grad_marks:
                    m._grad_marks.pop().__exit__(None, None, None)

            out.register_hook(grad_out)
            given.register_hook(grad_in)

        m.register_forward_pre_hook(enter)
        m.register_forward_hook(leave, always_call=True)


@contextlib.contextmanager
def _adapters_in_layers(rec):
    """peft's adapters made inside the range of the layer they adapt."""
    import peft

    create = peft.tuners.lora.LoraModel._create_and_replace

    def layered(self, config, adapter, target, target_name, parent, current_key, **kw):
        tag = _layer_of(current_key)
        with rec.mark(sp.layer_tag(tag)) if tag else contextlib.nullcontext():
            return create(self, config, adapter, target, target_name, parent, current_key, **kw)

    peft.tuners.lora.LoraModel._create_and_replace = layered
    try:
        yield
    finally:
        peft.tuners.lora.LoraModel._create_and_replace = create


@contextlib.contextmanager
def _dropouts(rec, pairs):
    """Each dropout's call a range of its own (`dropout`), and `pairs` each dropout's tensors by
    their index in the recording: `(input, output)` for the forward, and for its backward the
    gradient handed to it and the one it made (`step_programs.DropoutSources`' pairs, which the
    profiler's storages give there). The CPU's `aten::dropout` (fake tensors' too) makes its
    noise with `aten::empty_like` in the input's dtype, where CUDA's fused dropout keeps a bool
    mask; the one operator the recorder names cannot tell the noise from any other
    `empty_like` without the range around it. `nn.Dropout` calls `F.dropout` through the
    module, so a checkpointed layer's recomputation is seen too."""
    inner = torch.nn.functional.dropout

    def index(t):
        st = rec._storages.get(t.untyped_storage())
        return None if st is None else st.index

    def pair(given, made):
        if given is not None and made is not None:
            pairs.append((index(given), index(made)))

    def backward(grad_inputs, grad_outputs):
        pair(grad_outputs[0], grad_inputs[0])

    def dropout(input, *args, **kwargs):
        with rec.mark(DROPOUT):
            out = inner(input, *args, **kwargs)
        if isinstance(out, torch.Tensor) and out is not input:
            pair(input, out)
            if out.grad_fn is not None:
                out.grad_fn.register_hook(backward)
        return out

    torch.nn.functional.dropout = dropout
    try:
        yield
    finally:
        torch.nn.functional.dropout = inner


# The range `_dropouts` marks each dropout's call with.
DROPOUT = "dropout"


def qlora_config(family, layers, cfg=None, grouped=True):
    """`cfg` (step_programs.py's config of `family` where not given) at QLoRA's recording widths;
    `grouped=False`: every head its own key-value head (Llama 2's, Phi-3-mini's)."""
    cfg = dict(cfg or sp.config(family, layers))
    if family == "bert":
        # Its heads are the hidden size over their count (64 each): no key-value heads of its own.
        cfg.update(hidden_size=HEADS["hidden_size"], num_attention_heads=HEADS["num_attention_heads"])
    elif family == "t5":
        # T5 names its widths its own way (d_model, num_heads, d_kv); its ReLU MLP of 640 makes
        # 30 blocks of 16,384 with the hidden size.
        cfg.update(d_model=HEADS["hidden_size"], num_heads=HEADS["num_attention_heads"], d_kv=HEADS["head_dim"])
    elif family == "bloom":
        # No key-value heads or head width of its own: the hidden size over the heads (64).
        cfg.update(hidden_size=HEADS["hidden_size"], n_head=HEADS["num_attention_heads"])
    else:
        cfg.update(HEADS)
    if not grouped and "num_key_value_heads" in cfg:
        cfg["num_key_value_heads"] = cfg["num_attention_heads"]
    if family == "gpt_neox":
        # Its attention reads no key-value heads and no head width (12 heads of 64), but its
        # rotary embedding would take `head_dim`'s 80 and rotate a quarter of that of a head of 64.
        del cfg["num_key_value_heads"], cfg["head_dim"]
    if cfg.get("intermediate_size") == sp.MLP_WIDTH:
        cfg["intermediate_size"] = MLP_WIDTH
    if family == "qwen2_moe":
        # Its shared expert is a linear layer bitsandbytes quantizes (the routed experts' stacks
        # are not): `step_programs`' 608 makes 608 x 768 elements, 28.5 blocks of 16,384.
        cfg["shared_expert_intermediate_size"] = SHARED_EXPERT_WIDTH
    return cfg


class QLoraJob(sp.Job):
    """`step_programs.Job`'s tensors and events for QLoRA, from the fake recorder."""

    def __init__(self, family, head, precision, attn, checkpointing, batch, seq, layers, adapters=None):
        import peft  # noqa: F401  (imported before the recording: its import-time tensors are not the step's)
        import transformers
        from headroom_gpu import qlora

        if precision not in COMPUTE or attn not in ATTENTION or head not in qlora.HEADS:
            raise sp.Unexplained("QLoRA is recorded as peft sets it up: bf16 or fp32 compute, or bf16 under CUDA's "
                                 f"autocast ({', '.join(COMPUTE)}), SDPA (or eager attention), with a head of "
                                 f"{', '.join(qlora.HEADS)}")
        self.what = f"{sp.key(family, head, precision, attn, checkpointing, adapters)} {batch}x{seq} L{layers}"
        amp = precision == sp.AMP_CUDA
        if attn == "sdpa-math" and (family not in sp.GQA_FAMILIES or amp):
            raise sp.Unexplained(f"{self.what}: SDPA's math path is recorded over grouped key-value heads in fp32, "
                                 f"which {family} has no setting for or autocast casts to bf16")
        # prepare_model_for_kbit_training casts the embeddings and norms to fp32, and
        # Linear4bit returns its input's dtype, so outside autocast SDPA runs in fp32: a GPU's
        # memory-efficient kernel over heads that are their own key-value heads (`sdpa`), its
        # math path over grouped ones (`sdpa-math`), which the kernel cannot take. Under
        # autocast it runs in bf16 on a fused kernel, over grouped heads too.
        cfg = qlora_config(family, layers, grouped=attn != "sdpa" or amp)
        fields = dict(cfg)
        config = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
        config.use_cache = False
        meta = qlora.build(config, ATTENTION[attn], model_head=head,
                           compute_dtype=qlora.COMPUTE_DTYPES[COMPUTE[precision]])
        rank = adapters[0]
        torch.manual_seed(0)
        grads = {}
        rec = _recorder_class()(fake=True, route_sdpa=True, shape=(batch, seq), kernels=False)
        with rec, contextlib.ExitStack() as stack:
            stack.enter_context(_adapters_in_layers(rec))
            stack.enter_context(_Named(rec))

            def scope(name):
                tag = _layer_of(name)
                return rec.mark(sp.layer_tag(tag)) if tag else contextlib.nullcontext()

            model = qlora.prepare(meta, rank, rec, scope=scope, checkpointing=checkpointing, targets=adapters[1])
            stack.enter_context(qlora.cuda_kernels(rec))
            stack.enter_context(sp.infer_recipes.repeats_marked(rec.mark))
            dropouts = []
            stack.enter_context(_dropouts(rec, dropouts))
            _hook_layers(model, family, rec)
            trainable = [p for p in model.parameters() if p.requires_grad]
            opt = torch.optim.AdamW(trainable, lr=1e-5, foreach=True)
            ids = torch.randint(0, config.vocab_size, (batch, seq))
            # Held as a script holds its `loss`, until the next forward's replaces it (as
            # `step_programs.steps` holds it): under checkpointing, the leaf peft's
            # `enable_input_require_grads` makes of the input embeddings' output and its gradient
            # live through the optimizer step and the next forward. The last one is let go after
            # the recording.
            for step in (1, 2):
                with rec.step():
                    # `Trainer(bf16=True)`'s autocast, cast as CUDA's is (the recorder's
                    # `headroom_gpu.amp.cuda_autocast`).
                    with torch.autocast("cuda", torch.bfloat16) if amp else contextlib.nullcontext():
                        loss = model(input_ids=ids, labels=ids).loss
                    loss.backward()
                    grads[step] = {rec._storages[p.grad.untyped_storage()].index: i
                                   for i, (_, p) in enumerate(model.named_parameters()) if p.grad is not None}
                    opt.step()
                    opt.zero_grad(set_to_none=True)
            wanted = KERNELS[attn]
            # A mask (Gemma 3's sliding layers) has transformers copy the key-value heads with
            # `repeat_kv`, which the memory-efficient kernel takes: only the math path's key
            # may hold both.
            ran = set(rec.sdpa_kernels)
            if amp and attn == "sdpa" and not (ran and ran <= FUSED):
                raise sp.Unexplained(f"{self.what}: SDPA ran {dict(rec.sdpa_kernels)}, where the key is the fused "
                                     "kernels'")
            if wanted and not amp and (wanted not in ran or attn == "sdpa" and ran != {wanted}):
                raise sp.Unexplained(f"{self.what}: SDPA ran {dict(rec.sdpa_kernels)}, where the key is {wanted}'s")
            self._read_fake(rec, model, opt, ids, family, cfg, rank, grads, dropouts)

    def _read_fake(self, rec, model, opt, ids, family, cfg, rank, grads, dropouts):
        pattern = sp.layer_pattern(family)
        index = lambda t: rec._storages[t.untyped_storage()].index  # noqa: E731
        self.params = []
        self.fractions = []
        persistent = {}
        states = {}  # tensor index -> position in params of the weight whose QuantState holds it
        for i, (name, p) in enumerate(model.named_parameters()):
            name = name.removeprefix(sp.PEFT_PREFIX)
            hit = re.match(pattern.pattern + r"\.", name)
            layer = ["enc" if hit.group(1) == "encoder" else "main", int(hit.group(2))] if hit else None
            state = getattr(p, "quant_state", None)
            if state is not None:
                # The packed weight: half a byte for each of the layer's out x in elements.
                shape, nbytes = list(state.shape), 0.5
            else:
                shape, nbytes = list(p.shape), p.element_size()
            self.params.append({"name": name, "shape": shape, "bytes": nbytes, "layer": layer})
            persistent[index(p)] = ("param", i)
            if state is not None:
                from headroom_gpu.qlora import state_tensors

                for t in state_tensors(state):
                    persistent[index(t)] = ("buffer", None)
                    states.setdefault(index(t), i)
        for b in model.buffers():
            persistent[index(b)] = ("buffer", None)
        import bitsandbytes.functional as bnbf

        persistent[index(bnbf.name2qmap["dynamic"])] = ("buffer", None)
        persistent[index(ids)] = ("input", None)
        for st in opt.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor) and v.dim() > 0:
                    persistent[index(v)] = ("state", None)
        self.dims = sp.dims(model.get_base_model(), cfg)
        self.dims["r"] = rank
        if any(re.search(r"\.experts\b.*\.lora_A\.", p["name"]) for p in self.params):
            # peft's LoRA on a stack of experts' weights: one adapter of rank E x r (`Er`), as
            # `step_programs.Job` reads it.
            self.dims["Er"] = self.dims["E"] * rank
        self.grads = grads
        # The profiler's view: sections and layer ranges by time, the innermost range first.
        self.ranges = sorted(((tag, start, end) for tag, start, end in rec.ranges
                              if tag not in ("repeat_kv", DROPOUT) and end is not None), key=lambda r: r[2] - r[1])
        repeats = [(start, end) for tag, start, end in rec.ranges if tag == "repeat_kv" and end is not None]
        dropped = [(start, end) for tag, start, end in rec.ranges if tag == DROPOUT and end is not None]
        self.sections = []
        for k in range(len(rec.events)):
            when = rec.at[k][1]
            if self.sections and self.sections[-1][0] == when:
                self.sections[-1][2] = k + 0.5
            else:
                self.sections.append([when, k - 0.5, k + 0.5])
        self.tensors, self.events = [], []
        for k, (kind, st) in enumerate(rec.events):
            op, when = rec.at[k]
            ops = [(op, 0)] if op else []
            if kind == "alloc" and any(a <= k <= b for a, b in dropped):
                # Made inside `F.dropout`: its site names the dropout, as the profiler's chain does.
                ops = [("aten::dropout", 0)] + ops
            if kind == "alloc":
                assert st.index == len(self.tensors)
                self.tensors.append({"size": st.size, "ops": ops, "section": when, "layer": self.layer_at(k),
                                     "freed": None, "repeat": any(a <= k <= b for a, b in repeats)})
                self.events.append(("a", st.index))
            else:
                self.tensors[st.index]["freed"] = {"ops": ops, "section": when, "layer": self.layer_at(k)}
                self.events.append(("f", st.index))
        step_of = {"step1.backward": 1, "step2.backward": 2}
        for i, tensor in enumerate(self.tensors):
            role = persistent.get(i) if tensor["freed"] is None else None
            grad = grads.get(step_of.get(tensor["section"]), {}).get(i)
            if grad is not None and tensor["freed"] and tensor["freed"]["section"].endswith(".optimizer"):
                role = ("grad", grad)
            tensor["role"] = role
            tensor["kernel"] = next((tag for tag, rx in sp.KERNEL_TAGS
                                     if any(rx.fullmatch(name) for name, _ in tensor["ops"])), None)
            if tensor["repeat"]:
                tensor["kernel"] = "repeat_kv"
            if tensor["ops"][:1] == [("aten::dropout", 0)]:
                # The noise (`empty_like`, in the activations' dtype on the CPU) is a GPU's
                # one-byte mask; the rest dropout's output.
                tensor["kernel"] = "dropout-mask" if tensor["ops"][-1][0] == "aten::empty_like" else "dropout"
            tensor["scratch"] = False  # a fake tensor's operators keep none
        for given, made in dropouts:
            if given is not None and made is not None and made != given:
                # A dropout's output (forward) or its backward's (the gradient times the noise):
                # the tensor it consumed where a replay has no dropout.
                self.tensors[made]["source"] = given
                self.tensors[made]["kernel"] = self.tensors[made]["kernel"] or "dropout"
        # Each quantized layer's elements as the law fit's parameter shapes: (n, units, coefficient).
        def elements(s):
            return (s[0] * s[1], *reversed(sp.shape_units(s, self.dims)))

        self.fractions = [elements(p["shape"]) for p in self.params if p["bytes"] == 0.5]
        # Each state tensor's own weight, as `fixed_law`'s `weight`: bitsandbytes sizes it by that
        # weight's elements alone, whatever width its bytes also equal at the recording.
        self.state_weights = {t: elements(self.params[i]["shape"]) for t, i in states.items()}


def fixed_law(n, param_shapes, fractions, d, what, widths, ops=(), weight=None):
    """A QLoRA tensor of the same size at every shape: a parameter's shape at an element width,
    a fraction of a quantized layer's elements, one of bitsandbytes' constants, or a unit. What
    bitsandbytes' operators make is read as a fraction first: at the recorded hidden size of 768
    an h x h layer's 8-bit absmax (h^2 / 64 bytes) is as large as a fused query-key-value bias in
    fp32 (12 h). The state of a known quantized weight (`weight`: its elements, units and
    coefficient) is read as a fraction of that weight's elements or as a constant, never as a width:
    a key projection's absmax (kv x h / 64) at 320 x 768 is also four bytes a query element (960)."""
    if n <= sp.TINY:
        return {"fixed": {"one": float(n)}}
    if weight is not None:
        shape, units, coef = weight
        hit = next((c for c in FRACTIONS if n == c * shape), None)
        if hit is not None:
            return {"fixed": {units: hit * coef}}
        if n in CONSTANTS:
            return {"fixed": {"one": float(n)}}
        raise sp.Unexplained(f"{what}: {n} bytes of bitsandbytes' state of a {shape}-element weight ({units}) "
                             f"are no fraction of its elements ({FRACTIONS}) and none of its constants")

    def copy():
        for shape, units, coef in param_shapes:
            for w in (2, 4, 1, 8):
                if n == w * shape:
                    return {"fixed": {units: float(w * coef)}}

    def fraction():
        for shape, units, coef in fractions:
            for c in FRACTIONS:
                if n == c * shape:
                    return {"fixed": {units: c * coef}}

    quantized = any(name.startswith("bitsandbytes::") for name, _ in ops)
    for read in (fraction, copy) if quantized else (copy, fraction):
        hit = read()
        if hit:
            return hit
    for shape, units, coef in fractions:
        for block_bytes, elements in BLOCKS:
            if shape % elements and n == block_bytes * -(-shape // elements):
                # A law in out x in is exact only for whole blocks (every catalog model's): any
                # other reading of these bytes (a unit, the rank) would be a coincidence.
                raise sp.Unexplained(f"{what}: {n} bytes are bitsandbytes' blocks of {elements} of a {shape}-element "
                                     f"weight rounded up, no law in its out x in: record at widths whose out x in "
                                     f"is a multiple of 16,384")
    if n in CONSTANTS:
        return {"fixed": {"one": float(n)}}
    return {"fixed": sp.per_unit(n, d, what, widths)}

"""Record a training step's allocations and frees without a GPU, as a step program that
`headroom plan --program` replays.

    from headroom_gpu.recorder import StepRecorder

    with StepRecorder(shape=(4, 1024)) as rec:   # fake tensors: no memory, no GPU
        model = build_model()                    # your own nn.Module, on the CPU
        opt = torch.optim.AdamW(model.parameters())
        batch = make_batch()
        for _ in range(3):
            with rec.step():                     # one optimizer step
                loss = model(**batch).loss
                loss.backward()
                opt.step()
                opt.zero_grad()
    rec.write("step.jsonl")

Everything runs under `FakeTensorMode`: tensors have shapes, dtypes and devices but no data, so
a 70B model records on a laptop. A `TorchDispatchMode` sees every operator's outputs and keeps
a weak reference to each new storage; the storage's finalizer is its free. Sizes are the bytes
each storage asks for: rounding them into blocks is the caching allocator's job, which the
replay does.

Each tensor is tagged with the step and phase that made it (forward from `step()`, backward
from `backward()`, optimizer from the optimizer's step hooks), the module whose forward made it
(or the autograd node in the backward), and its role, one of the plan's terms:

| role | term |
|---|---|
| a parameter or buffer a module runs with | `weights` |
| a parameter's `.grad` (after accumulation) | `gradients` |
| what the optimizer keeps in its `state` | `optimizer` |
| made in the forward or the backward | `activations` (`logits` under a module named `lm_head`) |
| made in setup and not a module's | `inputs` |
| anything else made in the optimizer step | `temporary` |

The recorder also keeps the kernels the step runs: each ATen operator a GPU runs as a kernel (not
views, metadata or allocations), with its FLOPs (`torch.utils.flop_counter`'s formulas), the
bytes of its inputs and outputs, its dtype, the shape of a matrix multiply or of attention, and
the operators the host dispatched for it (and the scalars it read back, and whether a
checkpointed module's forward ran it again in the backward). `write` writes the last step's as `kernel` lines
(`kernels="all"`: every step's; `"none"`: none), from which `headroom plan --program` times the
step; `StepRecorder(kernels=False)` keeps none.

Scaled dot-product attention is routed as an sm90 GPU routes it ([`headroom_gpu.sdpa`]), and
dropout keeps CUDA's one-byte mask where the CPU would keep noise in the input's dtype
([`headroom_gpu.dropout`]).
Operators whose output depends on data that fake tensors do not have (`nonzero`,
`masked_select`, `.item()`; MoE routing goes through them) get a stated assumption instead of a
crash: `data_dependent_fraction` of the elements kept (default 1: every token routed to every
expert that asks, the most memory), and `.item()` read as 1. The recorder lists each one it
made in `assumptions`.
"""

from __future__ import annotations

import contextlib
import gc
import json
import weakref
from typing import Any, Iterator, Optional

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_map_only
from torch.utils.weak import WeakIdKeyDictionary

from . import amp as _amp
from . import dropout as _dropout
from . import fake_cache as _fake_cache
from . import fsdp as _fsdp
from .fake_apply import overwriting_apply as _overwriting_apply
from .gradient_sums import PLAIN as _PLAIN
from .gradient_sums import GradientSums
from . import sdpa as _sdpa

SETUP, FORWARD, BACKWARD, OPTIMIZER = "setup", "forward", "backward", "optimizer"
_PHASE_ORDER = {SETUP: 0, FORWARD: 1, BACKWARD: 2, OPTIMIZER: 3}


class _Storage:
    """One storage of the recording: its allocation, and what it is."""

    __slots__ = ("index", "size", "when", "term", "site", "stream", "node")

    def __init__(self, index: int, size: int, when: str, term: str, site: str):
        self.index, self.size, self.when, self.term, self.site, self.stream = index, size, when, term, site, 0
        self.node = 0  # the autograd node that made it in the backward (`StepRecorder._node`), else 0

    def id(self) -> str:
        return f"{self.index} {self.when} {self.term} {self.site}"


class _Tracker(TorchDispatchMode):
    """Sees each operator's outputs and records the storages they bring."""

    def __init__(self, recorder: "StepRecorder"):
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _PRIM_DEVICE and len(args) == 1 and isinstance(args[0], FakeTensor):
            # A fake tensor's device, which the dispatcher asks for on most operators (two in three
            # of the calls here): answered as FakeTensorMode answers it, without its dispatch.
            return torch.device("meta") if args[0].fake_mode.in_kernel_invocation else args[0].fake_device
        if kwargs is None:
            kwargs = {}
        rec = self.recorder
        rec._summing = None
        try:
            out = func(*args, **kwargs)
        except (DynamicOutputShapeException, DataDependentOutputException):
            out = rec._assumed(func, args, kwargs)
        for t in _tensors(out):
            rec._seen(t)
        if func is _ADD and rec._phase == BACKWARD:
            rec._gradient_sum(args, out)
        if rec.kernels and rec._phase != SETUP:
            op = _OPS.get(func)
            if op is None:
                op = _OPS[func] = _Op(func)
            if op.aten:
                rec._kernel(op, args, kwargs, out)
        return out


class _CompilingTracker(_Tracker):
    """The tracker while compiled steps are recorded: off while Dynamo and Inductor compile (which
    they do only without such a mode on the stack), on while the compiled graphs run
    (headroom_gpu.compiled)."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # The attention kernels, counted as they run, in a compiled graph or out of one (the routing
        # in a graph was traced once; counting there would make the graph depend on the count).
        kind = _SDPA_FORWARD.get(func)
        if kind is not None:
            self.recorder.sdpa_kernels[kind] = self.recorder.sdpa_kernels.get(kind, 0) + 1
        return super().__torch_dispatch__(func, types, args, kwargs)


_SDPA_FORWARD = {torch.ops.aten._scaled_dot_product_flash_attention.default: _sdpa.FLASH,
                 torch.ops.aten._scaled_dot_product_efficient_attention.default: _sdpa.EFFICIENT}


_PRIM_DEVICE = torch.ops.prim.device.default
_ADD = torch.ops.aten.add.Tensor

UNPACKED = ("transformers: one sequence a row, none packed (StepRecorder(packed_sequences=True) records the mask "
            "packing needs)")

# ATen operators that launch no kernel: views and metadata (`OpOverload.is_view` finds the rest),
# allocations without a fill, and reads of a scalar; other namespaces' (`prim::device`) neither.
_NO_KERNEL = frozenset((
    "view", "_unsafe_view", "t", "transpose", "expand", "detach", "alias", "permute", "unsqueeze", "squeeze",
    "slice", "select", "split", "split_with_sizes", "unbind", "as_strided", "_reshape_alias", "view_as_real",
    "view_as_complex", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh",
    "_local_scalar_dense", "set_", "resize_", "_assert_async", "_assert_scalar", "sym_size", "sym_stride",
    "sym_numel", "sym_storage_offset", "is_same_size", "_has_compatible_shallow_copy_type", "record_stream",
))

_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64"}


def _dtype(t: torch.Tensor) -> str:
    name = _DTYPES.get(t.dtype)
    if name is None:
        name = "fp8" if "float8" in str(t.dtype) else str(t.dtype).rsplit(".", 1)[-1]
    return name


def _walk(tree: Any, out: list | None = None) -> list:
    """The tensors in an operator's arguments or outputs: nested tuples, lists and dicts, which
    is all a dispatched call holds (a walk of its own: pytree's costs more than the recording's
    other bookkeeping together)."""
    if out is None:
        out = []
    if isinstance(tree, torch.Tensor):
        out.append(tree)
    elif isinstance(tree, (tuple, list)):
        for x in tree:
            if isinstance(x, torch.Tensor):
                out.append(x)
            elif isinstance(x, (tuple, list, dict)):
                _walk(x, out)
    elif isinstance(tree, dict):
        _walk(list(tree.values()), out)
    return out


def _tensors(tree: Any) -> list:
    """The tensors holding the memory of those in `tree`: a DTensor's local shard, not its
    global size."""
    return [x for t in _walk(tree) for x in _local(t)]


def _local(t: torch.Tensor) -> list:
    """The tensors holding `t`'s memory: a DTensor's local shard (what a rank's kernel reads)."""
    if type(t) in _PLAIN or not is_traceable_wrapper_subclass(t):
        return [t]
    inner = (getattr(t, name) for name in t.__tensor_flatten__()[0])
    return [x for i in inner if isinstance(i, torch.Tensor) for x in _local(i)]



_FLOPS: dict = {}


def _flop_registry() -> dict:
    if not _FLOPS:
        from torch.utils.flop_counter import flop_registry

        _FLOPS.update(flop_registry)
    return _FLOPS


class _Op:
    """What the recording needs to know of an operator, found once: whether it is ATen's, whether it
    launches a kernel, its FLOP formula and the shape it keeps."""

    __slots__ = ("aten", "name", "read", "kernel", "flops", "mm", "sdpa", "func")

    def __init__(self, func: Any):
        self.func = func
        packet = getattr(func, "overloadpacket", None)
        self.aten = getattr(func, "namespace", "") == "aten"
        self.name = getattr(packet, "__name__", str(func))
        self.read = self.aten and self.name == "_local_scalar_dense"
        self.kernel = self.aten and self.name not in _NO_KERNEL and not getattr(func, "is_view", False)
        self.flops = _flop_registry().get(packet) if self.kernel and packet is not None else None
        self.mm = self.name in ("mm", "addmm", "bmm", "baddbmm")
        self.sdpa = "_scaled_dot_product_" in self.name


_OPS: dict = {}


def _kernel_line(op: _Op, args: tuple, kwargs: dict, out: Any) -> dict | None:
    """What a GPU's kernel for `op` does: its FLOPs (torch.utils.flop_counter's formula, where
    it has one), the bytes its inputs and outputs hold (a roofline's traffic), its dtype, and
    the shape of a matrix multiply or of attention. None for an operator that launches none. The
    fields after a kernel line's `op` and `at`, in the order they are written.
    (The recorder adds `ops`: the operators the host dispatched for it, views among them.)"""
    if not op.kernel:
        return None
    name = op.name
    inputs, outputs = _tensors((args, kwargs)), _tensors(out)
    if not inputs and not outputs:
        return None
    size = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
    traffic = size(inputs) + size(outputs)
    if out is None and name.endswith("_") and args:
        traffic += size(_tensors(args[0]))  # an in-place list (foreach) written back
    both = inputs + outputs
    first = next((t for t in both if t.is_floating_point()), both[0])
    flops = 0
    if op.flops is not None:
        try:
            flops = int(op.flops(*args, **kwargs, out_val=out))
        except Exception:  # a formula that does not take this overload's arguments
            flops = 0
    line: dict = {"name": f"aten::{name}", "flops": flops, "bytes": traffic, "dtype": _dtype(first)}
    if op.mm:
        a, b = (args[0], args[1]) if name in ("mm", "bmm") else (args[1], args[2])
        batch = a.shape[0] if a.dim() == 3 else 1
        line["mnk"] = [int(a.shape[-2]), int(b.shape[-1]), int(a.shape[-1])]
        line["batch"] = int(batch)
    elif op.sdpa:
        q, k = args[0], args[1]
        if name.endswith("_backward"):
            q, k = args[1], args[2]  # after the output's gradient
        kind = "flash" if "flash" in name else "efficient" if "efficient" in name else "cudnn"
        causal = _argument(op.func, args, kwargs, "is_causal", False)
        line["sdpa"] = kind
        line["bhqkd"] = [int(q.shape[0]), int(q.shape[1]), int(q.shape[2]), int(k.shape[2]), int(q.shape[3])]
        line["causal"] = bool(causal)
    return line


def _argument(func: Any, args: tuple, kwargs: dict, name: str, default: Any) -> Any:
    """The argument `name` of a call of `func`, by its schema's position."""
    if name in kwargs:
        return kwargs[name]
    names = [a.name for a in func._schema.arguments]
    i = names.index(name) if name in names else len(args)
    return args[i] if i < len(args) else default


class StepRecorder(GradientSums):
    """A context manager that records the step run inside it; see the module's documentation.

    `fake`: run under `FakeTensorMode` (the default; `False` records real tensors, as the CPU
    ground truth does). `route_sdpa`: route scaled dot-product attention as an sm90 GPU does.
    `shape`: the `(batch, seq)` the step runs at, written as the program's first line, so that
    `headroom plan` can fit each tensor's size law from the same step recorded at two or three
    shapes (`--program A --program B`). `compile`: record what `torch.compile` (Inductor, its
    default) compiles as Inductor partitions it, its graphs' operators run eagerly
    (headroom_gpu.compiled); without it Dynamo leaves every frame eager under the recorder.
    `cuda_dropout`: dropout keeps CUDA's one-byte mask (`headroom_gpu.dropout`, the default);
    `False` keeps the CPU's noise in the input's dtype, as the templates' recorders record it
    and tag it for the planner to size by device.

    While it runs, the objects that existed when it began are frozen out of Python's collector
    (`gc.freeze`, undone at its end, and left alone where something else froze them): each full
    collection would otherwise scan torch's and transformers' modules again.
    """

    def __init__(self, fake: bool = True, route_sdpa: bool = True, data_dependent_fraction: float = 1.0,
                 packed_sequences: bool = False, shape: tuple[int, int] | None = None, kernels: bool = True,
                 compile: bool = False, cuda_dropout: bool = True):
        self.fake = fake
        self.cuda_dropout = cuda_dropout
        self.compile = compile
        # A compiled graph's eager operators are not the kernels Inductor generates (a fused kernel
        # is many operators): timing them would be a time of some other step, so none are kept.
        kernels = kernels and not compile
        self.compiled_graphs: list = []  # headroom_gpu.compiled.Graph: each forward graph's saves
        self._param_sites: dict[int, str] = {}  # a parameter's module, for those a compiled graph takes
        self._graph_breaks = 0
        self.shape = shape
        self.kernels = kernels
        self.kernel_lines: list[tuple[int, int, dict]] = []
        self._dispatched = 0  # ATen operators dispatched since the last kernel
        self._reads = 0  # and scalars read back (`.item()`)
        self.packed_sequences = packed_sequences
        self.route_sdpa = route_sdpa
        self.data_dependent_fraction = data_dependent_fraction
        self.events: list[tuple[str, _Storage]] = []
        self.live = 0
        self.peak = 0
        self.sdpa_kernels: dict[str, int] = {}
        self.assumptions: list[str] = []
        self._storages: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._resized: WeakIdKeyDictionary = WeakIdKeyDictionary()  # freed in place: (term, site)
        self._refs: dict[int, weakref.ref] = {}
        self._handed: dict[int, _Storage] = {}  # index -> the repeated step's copy in its place
        self._count = 0
        self._step = 0
        self._phase = SETUP
        self._stepping_in_backward = False
        self._modules: list[str] = []
        self._names: dict[int, str] = {}
        self._hooked: set[int] = set()
        self._stack = contextlib.ExitStack()
        self._step_starts: list[tuple[int, int]] = []  # (events, kernel lines) where each step began
        self._sdpa_at_start: dict[str, int] = {}  # the attention calls before the last step

    # -- what a tensor is -------------------------------------------------------------------

    def _when(self) -> str:
        return SETUP if self._phase == SETUP else f"step{self._step}.{self._phase}"

    def _site(self) -> str:
        if self._phase == BACKWARD:
            node = torch._C._current_autograd_node()
            if node is not None:
                return node.name()
        if self._modules:
            return self._modules[-1]
        return "step"

    def _term(self) -> str:
        if self._phase == SETUP:
            return "inputs"
        if self._phase == OPTIMIZER or self._stepping_in_backward:
            return "temporary"
        if self._phase == FORWARD and self._modules and self._modules[-1].rsplit(".", 1)[-1] == "lm_head":
            return "logits"
        return "activations"

    def _seen(self, t: torch.Tensor) -> None:
        """Records `t`'s storage if it is new."""
        if type(t) not in _PLAIN and is_traceable_wrapper_subclass(t):
            # A DTensor (FSDP2's sharded parameters and their optimizer state) holds no memory of its
            # own: its local shard does, made under the subclass's dispatch, which no mode sees.
            for inner in _local(t):
                self._seen(inner)
            return
        try:
            st = t.untyped_storage()
        except (NotImplementedError, RuntimeError):
            return  # a tensor without storage (a sparse or nested layout's parts are seen apart)
        if st in self._storages:
            return
        size = int(st.nbytes())
        rec = _Storage(self._count, size, self._when(), self._term(), self._site())
        if self._phase == BACKWARD:
            rec.node = self._node()
        self._count += 1
        self._storages[st] = rec
        self._refs[rec.index] = weakref.ref(st, lambda _, rec=rec: self._freed(rec))
        self.events.append(("alloc", rec))
        self._peak_before = self.peak
        self.live += size
        self.peak = max(self.peak, self.live)

    def _kernel(self, op: _Op, args: tuple, kwargs: dict, out: Any) -> None:
        """Keeps the kernel `op` runs, if it runs one, after the allocations it made."""
        if op.read:
            self._reads += 1  # `.item()`: a read the host waits on, no operator of its own
            return
        self._dispatched += 1
        fields = _kernel_line(op, args, kwargs, out)
        if fields is not None:
            line = {"op": "kernel", "at": self._when(), **fields}
            if self._dispatched > 1:
                line["ops"] = self._dispatched
            if self._reads:
                line["reads"] = self._reads
            if self._phase == BACKWARD and self._modules:
                line["recompute"] = True  # a module's forward run again in the backward (checkpointing)
            self._dispatched = self._reads = 0
            self.kernel_lines.append((len(self.events), self._step, line))

    def _freed(self, rec: _Storage) -> None:
        if self._merged(rec):
            return
        self._refs.pop(rec.index, None)
        # A repeated step freed this tensor's place in the program and handed it to its own copy
        # (`repeat_step`): the copy is what dies now.
        while rec.index in self._handed:
            rec = self._handed.pop(rec.index)
        self.events.append(("free", rec))
        self.live -= rec.size

    def storage_resized(self, t: torch.Tensor) -> None:
        """`t`'s storage was resized in place (`UntypedStorage.resize_`, which no dispatch sees;
        FSDP2 frees its unsharded parameters so after a layer runs, and makes them again before it
        runs next): its bytes so far freed, and what it holds now, if anything, allocated anew, as
        a GPU's caching allocator sees it."""
        st = t.untyped_storage()
        rec = self._storages.get(st)
        if rec is not None:
            del self._storages[st]
            self._freed(rec)
            self._resized[st] = (rec.term, rec.site)
        if st.nbytes():
            self._seen(t)
            # The same parameter again: what it was for, and whose.
            if st in self._resized:
                self._storages[st].term, self._storages[st].site = self._resized.pop(st)

    def _assumed(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """An operator whose output depends on the data, which fake tensors do not have: its
        output under the stated assumption (`data_dependent_fraction` of the elements kept, every
        `.item()` read as 1)."""
        name = str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else str(func)
        x = next((a for a in args if isinstance(a, torch.Tensor)), None)
        if name == "_local_scalar_dense" and x is not None:
            value = True if x.dtype == torch.bool else (1.0 if x.is_floating_point() else 1)
            self._assume(f"{name}: .item() of a tensor read as {value}")
            return value
        if name in ("nonzero", "argwhere") and x is not None:
            rows = int(round(x.numel() * self.data_dependent_fraction))
            self._assume(f"{name}: {self.data_dependent_fraction:g} of the elements nonzero")
            return torch.empty((rows, x.dim()), dtype=torch.long, device=x.device)
        if name == "masked_select" and x is not None:
            n = int(round(x.numel() * self.data_dependent_fraction))
            self._assume(f"{name}: {self.data_dependent_fraction:g} of the elements selected")
            return torch.empty((n,), dtype=x.dtype, device=x.device)
        if name == "index" and x is not None:
            masks = [i for i in (args[1] if len(args) > 1 else []) if isinstance(i, torch.Tensor)]
            if len(masks) == 1 and masks[0].dtype == torch.bool:
                m = masks[0]
                kept = int(round(m.numel() * self.data_dependent_fraction))
                self._assume(f"index by a mask: {self.data_dependent_fraction:g} of the mask true")
                return torch.empty((kept, *x.shape[m.dim():]), dtype=x.dtype, device=x.device)
        return self._on_ones(name, func, args, kwargs)

    def _on_ones(self, name: str, func: Any, args: tuple, kwargs: dict) -> Any:
        """Any other operator of data-dependent output: run for real on inputs of ones (on the
        CPU, at their shapes), its outputs' shapes kept."""
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        devices = []

        def real(t: torch.Tensor) -> torch.Tensor:
            devices.append(t.device)
            return torch.ones(t.shape, dtype=t.dtype, device="cpu")

        with unset_fake_temporarily():
            out = func(*tree_map_only(torch.Tensor, real, args), **tree_map_only(torch.Tensor, real, kwargs))
        self._assume(f"{name}: run on inputs of ones")
        device = devices[0] if devices else torch.device("cpu")
        if not isinstance(out, torch.Tensor) and not isinstance(out, (tuple, list)):
            return out
        return tree_map_only(torch.Tensor, lambda t: torch.empty(t.shape, dtype=t.dtype, device=device), out)

    def _assume(self, note: str) -> None:
        if "of the" in note:
            note += " (StepRecorder(data_dependent_fraction=...) changes it)"
        if note not in self.assumptions:
            self.assumptions.append(note)

    def tag(self, t: torch.Tensor, term: str, site: str | None = None) -> None:
        """Says what `t`'s storage is for (one of the plan's terms), and whose it is."""
        if is_traceable_wrapper_subclass(t):
            for inner in _local(t):
                self.tag(inner, term, site)
            return
        try:
            rec = self._storages.get(t.untyped_storage())
        except (NotImplementedError, RuntimeError):
            return
        if rec is not None:
            rec.term = term
            if site is not None:
                rec.site = site

    # -- hooks ------------------------------------------------------------------------------

    def _name(self, module: torch.nn.Module) -> str:
        module = getattr(module, "_orig_mod", module)  # torch.compile's OptimizedModule: the module it compiled
        name = self._names.get(id(module))
        if name is None:
            # A module first seen outside any named one is a root: its tree is named from it.
            root = type(module).__name__
            for sub, m in module.named_modules():
                self._names.setdefault(id(m), f"{root}.{sub}" if sub else root)
                for p in m.parameters(recurse=False):
                    self._param_sites.setdefault(id(p), self._names[id(m)])
            name = self._names[id(module)]
        return name

    def _forward_pre(self, module: torch.nn.Module, _args: Any) -> None:
        if torch.compiler.is_compiling() or (self.compile and isinstance(module, torch.fx.GraphModule)):
            # Dynamo tracing the hook (it runs nothing in the graph), or a compiled graph run: its
            # operators are the compiled module's.
            return
        name = self._name(module)
        self._modules.append(name)
        if self.compile and module is not getattr(module, "_orig_mod", module):
            # torch.compile(module): the modules inside run no hooks; their parameters are the graph's.
            for m in module._orig_mod.modules():
                self._own(m, self._name(m))
            return
        self._own(module, name)

    def _own(self, module: torch.nn.Module, name: str) -> None:
        """Tags `module`'s own parameters and buffers, and hooks its trainable parameters' gradients."""
        for p in module.parameters(recurse=False):
            self.tag(p, "weights", name)
            if p.requires_grad and id(p) not in self._hooked:
                # Only trainable parameters get gradients: a frozen base (LoRA) has no hook.
                self._hooked.add(id(p))
                p.register_post_accumulate_grad_hook(self._gradient)
        for b in module.buffers(recurse=False):
            self.tag(b, "weights", name)
        for p in _fsdp.sharded_parameters(module):
            self.tag(p, "weights", name)

    def compiled_parameter(self, p: torch.nn.Parameter, path: str) -> None:
        """A parameter a compiled graph takes as an input (`path`: its module, as Dynamo found it),
        which no module hook tagged where the module ran inside the graph."""
        if torch.compiler.is_compiling():
            return
        self.tag(p, "weights", self._param_sites.get(id(p), path))
        if p.requires_grad and id(p) not in self._hooked:
            self._hooked.add(id(p))
            p.register_post_accumulate_grad_hook(self._gradient)

    def _gradient(self, p: torch.Tensor) -> None:
        if p.grad is not None:  # None where an optimizer in the backward has stepped and freed it
            self.tag(p.grad, "gradients")

    def _forward_post(self, module: torch.nn.Module, _args: Any, _out: Any) -> None:
        if torch.compiler.is_compiling() or (self.compile and isinstance(module, torch.fx.GraphModule)):
            return
        if self._modules:
            self._modules.pop()

    def _optimizer_pre(self, _opt: torch.optim.Optimizer, _args: Any, _kwargs: Any) -> None:
        if torch.compiler.is_compiling():
            return
        if torch._C._current_graph_task_id() != -1:
            # An optimizer stepped from a gradient hook (optimizer in backward): its step is part of
            # the backward, its temporaries `temporary`.
            self._stepping_in_backward = True
        else:
            self._phase = OPTIMIZER

    def _optimizer_post(self, opt: torch.optim.Optimizer, _args: Any, _kwargs: Any) -> None:
        if torch.compiler.is_compiling():
            return
        self._stepping_in_backward = False
        for state in opt.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    self.tag(v, "optimizer")

    def _backward(self, original):
        def backward(*args, **kwargs):
            if torch.compiler.is_compiling():
                return original(*args, **kwargs)  # AOTAutograd tracing the joint graph
            if self._phase != SETUP:
                self._phase = BACKWARD
            try:
                return original(*args, **kwargs)
            except RuntimeError as e:
                if "hasPrimaryContext" not in str(e) or torch.cuda.is_available():
                    raise
                raise RuntimeError(
                    "the backward of fake CUDA tensors needs a GPU's context, and this machine has none: build the "
                    "model and the inputs on the CPU (leave out .cuda() and device='cuda'); the recording is the same "
                    "and attention is still routed as on an sm90 GPU") from e
            finally:
                self._last_node = self._summing = None

        return backward

    # -- the recording ----------------------------------------------------------------------

    @contextlib.contextmanager
    def step(self) -> Iterator["StepRecorder"]:
        """One optimizer step: its forward begins here."""
        self._step += 1
        self._phase = FORWARD
        self._step_starts.append((len(self.events), len(self.kernel_lines)))
        self._sdpa_at_start = dict(self.sdpa_kernels)
        yield self

    def repeat_step(self) -> bool:
        """Writes one more step as the last one repeated: its allocations and frees, in order, with
        their sizes, terms and sites, under fresh indices and the next step's name, and its kernels.
        Call it where the last `step()` has just ended, and only where that step is the steady one
        (every step after the first does the same thing: the optimizer's state exists). What the
        step frees of the step before it (a script's `loss`, held until the next forward's replaces
        it, and what its graph keeps) the repeat frees of the last step: its counterpart, the
        allocation of the same phase, size and site at the same rank. It refuses, returning False
        and changing nothing, a step that frees what has no counterpart, which the repeat could not
        name. The steps so made are the steps recorded, operation for operation
        (python/tests/test_recorder.py checks it on GPT-2 and Llama), at no dispatch cost."""
        if not self._step_starts:
            return False
        first, kernels_at = self._step_starts[-1]
        segment = self.events[first:]
        mine = {id(rec) for op, rec in segment if op == "alloc"}
        earlier = {id(rec) for op, rec in segment if op == "free" and id(rec) not in mine}
        counterparts = self._counterparts(earlier) if earlier else {}
        if counterparts is None:
            return False
        old, new = f"step{self._step}.", f"step{self._step + 1}."
        self._step += 1
        self._step_starts.append((len(self.events), len(self.kernel_lines)))
        at_start, self._sdpa_at_start = self._sdpa_at_start, dict(self.sdpa_kernels)
        for kind, calls in self._sdpa_at_start.items():
            self.sdpa_kernels[kind] = calls + calls - at_start.get(kind, 0)
        copies: dict[int, _Storage] = {}
        shift = len(self.events) - first
        kernel_lines = [(at + shift, self._step, {**line, "at": new + line["at"][len(old):]})
                        for at, _, line in self.kernel_lines[kernels_at:]]
        for op, rec in segment:
            if op == "alloc":
                copy = _Storage(self._count, rec.size, new + rec.when[len(old):], rec.term, rec.site)
                copy.stream = rec.stream
                self._count += 1
                copies[id(rec)] = copy
                self.events.append(("alloc", copy))
                self.live += copy.size
                self.peak = max(self.peak, self.live)
            elif id(rec) in copies:
                self.events.append(("free", copies[id(rec)]))
                self.live -= rec.size
            else:
                # The last step's counterpart goes; its copy in this step lives on in its place,
                # and is what the counterpart's storage frees when it dies.
                gone = counterparts[id(rec)]
                self.events.append(("free", gone))
                self.live -= gone.size
        for gone in counterparts.values():
            self._handed[gone.index] = copies[id(gone)]
        self.kernel_lines.extend(kernel_lines)
        return True

    def _counterparts(self, earlier: set[int]) -> Optional[dict[int, "_Storage"]]:
        """For each of the step before the last's allocations in `earlier` (by `id`), the last
        step's allocation in its place: the same phase, size and site, at the same rank among
        those. None where one has none."""
        if len(self._step_starts) < 2:
            return None
        before, last = self._step_starts[-2][0], self._step_starts[-1][0]

        def ranked(events: list) -> dict:
            seen: dict[tuple, int] = {}
            out = {}
            for op, rec in events:
                if op != "alloc":
                    continue
                key = (rec.when.partition(".")[2], rec.size, rec.site)
                seen[key] = seen.get(key, -1) + 1
                out[id(rec)] = (key, seen[key], rec)
            return out

        prev = ranked(self.events[before:last])
        place = {(key, n): rec for key, n, rec in ranked(self.events[last:]).values()}
        found = {}
        for i in earlier:
            if i not in prev or prev[i][:2] not in place:
                return None
            found[i] = place[prev[i][:2]]
        return found

    def __enter__(self) -> "StepRecorder":
        try:
            return self._enter()
        except BaseException:
            # What was entered before the failure (the fake mode, the hooks, the patches) is undone:
            # left on, it would make every later recording and model in the process fail.
            self._stack.close()
            raise

    def _enter(self) -> "StepRecorder":
        s = self._stack
        if gc.get_freeze_count() == 0:
            # The objects from before the recording (torch's and transformers' modules, hundreds of
            # thousands) are not scanned again by each full collection, which took a sixth of a 70B
            # step's recording. Collection runs as often on the objects the step makes: a storage
            # a reference cycle holds is freed where it was.
            gc.freeze()
            s.callback(gc.unfreeze)
        if self.fake:
            from torch._subclasses.fake_tensor import FakeTensorMode

            s.enter_context(_fake_cache.faster_cache_keys())
            mode = FakeTensorMode(allow_non_fake_inputs=True)
            s.enter_context(_fake_cache.whole_storages(mode))
            s.enter_context(mode)
        nn = torch.nn.modules.module
        s.callback(nn.register_module_forward_pre_hook(self._forward_pre).remove)
        # always_call: a forward stopped early (non-reentrant checkpointing stops its recomputation
        # once it has what the backward needs) leaves the module's scope too.
        s.callback(nn.register_module_forward_hook(self._forward_post, always_call=True).remove)
        import torch.optim.optimizer as opt
        s.callback(opt.register_optimizer_step_pre_hook(self._optimizer_pre).remove)
        s.callback(opt.register_optimizer_step_post_hook(self._optimizer_post).remove)
        for owner, name in ((torch.autograd, "backward"), (torch.autograd, "grad")):
            original = getattr(owner, name)
            setattr(owner, name, self._backward(original))
            s.callback(setattr, owner, name, original)
        if self.route_sdpa:
            f = torch.nn.functional
            original = f.scaled_dot_product_attention
            routed = _sdpa.routed(original, self.sdpa_kernels, count=not self.compile)
            f.scaled_dot_product_attention = _amp.autocast_first(routed)
            s.callback(setattr, f, "scaled_dot_product_attention", original)
        s.enter_context(_amp.cuda_autocast(self._assume))  # torch.autocast("cuda") casts as on a GPU
        if self.cuda_dropout and not self.compile:
            # Dropout keeps CUDA's one-byte mask, not the CPU's noise in the input's dtype. A compiled
            # graph's dropout is Inductor's to lower, and left to it.
            s.enter_context(_dropout.cuda_dropout())
        self._assume_unpacked()
        if self.fake:
            original_apply = torch.nn.Module._apply
            torch.nn.Module._apply = _overwriting_apply(original_apply)
            s.callback(setattr, torch.nn.Module, "_apply", original_apply)
        if self.compile:
            from . import compiled

            s.enter_context(compiled.recording(self))
            self._graph_breaks = compiled.graph_breaks()
            s.callback(self._assume_compiled)
        s.enter_context(_CompilingTracker(self) if self.compile else _Tracker(self))
        s.enter_context(_fsdp.storage_resizes(self))
        return self

    def _assume_compiled(self) -> None:
        from . import compiled

        if self._unpacked_in_graph:
            self._assume(UNPACKED)
        for note in compiled.notes(self.compiled_graphs, compiled.graph_breaks() - self._graph_breaks):
            self._assume(note)

    _unpacked_in_graph = False

    def _assume_unpacked(self) -> None:
        """transformers looks for packed sequences in the position ids, a decision on data that fake
        tensors cannot make, and then builds the full causal mask: the recording assumes one
        sequence a row, as a batch of unpacked sequences has (`packed_sequences=True` keeps the
        mask)."""
        if not self.fake or self.packed_sequences:
            return
        try:
            from transformers import masking_utils
        except ImportError:
            return
        original = getattr(masking_utils, "find_packed_sequence_indices", None)
        if original is None:
            return
        def unpacked(position_ids: Any) -> None:
            # What the check allocates on its way to finding one sequence a row.
            mask = original(position_ids)
            if mask is not None:
                (mask[:, -1] == 0).all()
            if torch.compiler.is_compiling():
                # Traced by Dynamo: the note is added after the step, as reading the notes here would
                # make the graph depend on them (and compile again once the note is there).
                self._unpacked_in_graph = True
            else:
                self._assume(UNPACKED)
            return None

        masking_utils.find_packed_sequence_indices = unpacked
        self._stack.callback(setattr, masking_utils, "find_packed_sequence_indices", original)

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()

    def to_jsonl(self, kernels: str = "last") -> str:
        """The step program: docs/TRACE_FORMAT.md's lines, ids by the step programs' convention
        (a compiled step marked `{"op":"compiled"}`), and the kernels of the last step
        (`kernels="all"`: of every step; `"none"`: none)."""
        encode = json.JSONEncoder(separators=(",", ":")).encode  # json.dumps's, made once
        lines = []
        if self.shape is not None:
            batch, seq = self.shape
            lines.append(json.dumps({"op": "shape", "batch": batch, "seq": seq}, separators=(",", ":")))
        if self.compile:
            # The planner's cue that the step has no kernels to time by design (docs/TRACE_FORMAT.md).
            lines.append('{"op":"compiled"}')
        wanted = [k for k in self.kernel_lines if kernels == "all" or (kernels == "last" and k[1] == self._step)]
        at = 0
        # An allocation's and a free's line written as json.dumps writes it, without its encoder.
        quoted = json.encoder.encode_basestring_ascii
        for i, (op, rec) in enumerate(self.events):
            while at < len(wanted) and wanted[at][0] <= i:
                lines.append(encode(wanted[at][2]))
                at += 1
            if op == "alloc":
                lines.append(f'{{"op":"alloc","id":{quoted(rec.id())},"size":{rec.size}}}')
            else:
                lines.append(f'{{"op":"free","id":{quoted(rec.id())}}}')
        lines.extend(encode(k[2]) for k in wanted[at:])
        return "\n".join(lines) + "\n"

    def write(self, path: str, kernels: str = "last") -> None:
        """Writes the step program to `path` (`kernels`: as `to_jsonl`)."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_jsonl(kernels))

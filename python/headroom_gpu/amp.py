"""CUDA's autocast, for a step recorded on the CPU.

`torch.autocast("cuda", torch.bfloat16)` switches itself off where CUDA is not available, and
the recorder's tensors are CPU tensors, which CUDA's autocast kernels (the `AutocastCUDA`
dispatch key) never see. CPU autocast does see them, but it casts by its own op lists: on the
CPU `softmax`, `layer_norm`, `pow`, `rsqrt` and the losses keep their input's dtype, where CUDA
runs them in fp32; `addmv`, `einsum` and the RNN cells keep fp32 on the CPU, where CUDA runs them
in bf16. The tensors a step keeps differ accordingly.

`cuda_autocast()` makes CPU autocast cast as CUDA's does, for the duration of a recording:

- `torch.autocast("cuda", dtype)` (and `torch.amp.autocast`, `torch.cuda.amp.autocast`) enter
  CPU autocast with the dtype CUDA's would use (float16 when none is given, as on CUDA), so the
  `AutocastCPU` dispatch key runs for the recorder's tensors, with PyTorch's own weight cache,
  nesting and `enabled=False` regions;
- the `AutocastCPU` kernels are replaced, operator by operator, by CUDA's policy, read from the
  installed torch's own `ATen/autocast_mode.h` (`AT_FORALL_LOWER_PRECISION_FP`, `AT_FORALL_FP32`,
  `AT_FORALL_FP32_SET_OPT_DTYPE`, `AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE`,
  `AT_FORALL_PROMOTE`) and applied as `autocast_mode.h` applies it (`cached_cast`: a float32 leaf
  parameter's cast is kept until the outermost autocast region ends); an operator CPU autocast
  casts and CUDA's does not runs uncast; `binary_cross_entropy` is refused as on CUDA;
- other libraries' operators (`torchvision::roi_align`) are cast as their libraries' own CUDA
  autocast kernels cast them (`cuda_autocast`'s documentation says how);
- `torch.is_autocast_enabled()` without a device, which asks about CUDA's autocast, answers for
  the CPU's that stands for it (peft's 4-bit LoRA layers ask it whether to cast their adapters'
  output back to the layer's dtype themselves).

The kernels are Python kernels at the `AutocastCPU` key (`torch.library`), above autograd, so
the casts are in the autograd graph and the backward keeps what a GPU's keeps; leaving the
context removes them, and CPU autocast is PyTorch's own again.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import warnings
import weakref
from typing import Any, Callable, Iterator

import torch
from torch.utils._pytree import tree_flatten, tree_map_only, tree_unflatten

LOWER_PRECISION_FP = "lower_precision_fp"
FP32 = "fp32"
FP32_SET_OPT_DTYPE = "fp32_set_opt_dtype"
FP32_APPEND_DTYPE = "fp32_append_dtype"
PROMOTE = "promote"
BANNED = "banned"

_LISTS = {
    "AT_FORALL_LOWER_PRECISION_FP": LOWER_PRECISION_FP,
    "AT_FORALL_FP32": FP32,
    "AT_FORALL_FP32_SET_OPT_DTYPE": FP32_SET_OPT_DTYPE,
    "AT_FORALL_PROMOTE": PROMOTE,
}

# `AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE` names the overload it wraps and the C++ signature
# it redispatches to, not that signature's overload name: the target, from
# native_functions.yaml. An entry this map lacks is refused when the policy is read.
_APPEND_DTYPE_TARGET = {"norm.Scalar": "norm.ScalarOpt_dtype", "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype",
                        # Named dimensions' overload: in the header up to torch 2.14.
                        "norm.names_ScalarOpt_dim": "norm.names_ScalarOpt_dim_dtype"}

# Registered in autocast_mode.cpp rather than by the header's lists, besides the refusal of
# binary_cross_entropy: cuDNN's own operators, which a CPU tensor never reaches.
_CPP_ONLY = {"aten::cudnn_convolution", "aten::cudnn_convolution_transpose", "aten::_cudnn_rnn"}
# Registered in autocast_mode.cpp with a policy of its own (a square root of a symmetric matrix, in
# fp32: what a fake CUDA tensor under CUDA's autocast returns).
_CPP_POLICY = {"aten::linalg_matrix_sqrth": FP32}

_BCE_BANNED = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
    "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
    "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
    "safe to autocast.")


def _header() -> str:
    path = os.path.join(os.path.dirname(torch.__file__), "include", "ATen", "autocast_mode.h")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise RuntimeError(f"CUDA's autocast policy is read from the installed torch's {path}, which is missing "
                           f"({e}); reinstall torch from its wheel, which ships its headers") from e


@functools.lru_cache(maxsize=None)
def _read_policy() -> tuple[tuple[str, str], ...]:
    return tuple(_policy_of_header().items())


def cuda_policy() -> dict[str, str]:
    """CUDA's autocast policy of the installed torch: `aten::op.overload` → policy."""
    return dict(_read_policy())


def _policy_of_header(text: str | None = None) -> dict[str, str]:
    """CUDA's autocast policy as `autocast_mode.h`'s `text` (the installed torch's when None)
    lists it."""
    text = _header() if text is None else text
    policy: dict[str, str] = {}
    for macro, kind in _LISTS.items():
        start = text.find(f"#define {macro}(_)")
        if start < 0:
            raise RuntimeError(f"the installed torch's ATen/autocast_mode.h has no {macro}: its autocast "
                               f"policy cannot be read (torch {torch.__version__})")
        block = text[start:text.find("\n\n", start)].replace("\\\n", " ")
        for op, overload in re.findall(r"_\((\w+)(?:,\s*(\w+))?\)", block):
            policy[f"aten::{op}.{overload}" if overload else f"aten::{op}"] = kind
    start = text.find("#define AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(_)")
    block = text[start:text.find("\n\n", start)] if start >= 0 else ""
    for source in re.findall(r'"([\w.]+)"', block):
        if source not in _APPEND_DTYPE_TARGET:
            raise RuntimeError(f"CUDA's autocast redispatches {source} to an overload this recorder does not know "
                               f"(torch {torch.__version__}): add it to headroom_gpu.amp._APPEND_DTYPE_TARGET")
        policy[f"aten::{source}"] = FP32_APPEND_DTYPE
    policy["aten::binary_cross_entropy"] = BANNED
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    known = set(torch._C._dispatch_get_all_op_names())
    for name, kind in _CPP_POLICY.items():
        # Asking about an operator the installed torch lacks raises (linalg_matrix_sqrth is newer
        # than torch 2.11).
        if name in known and has(name, "AutocastCUDA"):
            policy[name] = kind
    return policy


def cuda_registered() -> set[str]:
    """The `aten` operators the installed torch registers a CUDA autocast kernel for (its
    dispatcher's word, against which `cuda_policy` is checked). Other libraries' operators are
    cast by their own kernels (`cuda_autocast`)."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return {n for n in torch._C._dispatch_get_all_op_names()
            if n.startswith("aten::") and has(n, "AutocastCUDA")} - _CPP_ONLY


@functools.lru_cache(maxsize=None)
def _cpu_autocast_ops() -> frozenset[str]:
    """The operators CPU autocast has kernels for (read before any of ours are registered)."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return frozenset(n for n in torch._C._dispatch_get_all_op_names()
                     if n.startswith("aten::") and has(n, "AutocastCPU"))


def _op(name: str) -> Any:
    namespace, qualified = name.split("::", 1)
    op, _, overload = qualified.partition(".")
    return getattr(getattr(getattr(torch.ops, namespace), op), overload or "default")


class _Policy:
    """CUDA's casts (autocast_mode.h), on the CPU's tensors."""

    def __init__(self) -> None:
        self.cache: dict[int, tuple[weakref.ref, torch.Tensor]] = {}
        self.exclude = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)

    @staticmethod
    def eligible(t: Any) -> bool:
        return isinstance(t, torch.Tensor) and t.is_floating_point() and t.device.type == "cpu" \
            and t.dtype != torch.float64

    def cast(self, to: torch.dtype, t: Any) -> Any:
        """`at::autocast::cached_cast`."""
        if not self.eligible(t) or t.dtype == to:
            return t
        if (to == torch.get_autocast_dtype("cpu") and t.dtype == torch.float32 and t.requires_grad and t.is_leaf
                and not t._is_view() and torch.is_autocast_cache_enabled()):
            hit = self.cache.get(id(t))
            if hit is not None and hit[0]() is t:
                return hit[1]
            out = t.to(to)
            self.cache[id(t)] = (weakref.ref(t), out)
            return out
        return t.to(to)

    def cast_all(self, to: torch.dtype, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Every argument cast, the last first: the C++ policy casts them in a call's argument
        list, which GCC (PyTorch's Linux wheels) evaluates right to left, so a GPU makes a
        linear layer's weight's copy before its input's."""
        leaves, spec = tree_flatten((args, kwargs))
        cast = [self.cast(to, t) if isinstance(t, torch.Tensor) else t for t in reversed(leaves)]
        return tree_unflatten(cast[::-1], spec)

    def promoted(self, args: tuple, kwargs: dict) -> torch.dtype:
        """`at::autocast::promote_type`: the autocast dtype, widened to fp32 by any fp32 input."""
        current = torch.get_autocast_dtype("cpu")
        for t in [*args, *kwargs.values()]:
            for x in (t if isinstance(t, (list, tuple)) else [t]):
                if self.eligible(x) and x.dtype == torch.float32:
                    current = torch.float32
        return current

    def kernel(self, name: str, kind: str) -> Callable[..., Any]:
        op = _op(name)
        schema = op._schema
        names = [a.name for a in schema.arguments]
        target = _op("aten::" + _APPEND_DTYPE_TARGET[name.split("::", 1)[1]]) if kind == FP32_APPEND_DTYPE else None

        def autocast(*args: Any, **kwargs: Any) -> Any:
            with torch._C._ExcludeDispatchKeyGuard(self.exclude):
                if kind == LOWER_PRECISION_FP:
                    args, kwargs = self.cast_all(torch.get_autocast_dtype("cpu"), args, kwargs)
                elif kind == FP32:
                    args, kwargs = self.cast_all(torch.float32, args, kwargs)
                elif kind == PROMOTE:
                    args, kwargs = self.cast_all(self.promoted(args, kwargs), args, kwargs)
                elif kind == FP32_SET_OPT_DTYPE:
                    if args and self.eligible(args[0]):
                        at = names.index("dtype")
                        if at < len(args):
                            if args[at] is None:
                                args = (*args[:at], torch.float32, *args[at + 1:])
                        elif kwargs.get("dtype") is None:
                            kwargs = {**kwargs, "dtype": torch.float32}
                elif kind == FP32_APPEND_DTYPE:
                    full = [kwargs.get(a.name, a.default_value) if i >= len(args) else args[i]
                            for i, a in enumerate(schema.arguments)]
                    dtype = torch.float32 if self.eligible(full[0]) else full[0].dtype
                    return target(*full, dtype=dtype)
                elif kind == BANNED:
                    raise RuntimeError(_BCE_BANNED)
                return op(*args, **kwargs)

        return autocast

    def clear(self) -> None:
        self.cache.clear()


def _uncast(name: str) -> Callable[..., Any]:
    """An operator CPU autocast casts and CUDA's does not: on to the next key, as CUDA's
    fallthrough goes, with autocast still on for the operators it calls (`cross_entropy_loss`'s
    `log_softmax` and `nll_loss` are cast by their own policies)."""
    op = _op(name)
    key = torch._C.DispatchKey.AutocastCPU

    def fallthrough(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        return op.redispatch(keyset.remove(key), *args, **kwargs)

    return fallthrough


def _by_argument(schema: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """A call's arguments by their schema's names, however the caller passed them (Python by
    keyword, C++ every one positionally)."""
    named = {a.name: v for a, v in zip(schema.arguments, args)}
    named.update(kwargs)
    return named


def _dtypes(x: Any) -> Any:
    return tree_map_only(torch.Tensor, lambda t: t.dtype, x)


class _LibraryKernel:
    """Another library's operator that its library gives a CUDA autocast kernel and no CPU one
    (torchvision's `roi_pool`, `ps_roi_align`, `deform_conv2d`...): a GPU runs that kernel, C++
    whose casts are not listed anywhere, so they are asked of it: the kernel runs on fake CUDA
    tensors of the call's dtypes, and the dtypes it hands the operator and returns are applied to
    the CPU's tensors, once per operator and dtypes. Where the kernel cannot run on fake tensors
    the operator runs uncast, and the recording says so."""

    def __init__(self, name: str, policy: _Policy, assume: Callable[[str], None]) -> None:
        self.name, self.policy, self.assume = name, policy, assume
        self.op = _op(name)
        self.known: dict[tuple, tuple[dict[str, Any], Any] | None] = {}

    def casts(self, args: tuple, kwargs: dict) -> tuple[dict[str, Any], Any] | None:
        """The dtypes the CUDA kernel passes the operator, by argument, and those it returns."""
        from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
        from torch.fx.experimental.symbolic_shapes import ShapeEnv
        from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

        op, schema, seen = self.op, self.op._schema, []

        class Inner(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, a: tuple = (), k: dict | None = None) -> Any:
                if func is op and not seen:
                    seen.append(_dtypes(_by_argument(schema, a, k or {})))
                return func(*a, **(k or {}))

        def cuda(t: torch.Tensor) -> torch.Tensor:
            return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="cuda")

        dtype = torch.get_autocast_dtype("cpu")
        was = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
        with unset_fake_temporarily(), _disable_current_modes():
            # A shape environment: detection's operators (nms) return data-dependent sizes.
            with FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True):
                a, k = tree_map_only(torch.Tensor, cuda, (args, kwargs))
                torch.set_autocast_enabled("cuda", True)
                torch.set_autocast_dtype("cuda", dtype)
                try:
                    with Inner():
                        out = op(*a, **k)
                finally:
                    torch.set_autocast_enabled("cuda", was[0])
                    torch.set_autocast_dtype("cuda", was[1])
        return (seen[0], _dtypes(out)) if seen else None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = (tuple(t.dtype for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)),
               torch.get_autocast_dtype("cpu"))
        if key not in self.known:
            reason = "it does not call the operator"
            try:
                self.known[key] = self.casts(args, kwargs)
            except Exception as e:  # noqa: BLE001 - any failure of the library's kernel on fake tensors
                self.known[key] = None
                reason = f"{type(e).__name__}: {str(e).splitlines()[0]}" if str(e) else type(e).__name__
            if self.known[key] is None:
                self.assume(f"{self.name}: run without its library's CUDA autocast casts, which its kernel "
                            f"did not show on fake CUDA tensors ({reason})")
        found = self.known[key]
        with torch._C._ExcludeDispatchKeyGuard(self.policy.exclude):
            if found is None:
                return self.op(*args, **kwargs)
            into, returned = found
            named = _by_argument(self.op._schema, args, kwargs)
            cast = {n: _cast_like(self.policy, v, into.get(n)) for n, v in named.items()}
            given = [a.name for a in self.op._schema.arguments][:len(args)]
            out = self.op(*[cast[n] for n in given], **{n: v for n, v in cast.items() if n not in given})
            return _cast_like(None, out, returned)


def _cast_like(policy: _Policy | None, value: Any, dtypes: Any) -> Any:
    """`value`'s tensors cast to `dtypes` (the same structure; `None` leaves it as it is):
    through autocast's cache where `policy` is given and the tensor is one it casts."""
    if dtypes is None:
        return value
    leaves, spec = tree_flatten(value)
    targets = tree_flatten(dtypes)[0]
    if len(targets) != len(leaves):
        return value
    cast = []
    for t, to in zip(leaves, targets):
        if isinstance(t, torch.Tensor) and isinstance(to, torch.dtype) and t.dtype != to:
            t = policy.cast(to, t) if policy is not None and policy.eligible(t) else t.to(to)
        cast.append(t)
    return tree_unflatten(cast, spec)


def _library_ops() -> tuple[set[str], set[str]]:
    """Other libraries' operators (every namespace but `aten`) with an `AutocastCPU` kernel, and
    with an `AutocastCUDA` one."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    names = [n for n in torch._C._dispatch_get_all_op_names() if not n.startswith("aten::")]
    return {n for n in names if has(n, "AutocastCPU")}, {n for n in names if has(n, "AutocastCUDA")}


_ACTIVE: list[_Policy] = []


def autocast_first(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` (scaled dot-product attention, routed to a GPU's kernel before the dispatcher sees
    it) with CUDA autocast's casts of `aten::scaled_dot_product_attention` applied first, so that
    the kernel is chosen for the dtype a GPU sees."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if not _ACTIVE or not torch.is_autocast_enabled("cpu"):
            return fn(*args, **kwargs)
        policy = _ACTIVE[-1]
        with torch._C._ExcludeDispatchKeyGuard(policy.exclude):
            args, kwargs = policy.cast_all(torch.get_autocast_dtype("cpu"), args, kwargs)
            return fn(*args, **kwargs)

    wrapped.__wrapped__ = fn  # type: ignore[attr-defined]
    return wrapped


def _warn(note: str) -> None:
    warnings.warn(f"the recording assumes: {note}", stacklevel=2)


@contextlib.contextmanager
def cuda_autocast(assume: Callable[[str], None] = _warn) -> Iterator[dict[str, str]]:
    """While active, `torch.autocast("cuda", ...)` autocasts CPU tensors as CUDA's autocast casts
    CUDA tensors. Yields the policy (`aten::op.overload` → policy) it applies to PyTorch's own
    operators; `assume` is told of any other library's operator whose casts could not be read.

    Other libraries register operators in namespaces of their own (`torchvision::roi_align`), and
    some give them autocast kernels. CUDA autocast's fallback is a fallthrough, so on a GPU such
    an operator is cast by its library's `AutocastCUDA` kernel or not at all:

    - a CUDA kernel and a CPU one: the CPU one is left to run. A library writes its autocast
      wrapper once and registers it for each device's key (torchvision's `roi_align` and `nms`:
      fp32 inputs, the output back in the input's dtype, on either key);
    - a CUDA kernel only: its casts are read from it on fake CUDA tensors (`_LibraryKernel`);
    - a CPU kernel only: the operator runs uncast, as the GPU's fallthrough runs it."""
    policy_of = cuda_policy()
    policy = _Policy()
    cpu_only = _cpu_autocast_ops() - set(policy_of)
    library_cpu, library_cuda = _library_ops()
    libs = {"aten": torch.library.Library("aten", "IMPL")}

    def lib(name: str) -> Any:
        namespace = name.split("::", 1)[0]
        if namespace not in libs:
            libs[namespace] = torch.library.Library(namespace, "IMPL")
        return libs[namespace]
    from torch.amp import autocast_mode

    original_init = autocast_mode.autocast.__init__
    original_clear = torch.clear_autocast_cache

    def init(self: Any, device_type: str, dtype: Any = None, enabled: bool = True, cache_enabled: Any = None) -> None:
        # Where CUDA's own autocast is already on, the step's tensors are fake CUDA tensors cast by
        # CUDA's own kernels, and its regions stay CUDA's: a `torch.autocast("cuda", enabled=False)`
        # inside (transformers' rotary embeddings, up to 5.17) switches CUDA's off, not the CPU's.
        if device_type == "cuda" and not torch.is_autocast_enabled("cuda"):
            # CUDA's default dtype (float16), not the CPU's (bfloat16).
            dtype = torch.get_autocast_dtype("cuda") if dtype is None else dtype
            device_type = "cpu"
        original_init(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    def clear() -> None:
        policy.clear()
        original_clear()

    original_enabled = torch.is_autocast_enabled

    def enabled(*args: Any, **kwargs: Any) -> bool:
        # Without a device, `torch.is_autocast_enabled()` asks about CUDA's autocast, which the
        # CPU's stands for here: peft's 4-bit LoRA layers ask it whether to cast their adapters'
        # output back to the layer's dtype (not under autocast) or leave it to autocast.
        if not args and not kwargs:
            return original_enabled() or original_enabled("cpu")
        return original_enabled(*args, **kwargs)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "overriding a previously registered kernel": the point
            # allow_override: a library's own kernel registered with torch.library (from Python)
            # is overridden as a C++ one is, until the context ends.
            for name, kind in policy_of.items():
                lib(name).impl(name.split("::", 1)[1], policy.kernel(name, kind), "AutocastCPU", allow_override=True)
            for name in cpu_only | (library_cpu - library_cuda):
                lib(name).impl(name.split("::", 1)[1], _uncast(name), "AutocastCPU", with_keyset=True,
                               allow_override=True)
            for name in library_cuda - library_cpu:
                lib(name).impl(name.split("::", 1)[1], _LibraryKernel(name, policy, assume), "AutocastCPU",
                               allow_override=True)
        autocast_mode.autocast.__init__ = init
        torch.clear_autocast_cache = clear
        torch.is_autocast_enabled = enabled
        _ACTIVE.append(policy)
        yield policy_of
    finally:
        if policy in _ACTIVE:
            _ACTIVE.remove(policy)
        torch.clear_autocast_cache = original_clear
        torch.is_autocast_enabled = original_enabled
        autocast_mode.autocast.__init__ = original_init
        for each in libs.values():
            each._destroy()
        policy.clear()

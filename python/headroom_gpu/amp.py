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
  casts and CUDA's does not runs uncast; `binary_cross_entropy` is refused as on CUDA.

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
from torch.utils._pytree import tree_flatten, tree_unflatten

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


def _policy_of_header() -> dict[str, str]:
    text = _header()
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
    """The operators the installed torch registers a CUDA autocast kernel for (its dispatcher's
    word, against which `cuda_policy` is checked)."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return {n for n in torch._C._dispatch_get_all_op_names() if has(n, "AutocastCUDA")} - _CPP_ONLY


@functools.lru_cache(maxsize=None)
def _cpu_autocast_ops() -> frozenset[str]:
    """The operators CPU autocast has kernels for (read before any of ours are registered)."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return frozenset(n for n in torch._C._dispatch_get_all_op_names() if has(n, "AutocastCPU"))


def _op(name: str) -> Any:
    qualified = name.split("::", 1)[1]
    op, _, overload = qualified.partition(".")
    return getattr(getattr(torch.ops.aten, op), overload or "default")


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


@contextlib.contextmanager
def cuda_autocast() -> Iterator[dict[str, str]]:
    """While active, `torch.autocast("cuda", ...)` autocasts CPU tensors as CUDA's autocast casts
    CUDA tensors. Yields the policy (`aten::op.overload` → policy) it applies."""
    policy_of = cuda_policy()
    policy = _Policy()
    cpu_only = _cpu_autocast_ops() - set(policy_of)
    lib = torch.library.Library("aten", "IMPL")
    from torch.amp import autocast_mode

    original_init = autocast_mode.autocast.__init__
    original_clear = torch.clear_autocast_cache

    def init(self: Any, device_type: str, dtype: Any = None, enabled: bool = True, cache_enabled: Any = None) -> None:
        if device_type == "cuda":
            # CUDA's default dtype (float16), not the CPU's (bfloat16).
            dtype = torch.get_autocast_dtype("cuda") if dtype is None else dtype
            device_type = "cpu"
        original_init(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    def clear() -> None:
        policy.clear()
        original_clear()

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "overriding a previously registered kernel": the point
            for name, kind in policy_of.items():
                lib.impl(name.split("::", 1)[1], policy.kernel(name, kind), "AutocastCPU")
            for name in cpu_only:
                lib.impl(name.split("::", 1)[1], _uncast(name), "AutocastCPU", with_keyset=True)
        autocast_mode.autocast.__init__ = init
        torch.clear_autocast_cache = clear
        _ACTIVE.append(policy)
        yield policy_of
    finally:
        if policy in _ACTIVE:
            _ACTIVE.remove(policy)
        torch.clear_autocast_cache = original_clear
        autocast_mode.autocast.__init__ = original_init
        lib._destroy()
        policy.clear()

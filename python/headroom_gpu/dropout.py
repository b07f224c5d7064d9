"""CUDA's dropout, for a step recorded on the CPU.

`aten::dropout` (what `F.dropout`, `nn.Dropout` and SDPA's math path call) chooses its kernel by
device. On CUDA, in training, at a rate strictly between 0 and 1 and on a non-empty input, it
runs the fused `native_dropout`, which keeps a bool mask, one byte an element, for the backward
(`native_dropout_backward`). On the CPU (and so for the recorder's fake CPU tensors) it runs the
unfused `_dropout`: its noise is `empty_like(input)`, in the input's dtype, made by
`bernoulli_` and `div_`, and multiplied in (`MulBackward0` keeps the noise). A bf16 step's noise
is twice the GPU's mask, an fp32 one's four times.

`cuda_dropout()` gives `aten::dropout` CUDA's choice on CPU tensors for as long as it is
active: a kernel at the `AutogradCPU` key, which takes precedence over the composite, runs
`native_dropout` where CUDA would, and the composite itself otherwise (a rate of 0 or eval mode
returns the input; a rate of 1 multiplies by zero). `dropout_` (in place), `feature_dropout`
and `alpha_dropout` are unfused on CUDA too, and are left as they are.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

_DROPOUT = torch.ops.aten.dropout.default


def _fused(input: torch.Tensor, p: float, train: bool) -> bool:
    """Whether CUDA's `dropout` runs `native_dropout` (ATen's `is_fused_kernel_acceptable`)."""
    return input.is_nested or (train and 0.0 < p < 1.0 and input.numel() > 0)


def _dropout(input: torch.Tensor, p: float, train: bool) -> torch.Tensor:
    if _fused(input, p, train):
        return torch.native_dropout(input, p, train)[0]
    # ATen's own composite (not `OpOverload.decompose`, which prefers torch._decomp's Python
    # decomposition: `native_dropout` at a rate of 1 too, where ATen multiplies by zero).
    return _DROPOUT._op_dk(torch._C.DispatchKey.CompositeImplicitAutograd, input, p, train)


@contextlib.contextmanager
def cuda_dropout() -> Iterator[None]:
    """While active, `aten::dropout` on CPU tensors keeps what CUDA's keeps: a bool mask."""
    lib = torch.library.Library("aten", "IMPL")
    try:
        lib.impl("dropout", _dropout, "AutogradCPU")
        yield
    finally:
        lib._destroy()

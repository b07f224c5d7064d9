"""SDPA's memory-efficient kernel on the CPU, for recording a step as a GPU runs it.

The step programs record on the CPU's kernels (`step_programs.Job`), and where the CPU's fused
kernel keeps what a GPU's does (the output and a log-sum-exp) that is enough. T5 is where it is
not: its attention mask is the position bias, which a full fine-tuning trains, and the CPU runs
SDPA with a mask that requires a gradient on its math path, keeping the b·h·s·s probabilities
for the backward. A GPU runs the memory-efficient kernel there (`headroom_gpu.sdpa.backend`:
16-bit or fp32 heads with a mask), which keeps the output, the bias it was handed and a
log-sum-exp, and whose backward makes the bias's gradient.

ATen has no CPU kernel for `_scaled_dot_product_efficient_attention`. `registered()` gives it one
for as long as it is entered, with its backward, each allocating exactly what the CUDA kernel
returns (`aten/src/ATen/native/transformers/cuda/attention.cu` and `attention_backward.cu`):

- forward: the output laid out (b, s, h, d) and handed back transposed; the log-sum-exp, fp32,
  (b, h, s rounded up to 32) where a gradient is wanted and (b, h, 0) where not; the dropout's
  seed and offset, host tensors on a GPU, made here of no bytes;
- backward: the query's, key's and value's gradients with their inputs' strides, and the bias's
  gradient where the bias requires one, its last dimension padded to 16 and sliced back.

Autograd's own derivative of the operator (derivatives.yaml) saves its inputs and outputs and
calls the backward, so the step keeps what a GPU's keeps. The arithmetic in between is the math
path's, in fp32, in tensors made and freed inside the call: scratch, which the recording leaves
out as it leaves out every CPU kernel's (`step_programs.CPU_KERNELS`); a GPU kernel keeps its
own in registers and shared memory.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

import torch

FORWARD = "_scaled_dot_product_efficient_attention"
BACKWARD = "_scaled_dot_product_efficient_attention_backward"
# The operators' names as the profiler gives them, for `step_programs.CPU_KERNELS`.
OPERATORS = (f"aten::{FORWARD}", f"aten::{BACKWARD}")

# The CUDA kernel's log-sum-exp is padded to this many positions (`kAlignLSE`) ...
ALIGN_LSE = 32
# ... and the bias's gradient to this many in its last dimension (`attention_backward.cu`).
ALIGN_BIAS_GRAD = 16


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def _scores(query: torch.Tensor, key: torch.Tensor, attn_bias: torch.Tensor | None, is_causal: bool,
            scale: float | None) -> torch.Tensor:
    """The pre-softmax scores in fp32: scratch."""
    factor = scale if scale is not None else 1 / math.sqrt(query.shape[-1])
    w = (query.float() @ key.float().transpose(-1, -2)) * factor
    if attn_bias is not None:
        w = w + attn_bias.float()
    if is_causal:
        s, k = w.shape[-2], w.shape[-1]
        w = w.masked_fill(torch.ones(s, k, dtype=torch.bool).triu(1), float("-inf"))
    return w


def forward(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *, scale=None):
    """The CPU stand-in for the CUDA kernel: its outputs, allocated as the kernel allocates them.
    Dropout is the kernel's own (its random state two numbers on the host): not applied."""
    b, h, s = query.shape[0], query.shape[1], query.shape[2]
    out = torch.empty((b, s, h, value.shape[-1]), dtype=query.dtype).transpose(1, 2)
    lse = torch.empty((b, h, _round_up(s, ALIGN_LSE) if compute_log_sumexp else 0), dtype=torch.float32)
    w = _scores(query, key, attn_bias, is_causal, scale)
    if compute_log_sumexp:
        lse[..., :s].copy_(torch.logsumexp(w, -1))
    out.copy_(torch.softmax(w, -1) @ value.float())
    del w
    empty = torch.empty(0, dtype=torch.long)
    return out, lse, empty, empty.clone()


def backward(grad_out, query, key, value, attn_bias, out, logsumexp, philox_seed, philox_offset, dropout_p,
             grad_input_mask, is_causal=False, *, scale=None):
    """The gradients the CUDA backward returns, allocated as it allocates them."""
    factor = scale if scale is not None else 1 / math.sqrt(query.shape[-1])
    p = torch.softmax(_scores(query, key, attn_bias, is_causal, scale), -1)
    do = grad_out.float()
    dv = p.transpose(-1, -2) @ do
    dp = do @ value.float().transpose(-1, -2)
    dw = p * (dp - (dp * p).sum(-1, keepdim=True))
    del p, dp
    made = []
    for t, g in ((query, dw @ key.float() * factor), (key, dw.transpose(-1, -2) @ query.float() * factor),
                 (value, dv)):
        made.append(torch.empty_strided(t.shape, t.stride(), dtype=t.dtype).copy_(g))
        del g
    grad_bias = None
    if attn_bias is not None and grad_input_mask[3]:
        shape = list(attn_bias.shape)
        last = shape[-1]
        shape[-1] = _round_up(last, ALIGN_BIAS_GRAD)
        grad_bias = torch.empty(shape, dtype=attn_bias.dtype)[..., :last].copy_(dw)
    return made[0], made[1], made[2], grad_bias


@contextlib.contextmanager
def registered() -> Iterator[None]:
    """While entered, the memory-efficient kernel and its backward run on CPU tensors."""
    lib = torch.library.Library("aten", "IMPL")
    try:
        lib.impl(FORWARD, forward, "CPU")
        lib.impl(BACKWARD, backward, "CPU")
        yield
    finally:
        lib._destroy()

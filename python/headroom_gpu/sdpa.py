"""Scaled dot-product attention as an sm90 GPU runs it, for recording on a machine without one.

PyTorch picks SDPA's kernel from the device: a CPU (or a fake tensor, which cannot ask a GPU)
takes another path than an H100, and the kernels keep very different tensors for the backward.
The fused kernels keep the output and a log-sum-exp of b·h·s floats; the math path keeps the
b·h·s·s probabilities. So the recorder routes each call by the planner's GPU rule
(research: sdpa-backends.md) to the ATen operator of the kernel a GPU would run. Each of those
operators has its own fake implementation and derivative, so the recording holds what that
kernel allocates and keeps:

- **flash** (`_scaled_dot_product_flash_attention`): fp16/bf16, no mask, a head of at most 256,
  and a causal mask only over a square;
- **memory-efficient** (`_scaled_dot_product_efficient_attention`): fp32 without a grouped
  key/value broadcast, and fp16/bf16 with a mask (cuDNN's choice on sm90 keeps the same
  tensors: the output, the bias and a log-sum-exp);
- **math** (`_scaled_dot_product_attention_math`): everything else, fp32 with grouped heads
  among them.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

FLASH = "flash"
EFFICIENT = "efficient"
MATH = "math"

_SIXTEEN_BIT = (torch.float16, torch.bfloat16)


def backend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Any, is_causal: bool,
            enable_gqa: bool) -> str:
    """The kernel an sm90 GPU runs for this call."""
    head = query.shape[-1]
    grouped = enable_gqa and key.shape[-3] != query.shape[-3]
    square = query.shape[-2] == key.shape[-2]
    if query.dtype in _SIXTEEN_BIT:
        if attn_mask is None and head <= 256 and key.shape[-1] == head == value.shape[-1] and (square or not is_causal):
            return FLASH
        return EFFICIENT if not grouped else MATH
    if query.dtype == torch.float32 and not grouped and key.shape[-1] == head:
        return EFFICIENT
    return MATH


def _additive(attn_mask: Any, dtype: torch.dtype) -> Any:
    """A boolean mask as the additive bias PyTorch makes of it (`convert_boolean_attn_mask`)."""
    if attn_mask is None or attn_mask.dtype != torch.bool:
        return attn_mask
    bias = torch.zeros_like(attn_mask, dtype=dtype)
    return bias.masked_fill_(attn_mask.logical_not(), float("-inf"))


def routed(original: Callable[..., torch.Tensor], chosen: dict, count: bool = True) -> Callable[..., torch.Tensor]:
    """`torch.nn.functional.scaled_dot_product_attention` by the GPU's rule; `chosen` counts
    the calls each kernel took (`count=False`: counted by the caller, as a compiled step's
    recorder counts the kernels its graphs run)."""

    def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                     enable_gqa=False):
        kind = backend(query, key, value, attn_mask, is_causal, enable_gqa)
        if count:
            chosen[kind] = chosen.get(kind, 0) + 1
        if kind == FLASH:
            return torch.ops.aten._scaled_dot_product_flash_attention(
                query, key, value, dropout_p, is_causal, False, scale=scale)[0]
        if kind == EFFICIENT:
            bias = _additive(attn_mask, query.dtype)
            if bias is not None:
                shape = (query.shape[0], query.shape[-3], query.shape[-2], key.shape[-2])
                bias = bias.expand(shape)
            grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
            return torch.ops.aten._scaled_dot_product_efficient_attention(
                query, key, value, bias, grad, dropout_p, is_causal, scale=scale)[0]
        return torch.ops.aten._scaled_dot_product_attention_math(
            query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa)[0]

    scaled_dot_product_attention.__wrapped__ = original  # type: ignore[attr-defined]
    return scaled_dot_product_attention

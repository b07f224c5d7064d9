"""`Module._apply` for modules of fake parameters (headroom_gpu.recorder enters it)."""

from __future__ import annotations

from typing import Any

import torch


def overwriting_apply(original: Any) -> Any:
    """`Module._apply` (what `.to()`, `.float()`, `.cuda()` run) for a module of fake
    parameters. PyTorch swaps a fake parameter's contents in place, which fails once anything
    holds a weak reference to it (peft's adapters moved to their base layer's device fail so):
    a converted parameter replaces the old one instead, as
    `torch.__future__.set_overwrite_module_params_on_conversion(True)` does for real ones."""
    from torch._subclasses.fake_tensor import FakeTensor

    def _apply(module: torch.nn.Module, fn: Any, recurse: bool = True) -> torch.nn.Module:
        own = list(module._parameters.values()) + list(module._buffers.values())
        if not any(isinstance(t, FakeTensor) for t in own):
            if recurse:
                for child in module.children():
                    _apply(child, fn)
            return original(module, fn, recurse=False)
        if recurse:
            for child in module.children():
                _apply(child, fn)
        for key, param in module._parameters.items():
            if param is None:
                continue
            with torch.no_grad():
                applied = fn(param)
            if applied is not param:
                module._parameters[key] = torch.nn.Parameter(applied, requires_grad=param.requires_grad)
        for key, buf in module._buffers.items():
            if buf is not None:
                module._buffers[key] = fn(buf)
        return module

    return _apply

"""FakeTensorMode's dispatch cache, as the recorder runs it: its keys flattened without the
generic walk, and no entry for an operator whose output holds more storage than it spans.

Under fake tensors nearly every operator is a hit in FakeTensorMode's dispatch cache, and most
of a hit's cost is its key: each tensor argument's metadata (`TensorMetadata`) flattened into a
list by `TensorMetadata._flatten_into`, which asks `dataclasses.fields` for the fields on every
call and sends each shape and stride through the generic argument walk
(`FakeTensorMode._prep_args_for_hash`) one integer at a time. `faster_cache_keys()` replaces it,
while the recording runs, with one that writes the same list: the field names found once, and a
shape or stride of plain integers written as that walk writes it (its type, `length_N`, then each
integer's type and value). Anything else, a symbolic size among them, still goes through the
walk. The keys being the same, the cache hits, misses and outputs are the same.

A cache hit makes its output anew with `empty_strided(shape, stride)`, whose storage spans the
view alone: an output that is a slice of a larger allocation (the memory-efficient attention's
bias gradient, made with its last dimension padded to 16 and sliced back) or one of several views
of one allocation (its packed query-key-value gradient) is recorded whole on the first call and
short, or apart, on every later one. `whole_storages(mode)` keeps such an operator out of the
cache, so each call runs its fake kernel and the recording holds the storage CUDA allocates.
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
from typing import Any, Iterator

import torch


def flatten_into(fields: tuple[str, ...]) -> Any:
    """`TensorMetadata._flatten_into` for a dataclass of `fields`."""
    sym_int = torch.SymInt

    def _flatten_into(self: Any, result: list, mode: Any, state: Any) -> None:
        for name in fields:
            value = getattr(self, name)
            if isinstance(value, (tuple, list)):
                if all(type(v) is int for v in value):
                    result.append(type(value))
                    result.append(f"length_{len(value)}")
                    for v in value:
                        result.append(int)
                        result.append(v)
                else:
                    mode._prep_args_for_hash(result, value, state, [])
            elif isinstance(value, sym_int):
                state.convert_sym_int(result, value)
            else:
                result.append(value)

    return _flatten_into


@contextlib.contextmanager
def faster_cache_keys() -> Iterator[None]:
    """FakeTensorMode's cache keys flattened by `flatten_into` inside; as before outside (and
    throughout, where this PyTorch has no `TensorMetadata._flatten_into` to replace)."""
    from torch._subclasses import fake_tensor

    meta = getattr(fake_tensor, "TensorMetadata", None)
    original = meta.__dict__.get("_flatten_into") if meta is not None else None
    if original is None or not dataclasses.is_dataclass(meta):
        yield
        return
    meta._flatten_into = flatten_into(tuple(f.name for f in dataclasses.fields(meta)))
    try:
        yield
    finally:
        meta._flatten_into = original


def spanned_bytes(t: torch.Tensor) -> int:
    """The bytes of storage a strided tensor reaches, from its storage's start."""
    if t.numel() == 0:
        return 0
    last = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return (last + 1) * t.element_size()


@contextlib.contextmanager
def whole_storages(mode: Any) -> Iterator[None]:
    """While inside, `mode` (a FakeTensorMode) caches no operator whose output holds more storage
    than it spans (as before outside, and throughout where this PyTorch's cache has no such
    check to extend)."""
    from torch._subclasses import fake_tensor

    original = getattr(type(mode), "_validate_output_for_cache_entry", None)
    bypass = getattr(fake_tensor, "_BypassDispatchCache", None)
    if original is None or bypass is None:
        yield
        return

    def validate(self: Any, state: Any, key: Any, func: Any, args: Any, kwargs: Any, output: Any) -> None:
        original(self, state, key, func, args, kwargs, output)
        if isinstance(output, torch.Tensor) and output.layout == torch.strided \
                and output.untyped_storage().nbytes() > spanned_bytes(output):
            raise bypass("an output's storage beyond its view")

    mode._validate_output_for_cache_entry = types.MethodType(validate, mode)
    try:
        yield
    finally:
        del mode._validate_output_for_cache_entry

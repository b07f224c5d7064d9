"""FakeTensorMode's dispatch-cache keys, flattened without the generic walk.

Under fake tensors nearly every operator is a hit in FakeTensorMode's dispatch cache, and most
of a hit's cost is its key: each tensor argument's metadata (`TensorMetadata`) flattened into a
list by `TensorMetadata._flatten_into`, which asks `dataclasses.fields` for the fields on every
call and sends each shape and stride through the generic argument walk
(`FakeTensorMode._prep_args_for_hash`) one integer at a time. `faster_cache_keys()` replaces it,
while the recording runs, with one that writes the same list: the field names found once, and a
shape or stride of plain integers written as that walk writes it (its type, `length_N`, then each
integer's type and value). Anything else, a symbolic size among them, still goes through the
walk. The keys being the same, the cache hits, misses and outputs are the same.
"""

from __future__ import annotations

import contextlib
import dataclasses
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

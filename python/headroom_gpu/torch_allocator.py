"""headroom's allocator inside PyTorch, through torch.cuda.memory.CUDAPluggableAllocator.

    from headroom_gpu import torch_allocator

    torch_allocator.use(policy="headroom")      # before the first CUDA tensor
    ...
    torch_allocator.memory_stats(0)             # PyTorch's memory_stats() keys
    torch_allocator.dump_snapshot("run.pickle") # PyTorch's format: the viewer and `headroom inspect` open it

`use` also hands PyTorch the plug-in's private-pool hooks, so that `torch.cuda.graph`,
`torch.cuda.MemPool` with `torch.cuda.use_mem_pool` and `torch.compile(mode="reduce-overhead")`
allocate from a pool of their own, kept until its last user releases it.

The plug-in is the shared library built from crates/headroom-torch
(`cargo build --release -p headroom-torch` writes target/release/libheadroom_torch.so);
pass its path or set HEADROOM_TORCH_LIB. Its settings are environment variables read at
its first call (HEADROOM_POLICY, HEADROOM_ALLOC_CONF, HEADROOM_TORCH_BACKEND); `use`
sets the first two from its arguments. It serves from the GPU through the CUDA driver
(HEADROOM_TORCH_BACKEND=cuda, the default) or from a simulated GPU (`sim`, for tests);
where it cannot serve (no NVIDIA driver, a bad setting) `use` refuses, with the reason,
rather than hand PyTorch an allocator that cannot.
"""

from __future__ import annotations

import ctypes
import json
import os
from typing import Any

from . import HeadroomError

__all__ = ["library", "use", "memory_stats", "dump_snapshot", "record_history", "empty_cache"]

_loaded: dict[str, ctypes.CDLL] = {}


def library(path: str | None = None) -> str:
    """The plug-in's path: `path`, else $HEADROOM_TORCH_LIB."""
    found = path or os.environ.get("HEADROOM_TORCH_LIB")
    if not found:
        raise HeadroomError(
            "where is libheadroom_torch? Build it with `cargo build --release -p headroom-torch` "
            "and pass its path or set HEADROOM_TORCH_LIB"
        )
    if not os.path.isfile(found):
        raise HeadroomError(f"{found}: no such file (the headroom-torch shared library)")
    return found


def _lib(path: str | None) -> ctypes.CDLL:
    p = library(path)
    if p not in _loaded:
        lib = ctypes.CDLL(p)
        lib.headroom_ready.restype = ctypes.c_int
        lib.headroom_ready.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        lib.headroom_memory_stats_json.restype = ctypes.c_ssize_t
        lib.headroom_memory_stats_json.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
        lib.headroom_dump_snapshot.restype = ctypes.c_int
        lib.headroom_dump_snapshot.argtypes = [ctypes.c_char_p]
        lib.headroom_record_history.argtypes = [ctypes.c_size_t]
        _loaded[p] = lib
    return _loaded[p]


def use(path: str | None = None, policy: str = "headroom", alloc_conf: str | None = None) -> Any:
    """Make headroom PyTorch's CUDA allocator; returns the CUDAPluggableAllocator.

    Call it before the first CUDA allocation (PyTorch allows the swap only then).
    Raises HeadroomError, leaving PyTorch's allocator in place, when the plug-in
    cannot serve.
    """
    os.environ["HEADROOM_POLICY"] = policy
    if alloc_conf is not None:
        os.environ["HEADROOM_ALLOC_CONF"] = alloc_conf
    p = library(path)
    lib = _lib(p)
    why = ctypes.create_string_buffer(1024)
    if not lib.headroom_ready(why, len(why)):
        raise HeadroomError(f"headroom-torch cannot serve: {why.value.decode(errors='replace')}")
    import torch  # imported only here: the rest of this module works without it

    if torch.cuda.is_initialized():
        # PyTorch swaps only an allocator nothing has initialized; its own message ("Can't swap an
        # already initialized allocator") does not say what to change.
        raise HeadroomError(
            "PyTorch's CUDA state is already initialized, so it keeps its own allocator: call "
            "headroom_gpu.torch_allocator.use() before any CUDA call (torch.cuda.get_device_properties, "
            "mem_get_info, set_per_process_memory_fraction, a tensor on the GPU, or a library that "
            "makes one when imported)"
        )
    allocator = torch.cuda.memory.CUDAPluggableAllocator(p, "headroom_malloc", "headroom_free")
    _set_pool_hooks(allocator, lib)
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as e:
        raise HeadroomError(
            f"PyTorch refused the swap after the pool hooks were set ({e}); "
            f"torch.cuda.is_initialized() is {torch.cuda.is_initialized()}"
        ) from e
    return allocator


# The hooks PyTorch's CUDAPluggableAllocator calls for private pools (CUDA graphs,
# torch.cuda.MemPool, reduce-overhead compiles), by the name of their setter, and the
# library's `torch.cuda.empty_cache()`.
POOL_HOOKS = {
    "set_begin_allocate_to_pool": "headroom_begin_allocate_to_pool",
    "set_end_allocate_to_pool_fn": "headroom_end_allocate_to_pool",
    "set_release_pool": "headroom_release_pool",
    "set_reset_fn": "headroom_empty_cache",
}


def _set_pool_hooks(allocator: Any, lib: ctypes.CDLL) -> None:
    """Hands PyTorch the plug-in's private-pool hooks (PyTorch 2.3 and newer have the setters).

    Without them a graph capture would allocate from the default pools, whose blocks
    the graph's replays would then overwrite: refuse rather than serve it so.
    """
    hooks = allocator.allocator() if callable(getattr(allocator, "allocator", None)) else allocator._allocator
    missing = [name for name in POOL_HOOKS if not hasattr(hooks, name)]
    if missing:
        raise HeadroomError(
            f"this PyTorch's CUDAPluggableAllocator lacks {', '.join(missing)} (PyTorch 2.3 or newer has them): "
            "CUDA graphs and MemPools could not be served"
        )
    for setter, symbol in POOL_HOOKS.items():
        getattr(hooks, setter)(ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value)


def memory_stats(device: int = 0, path: str | None = None) -> dict[str, int]:
    """`torch.cuda.memory_stats(device)` as headroom's allocator keeps them."""
    lib = _lib(path)
    size = 1 << 16
    while True:
        buf = ctypes.create_string_buffer(size)
        n = lib.headroom_memory_stats_json(device, buf, size)
        if n < 0:
            raise HeadroomError(f"no statistics for device {device} (out of range, or the plug-in cannot serve)")
        if n < size:
            return json.loads(buf.raw[:n])
        size = n + 1


def dump_snapshot(filename: str, path: str | None = None) -> None:
    """`torch.cuda.memory._dump_snapshot(filename)` for headroom's allocator (JSON if it ends in .json)."""
    if _lib(path).headroom_dump_snapshot(os.fsencode(filename)) != 0:
        raise HeadroomError(f"could not write {filename} (the reason is on stderr)")


def record_history(max_entries: int = 100_000, path: str | None = None) -> None:
    """`torch.cuda.memory._record_memory_history(max_entries=...)`; 0 stops recording."""
    _lib(path).headroom_record_history(max_entries)


def empty_cache(path: str | None = None) -> None:
    """`torch.cuda.empty_cache()` for headroom's allocator."""
    _lib(path).headroom_empty_cache()

"""FSDP2 (`torch.distributed.fsdp.fully_shard`), one rank's step, recorded on one CPU.

As PyTorch's `FSDPMemTracker` does, the process joins a fake process group
(`torch.testing._internal.distributed.fake_pg`: every collective returns at once, moving
nothing) of `world_size` ranks as rank `rank`, so `fully_shard` shards the model as it would
on that many GPUs, and the step runs this rank's part of it:

    from headroom_gpu.fsdp import fake_process_group, shard_transformer
    from headroom_gpu.recorder import StepRecorder

    with fake_process_group(8) as mesh, StepRecorder() as rec:
        model = build_model()
        shard_transformer(model, mesh)            # or fully_shard(...) as your own code does
        opt = torch.optim.AdamW(model.parameters(), foreach=True)
        ...

What the recording holds is what FSDP2 allocates on the rank: its shard of each parameter
(dim 0 split in `world_size` chunks, the first `ceil(dim0 / world_size)` rows, padded to that
size), the optimizer state of the shard, each group's all-gather buffer (`world_size` padded
shards) and the unsharded parameters that are views of it while the group runs, freed after
its forward (`reshard_after_forward`) and all-gathered again for its backward, the unsharded
gradients, the reduce-scatter's input and its output (the sharded gradient). The collectives
move nothing, so their buffers are the ones FSDP2 allocates; NCCL's own (its communicators'
buffers, outside PyTorch's allocator) are not in it.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch


@contextlib.contextmanager
def fake_process_group(world_size: int, rank: int = 0) -> Iterator[Any]:
    """This process as rank `rank` of a fake process group of `world_size` ranks; yields a
    one-dimensional CPU device mesh over them for `fully_shard(..., mesh=mesh)`. Enter it outside
    the recorder: the mesh is built of real tensors."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"world size {world_size}, rank {rank}: the rank must be one of 0..{world_size - 1}")
    if dist.is_initialized():
        raise RuntimeError("a process group is already initialized: record FSDP in a process of its own, or call "
                           "torch.distributed.destroy_process_group() first")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield init_device_mesh("cpu", (world_size,))
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def storage_resizes(recorder: Any) -> Iterator[None]:
    """FSDP2 frees each unsharded parameter after its layer runs by resizing its storage to 0
    bytes, and makes it again by resizing it back (`free_storage` and `alloc_storage` in
    `torch.distributed.fsdp._fully_shard._fsdp_param`), which no dispatch sees: each resize is
    told to `recorder.storage_resized`. Nothing where this torch has no FSDP2."""
    try:
        from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group
    except ImportError:
        yield
        return

    def told(original: Any) -> Any:
        def resize(tensor: torch.Tensor) -> None:
            before = tensor.untyped_storage().nbytes()
            original(tensor)
            if tensor.untyped_storage().nbytes() != before:
                recorder.storage_resized(tensor)

        return resize

    patched = [(m, name, getattr(m, name)) for m, name in ((_fsdp_param, "free_storage"),
                                                         (_fsdp_param, "alloc_storage"),
                                                         (_fsdp_param_group, "alloc_storage"))]
    for m, name, original in patched:
        setattr(m, name, told(original))
    try:
        yield
    finally:
        for m, name, original in patched:
            setattr(m, name, original)


def sharded_parameters(module: torch.nn.Module) -> list:
    """The sharded parameters (DTensors) of a module `fully_shard` made an `FSDPModule`, which
    stand in for the unsharded ones between its runs and are no attribute of it while it runs;
    none for any other module."""
    get_state = getattr(module, "_get_fsdp_state", None)
    if get_state is None:
        return []
    group = get_state()._fsdp_param_group
    return [p.sharded_param for p in group.fsdp_params] if group is not None else []


def layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules transformers says are not to be split (`_no_split_modules`: a model's decoder
    layers), which Accelerate's FSDP2 auto-wrap policy shards one by one."""
    names: set[str] = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or ())
    if not names:
        raise ValueError(f"{type(model).__name__} names no _no_split_modules: shard its layers with fully_shard "
                         "yourself (headroom_gpu.fsdp's documentation shows how)")
    return [m for m in model.modules() if type(m).__name__ in names]


def shard_transformer(model: torch.nn.Module, mesh: Any, reshard_after_forward: bool = True,
                      mp_policy: Any = None) -> torch.nn.Module:
    """`fully_shard` on each of a transformers model's layers and then on the whole, as
    Accelerate's FSDP2 plugin with its transformer-based wrap does."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kwargs: dict = {"mesh": mesh, "reshard_after_forward": reshard_after_forward,
                    "mp_policy": mp_policy or MixedPrecisionPolicy()}
    for layer in layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def shard_bytes(t: torch.Tensor, world_size: int) -> int:
    """The bytes rank 0 keeps of a parameter `fully_shard` shards over `world_size` ranks (its
    chunk of dim 0, padded to it)."""
    rows = -(-t.shape[0] // world_size) if t.dim() else 1
    rest = t.numel() // t.shape[0] if t.dim() and t.shape[0] else 1
    return rows * rest * t.element_size()

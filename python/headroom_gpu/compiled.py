"""A `torch.compile`d step, recorded under fake tensors: what Inductor's partitioner saves for
the backward, exactly, and its graphs' operators run eagerly.

`StepRecorder(compile=True)` (`python -m headroom_gpu record --compile`) makes each
`torch.compile` that asks for Inductor (its default backend, and `nn.Module.compile`) compile
with `compile_fx`, Inductor's own entry point: Dynamo's graph, Inductor's decompositions and
joint-graph passes, AOTAutograd's functionalization and `min_cut_rematerialization_partition`
as Inductor calls it. Only the last stage differs: where Inductor would generate kernels from
each partitioned graph (`inner_compile`), the graph runs as it is, operator by operator, under
the recorder. So the tensors the forward keeps for the backward are the ones the compiled step
keeps on a GPU, and the recorder sees them made and freed; but an intermediate that a fused
kernel keeps in registers is allocated here as an eager operator's output, so the transient
memory inside a graph is an upper bound, and each operator is its own kernel.

Dynamo does not trace a frame while a `TorchDispatchMode` that does not
`ignore_compile_internals` is on the stack (torch/_dynamo/convert_frame.py: "non-infra torch
dispatch mode present"): it runs the frame eagerly instead. The recorder's mode says it ignores
compilation while recording compiled steps, so Dynamo compiles with the recorder's mode off and
the graphs run with it on; the recorder's hooks do nothing while Dynamo traces them.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from functools import partial
from typing import Any, Iterator

import torch


@dataclass
class Graph:
    """One forward graph the partitioner made: what it saves for the backward, beyond its
    inputs (the parameters and the batch, which exist anyway), as (name, bytes) each."""

    saved: list
    step: int = 0  # the last step that ran it

    @property
    def saved_bytes(self) -> int:
        return sum(size for _, size in self.saved)


def forward_saves(gm: torch.fx.GraphModule, user_outputs: int) -> list:
    """`(name, bytes)` of each tensor the partitioned forward `gm` keeps for the backward and
    made itself (graph inputs and their views are the parameters' and the batch's memory)."""
    inputs = set()
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if n.op == "placeholder" and isinstance(v, torch.Tensor):
            inputs.add(_storage_key(v))
    output = next(n for n in gm.graph.nodes if n.op == "output")
    seen = set()
    out = []
    for a in output.args[0][user_outputs:]:
        v = getattr(a, "meta", {}).get("val")
        if not isinstance(v, torch.Tensor):
            continue
        key = _storage_key(v)
        if key in inputs or key in seen:
            continue
        seen.add(key)
        out.append((a.name, int(v.untyped_storage().nbytes())))
    return out


def _storage_key(v: torch.Tensor) -> int:
    # The storage itself (its C++ object: a Python wrapper is made anew each time), which the
    # tracing's fake tensors share between a view and its base.
    return v.untyped_storage()._cdata


def _user_outputs(gm: torch.fx.GraphModule) -> int:
    """How many of the forward graph's outputs are the user's, from AOTAutograd's metadata."""
    from torch._guards import TracingContext

    ctx = TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
    if meta is None:
        raise RuntimeError("torch.compile: AOTAutograd's forward metadata is not at hand (TracingContext."
                           "fw_metadata), so what the forward saves cannot be told from what it returns")
    # tokens are split out before; then the mutated inputs, the outputs, their bases, and the
    # random state's offset where random operators are functionalized (ViewAndMutationMeta).
    return meta.num_forward


def _eager_inner(graphs: list, gm: torch.fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Any:
    """Inductor's `inner_compile`, replaced: the partitioned graph runs operator by operator."""
    from torch._dynamo.backends.debugging import boxed_nop

    if not kwargs.get("is_backward", False) and not kwargs.get("is_inference", False):
        graphs.append(Graph(forward_saves(gm, _user_outputs(gm))))
    # Boxed, as Inductor's compiled graphs are: the graph takes its inputs' list and clears it, so
    # each input (a saved activation, in the backward) is freed after its last use, not at the end.
    return boxed_nop(gm, example_inputs)


def backend(rec: Any) -> Any:
    """Inductor's `compile_fx`, each partitioned graph run eagerly, each forward graph's saves kept
    in `rec.compiled_graphs`; the parameters the graph takes told to `rec` each time it runs (no
    hook of the modules inside it runs)."""
    from torch._inductor.compile_fx import compile_fx

    def compile_graph(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        first = len(rec.compiled_graphs)
        run = compile_fx(gm, example_inputs, inner_compile=partial(_eager_inner, rec.compiled_graphs))
        graphs = rec.compiled_graphs[first:]
        paths = []
        for n in gm.graph.nodes:
            if n.op == "placeholder":
                arg = n.meta.get("grapharg")
                source = getattr(arg, "source", None)
                name = getattr(source, "name", "") if source is not None else ""
                paths.append(source_path(name() if callable(name) else str(name)))

        def compiled_step(*args: Any) -> Any:
            for p, path in zip(args, paths):
                if isinstance(p, torch.nn.Parameter):
                    rec.compiled_parameter(p, path)
            for g in graphs:
                g.step = rec._step
            return run(*args)

        return compiled_step

    return compile_graph


_SOURCE = re.compile(r"_modules\['([^']+)'\]")


def source_path(source: str) -> str:
    """A module's dotted path from a Dynamo source (`L['self']._modules['h']._modules['0']`)."""
    return ".".join(_SOURCE.findall(source))


@contextlib.contextmanager
def recording(rec: Any) -> Iterator[None]:
    """`torch.compile` (and so `nn.Module.compile`) with Inductor compiling through `backend`,
    and Inductor's and AOTAutograd's caches off (a cached graph skips the partition it would
    report), Dynamo's compiled code dropped on entry and on exit (code compiled outside runs
    real kernels; code compiled here runs eager operators)."""
    import torch._dynamo
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    original = torch.compile
    recording_backend = backend(rec)

    def compile(model: Any = None, *, backend: Any = "inductor", mode: Any = None, options: Any = None,
                **kwargs: Any) -> Any:
        if backend == "inductor":
            # mode and options choose among Inductor's kernels and CUDA graphs, none of which run here.
            backend, mode, options = recording_backend, None, None
        return original(model, backend=backend, mode=mode, options=options, **kwargs)

    torch._dynamo.reset()
    saved = inductor_config.fx_graph_cache, functorch_config.enable_autograd_cache
    inductor_config.fx_graph_cache = False
    functorch_config.enable_autograd_cache = False
    torch.compile = compile
    try:
        yield
    finally:
        torch.compile = original
        inductor_config.fx_graph_cache, functorch_config.enable_autograd_cache = saved
        torch._dynamo.reset()


def notes(graphs: list, breaks: int) -> list:
    """What a compiled recording assumes, for its `assumed:` lines: of `graphs` (the forward
    graphs compiled) and Dynamo's graph `breaks`."""
    if not graphs:
        return ["torch.compile: nothing was compiled (the step calls no torch.compile with Inductor, its default "
                "backend); the step recorded eagerly"]
    last = max(g.step for g in graphs)
    saved = sum(g.saved_bytes for g in graphs if g.step == last)
    out = [f"torch.compile: {len(graphs)} forward graphs, partitioned as Inductor's "
           f"min_cut_rematerialization_partition partitions them; what they save for the backward is exact "
           f"({saved} bytes made in the graphs in step {last}, beyond their inputs)",
           "torch.compile: the graphs' operators run eagerly, each intermediate a fused kernel would keep in "
           "registers allocated: the transient memory inside a graph is an upper bound; no kernels are written "
           "(they are not Inductor's), so the plan has no step time"]
    if breaks:
        out.append(f"torch.compile: {breaks} graph breaks; the code between the graphs recorded eagerly")
    return out


def graph_breaks() -> int:
    """Dynamo's graph breaks so far in this process."""
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values())

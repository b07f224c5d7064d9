"""Autograd's sums of gradients, recorded as a GPU makes them.

Where a tensor's gradient arrives along two paths (a residual, a parameter used twice, a
tied embedding, LoRA's adapter beside its base layer), the autograd engine sums the two in
the consumer's input buffer (`InputBuffer::accumulate`, torch/csrc/autograd/input_buffer.cpp):
in place into the first (`old_var.add_(var)`) where grad mode is off and nothing else holds
it or its storage, a dense tensor of no subclass; out of place otherwise. A first gradient that
is a view (what `ViewBackward0` gives for a linear layer's input of more than two dimensions,
`grad.view(input's shape)`) holds its base, which shares its storage: the engine adds out of
place, and the storage of both is freed as the sum replaces the view. While a
TorchDispatchMode is on, every tensor counts as a subclass (`isTensorSubclassLike`), so
under the recorder each sum is a new tensor a GPU does not make. The engine sums under the
node that made the second gradient, after its function has returned; the first was made
by another node and held by the buffer alone, so its storage is freed as the sum replaces
it. A node's own `add` of a temporary it made is none of these, and an `add` of the
gradient a node was given keeps that gradient alive while the node runs. The recorder
records an `add` so placed as the GPU makes it: in the first gradient's storage. (A post
hook on each node would say when its function has returned, but a node with post hooks
keeps its input gradients until they run, which moves other frees.)
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

BACKWARD = "backward"
# Tensor types that are no wrapper subclass: asked without `is_traceable_wrapper_subclass`.
PLAIN = frozenset((FakeTensor, torch.Tensor, torch.nn.Parameter))


class GradientSums:
    """The part of `StepRecorder` that records the engine's gradient sums in place (see the
    module's documentation). It reads the recorder's events, storages and phase."""

    _last_node: Any = None  # the autograd node that ran last (`_node`)
    _nodes = 0
    _summing: tuple | None = None  # a sum that may be the in-place one: (its record, the first's, storage, peak)
    _peak_before = 0  # the live peak before the last allocation

    def _node(self) -> int:
        """The autograd node running, as a count of the nodes seen to run so far in the backward."""
        node = torch._C._current_autograd_node()
        if node is not self._last_node:
            self._last_node = node
            self._nodes += 1
        return self._nodes

    def _gradient_sum(self, args: tuple, out: Any) -> None:
        """An `add` the engine may have run to sum two gradients: kept as a candidate for the
        in-place sum until the first gradient's storage is freed (`_freed`)."""
        if self._phase != BACKWARD or torch.is_grad_enabled():
            return
        first = args[0] if args else None
        if not isinstance(first, torch.Tensor) or not isinstance(out, torch.Tensor) or first.shape != out.shape \
                or first.layout != torch.strided or type(first) not in PLAIN:
            return
        from torch._prims_common import is_non_overlapping_and_dense_or_false as is_non_overlapping_and_dense

        if not is_non_overlapping_and_dense(first) or first._is_view():
            # A view's storage is also its base's, which the view holds (`_base`): never the
            # buffer's alone.
            return
        try:
            st, old = out.untyped_storage(), self._storages.get(first.untyped_storage())
        except (NotImplementedError, RuntimeError):
            return
        new = self._storages.get(st)
        if old is None or new is None or not self.events or self.events[-1] != ("alloc", new) or \
                old.node in (0, new.node):
            return
        self._summing = (new, old, st, self._peak_before)

    def _merged(self, rec: Any) -> bool:
        """Whether the free of `rec` is that of a first gradient a sum just replaced, which a GPU
        added into: then the sum is `rec`'s storage (the sum's allocation taken back, `rec`'s free
        left to the sum's)."""
        summing, self._summing = self._summing, None
        if summing is None or summing[1] is not rec or self.events[-1] != ("alloc", summing[0]):
            return False
        new, _, st, peak = summing
        self.events.pop()
        for i in range(len(self.kernel_lines) - 1, -1, -1):  # the sum's kernel: before the next event
            if self.kernel_lines[i][0] <= len(self.events):
                break
            self.kernel_lines[i] = (len(self.events), *self.kernel_lines[i][1:])
        self.live -= new.size
        self.peak = peak
        self._refs.pop(new.index, None)
        self._count = new.index  # the last index given: the ids stay those of a step without the sum
        self._storages[st] = rec
        self._refs[rec.index] = weakref.ref(st, lambda _, rec=rec: self._freed(rec))
        return True

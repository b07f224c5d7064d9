"""Each transformer layer of a recorded step marked as a profiler range `layer:STACK:N`, in its
forward and in its backward, without changing what autograd does: the marks the step recorders
(`step_programs.py`, `step_recipes.py`, `infer_programs.py`) share. A mark that held a gradient
would change which sums the engine makes in place (docs/VALIDATION.md, "The residual sum under
the layer marks"); `python/tests/test_layer_marks.py` checks that these do not."""

import re
import weakref

import torch
from torch.profiler import record_function


def layer_pattern(family):
    """A layer's module name, with its stack for T5: `model.layers.7`, `encoder.block.3` (T5's
    blocks hold sub-layers named `layer.0`, which are not layers here)."""
    if family == "t5":
        # After any prefix: peft's wrapper names the model `base_model.model`.
        return re.compile(r"(?:.*\.)?(encoder|decoder)\.block\.(\d+)")
    return re.compile(r"()(?:.*\.)?(?:layers|h|layer)\.(\d+)")


def layer_tag(name):
    """("main", 3) for the profiler range `layer:main:3`."""
    stack, n = name[6:].split(":")
    return stack, int(n)


def when_all(tensors, fn):
    """`fn()` once the gradients of all `tensors` that this backward makes are made, as
    `register_multi_grad_hook` calls it, holding no gradient and no tensor: that function's
    hooks keep the tensors' nodes, and a leaf's node (`AccumulateGrad`) keeps the leaf, which then
    outlives the loss that held it."""
    refs = [weakref.ref(t) for t in tensors]
    state = {"task": None, "left": 0}

    def hook(_):
        task = torch._C._current_graph_task_id()
        if state["task"] != task:
            live = [r() for r in refs]
            state["task"], state["left"] = task, sum(
                torch._C._will_engine_execute_node(torch.autograd.graph._get_grad_fn_or_grad_acc(t))
                for t in live if t is not None) if len(refs) > 1 else 1
        state["left"] -= 1
        if state["left"] == 0:
            fn()

    for t in tensors:
        t.register_hook(hook)


def hook_layers(model, family):
    """Each layer's forward and backward marked as a profiler range `layer:main:n`. The backward's
    range opens when the gradient of the layer's output is complete and closes when that of its
    input is, by hooks on those tensors (`when_all`) that keep no gradient: a
    module's full backward hooks (`BackwardHook`) keep the output's gradient (`grad_outputs`)
    until the input's is made, and a gradient held so is never the one the engine sums into in
    place (`InputBuffer::accumulate` wants its storage held by the buffer alone), so the residual
    sum of a pre-norm layer, in place on a GPU, would be recorded as a new tensor a layer."""
    pattern = layer_pattern(family)
    for name, m in model.named_modules():
        hit = pattern.fullmatch(name)
        if not hit:
            continue
        tag = f"{'enc' if hit.group(1) == 'encoder' else 'main'}:{hit.group(2)}"

        def enter(m, *a, tag=tag):
            m._ranges = getattr(m, "_ranges", [])
            m._ranges.append(record_function(f"layer:{tag}"))
            m._ranges[-1].__enter__()

        def leave(m, *a):
            m._ranges.pop().__exit__(None, None, None)

        def left(m, args, out, enter=enter):
            leave(m)
            if not torch.is_grad_enabled() or torch._C._current_graph_task_id() != -1:
                # No backward, or a checkpointed layer's forward run again inside the backward,
                # whose graph the backward never runs.
                return
            # The hidden state in and out, the first tensor of each: T5's blocks pass the position
            # bias on too, whose gradient is complete only once every block's backward has run.
            outs = [next((t for t in (out if isinstance(out, (tuple, list)) else (out,))
                          if isinstance(t, torch.Tensor)), None)]
            ins = [next((t for t in args if isinstance(t, torch.Tensor)), None)]
            if all(t is not None and t.requires_grad for t in outs + ins):
                # With no input that takes a gradient the range would be empty (a full backward
                # hook's too: it calls the hook as the output's gradient arrives).
                when_all(ins, lambda m=m: leave(m))
                if outs[0].grad_fn is not None:
                    # After the tensor hooks on the output, which the next layer's input is: the
                    # next layer's range closes before this one opens.
                    outs[0].grad_fn.register_prehook(lambda *_, m=m, enter=enter: enter(m))
                else:
                    when_all(outs, lambda m=m, enter=enter: enter(m))

        m.register_forward_pre_hook(enter)
        m.register_forward_hook(left)

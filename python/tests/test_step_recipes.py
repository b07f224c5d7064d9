"""The step recipes (`data/recipes/hf_steps.json`) hold no generator state: non-reentrant
activation checkpointing saves `torch.get_rng_state()` at every checkpointed layer's forward (and
`fork_rng` another at its recomputation; on CUDA `torch.cuda.get_rng_state()` too), a host tensor
on a GPU as well, which `step_recipes.py` leaves out by the call that makes it
(`rng_state_events`). Recorded, it is a fixed tensor the recipe counts as bytes per parameter of
a layer (`layer`) (docs/VALIDATION.md, "`headroom plan` against real training steps on CPU").

Two rules tell it in the recorded data, each from what a layer can hold:
- in fp32 and bf16 (no autocast) a layer holds no fixed-size tensor before its backward: no
  weight copies, and its gradients are made in the backward. A forward moment with a `layer` or
  `layer_enc` term holds something else;
- what a layer does hold of a fixed size (its gradients, AMP's copies of its weights) is whole
  parameters of at least two bytes: bytes a multiple of twice the greatest common divisor of the
  layer's parameter sizes. The generator state (5,056 bytes on a CPU) is no such multiple for the
  recording configs but Qwen2's, whose biases' 32 elements divide it (only the first rule holds
  there).

The recorder's rule itself is checked on a three-layer checkpointed step: it finds a state at
each layer's forward.

    PYTHONPATH=python /work/venv-torch/bin/python -m unittest python/tests/test_step_recipes.py
"""

import json
import math
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_recorders import ROOT, NeedsRecorders  # noqa: E402  (scripts/validate on the path too)

RECIPES = os.path.join(ROOT, "data", "recipes", "hf_steps.json")
HEADS = {"bert": "masked-lm", "t5": "seq2seq-lm"}


def layer_sizes(family):
    """{stack: (parameters of one layer, gcd of its parameters' sizes)} of the recording config,
    the layer `step_recipes.timeline` counts `layer` and `layer_enc` in (each stack's last)."""
    import torch
    import measure
    from layer_marks import layer_pattern

    cfg = measure.recording_config(family)
    with torch.device("meta"):
        model = measure.build(cfg, HEADS.get(family, "causal-lm"), "eager", torch.float32)
    in_layer = re.compile(layer_pattern(family).pattern + r"\.")
    per = {}
    for name, p in model.named_parameters():
        hit = in_layer.match(name)
        if hit:
            key = ("enc" if hit.group(1) == "encoder" else "main", int(hit.group(2)))
            per.setdefault(key, []).append(p.numel())
    last = {}
    for (stack, n), sizes in per.items():
        if stack not in last or n > last[stack][0]:
            last[stack] = (n, sizes)
    return {stack: (sum(sizes), math.gcd(*sizes)) for stack, (_, sizes) in last.items()}


def fixed_terms(recipe):
    """(where, part, unit, coefficient) of every `layer` and `layer_enc` term of a recipe."""
    for m in recipe["moments"]:
        for part, terms in m.items():
            if part == "where":
                continue
            for unit in ("layer", "layer_enc"):
                if terms.get(unit):
                    yield m["where"], part, unit, terms[unit]


def offenders(recipes, state_bytes):
    """The recipes that hold a tensor no layer's fixed bytes can be, each with its first such
    term."""
    sizes, out = {}, {}
    for key, recipe in recipes.items():
        family, _, precision = key.split("/")[:3]
        for where, part, unit, c in fixed_terms(recipe):
            if precision != "amp" and where.startswith("forward"):
                out.setdefault(key, f"{where} {part} {unit} {c}: a fixed tensor in a forward without autocast")
                break
            if key.endswith("/compiled"):
                # A compiled step's fixed tensors are read by size (a buffer may hold several
                # parameters or a table): only the first rule holds.
                continue
            if family not in sizes:
                sizes[family] = layer_sizes(family)
            params, g = sizes[family]["enc" if unit == "layer_enc" else "main"]
            if state_bytes // 2 % g == 0:
                continue
            half = c * params / 2
            # Seven significant digits: a few bytes of a million.
            if abs(half - g * round(half / g)) > 4:
                out.setdefault(key, f"{where} {part} {unit} {c}: {c * params:.0f} bytes, "
                                    f"no whole parameters of a layer (sizes' gcd {g})")
                break
    return out


class StepRecipesHoldNoGeneratorState(NeedsRecorders):
    def test_no_recipe_holds_the_generator_state_checkpointing_saves(self):
        import torch

        with open(RECIPES) as f:
            recipes = json.load(f)["recipes"]
        bad = offenders(recipes, torch.get_rng_state().nbytes)
        self.assertEqual(bad, {}, "recorded again with scripts/validate/step_recipes.py --keys '*/ckpt'")

    def test_the_rules_tell_the_state_recorded_as_a_layers_bytes(self):
        """Each rule alone finds the state where it holds: a recipe that holds it fails."""
        import torch

        state = torch.get_rng_state().nbytes
        params, _ = layer_sizes("llama")["main"]
        rng = state / params
        for precision, where in (("bf16", "forward_top"), ("amp", "backward_top")):
            recipe = {"moments": [{"where": where, "below": {"h": 2}, "above": {},
                                   "once": {"h": 4, "layer": 1.998775 + rng}}]}
            key = f"llama/causal-lm/{precision}/sdpa/ckpt"
            self.assertIn(key, offenders({key: recipe}, state), precision)
            clean = {"moments": [{"where": where, "below": {"h": 2}, "above": {},
                                  "once": {"h": 4, "layer": 1.998775 if precision == "amp" else 0}}]}
            self.assertEqual(offenders({key: clean}, state), {}, precision)

    def test_the_recorder_names_the_state_by_the_call_that_makes_it(self):
        import torch
        import transformers
        from layer_marks import hook_layers
        from step_recipes import profiled_step, rng_state_events

        torch.manual_seed(0)
        torch.set_num_threads(1)
        cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                       num_key_value_heads=2, num_hidden_layers=3, vocab_size=256)
        model = transformers.LlamaForCausalLM(cfg)
        model.train()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        hook_layers(model, "llama")
        ids = torch.randint(0, 256, (2, 16))
        prof, _, phases = profiled_step(model, model, {"input_ids": ids, "labels": ids}, "fp32")
        state = torch.get_rng_state().nbytes
        found = rng_state_events(prof)
        start, end = phases["forward"]
        made_in_forward = {t for t, n in found if start <= t <= end and n == state}
        # One saved at each checkpointed layer's forward (its allocation; its free comes later).
        self.assertEqual(len(made_in_forward), 3, sorted(found))


if __name__ == "__main__":
    unittest.main()

"""The common case, recorded: a transformers model built from its config, trained a few
steps under fake tensors, as `python -m headroom_gpu record` runs it; or a causal LM run for
inference (`mode="infer"`: forwards without gradients; `mode="generate"`: generate's prefill and
decode steps with transformers' DynamicCache).

The model is built with the head it is trained with (`qlora.head`: T5's sequence-to-sequence
LM, BERT's masked LM, a causal LM otherwise) by `from_config` (no weights are read: a
config.json, or a model directory holding one, is all it needs), its output layer its own where
the config says so (`qlora.untie`: T5 v1.1's), optionally wrapped in peft's LoRA over every
linear layer with the head's task type, or set up as QLoRA; the batch is `batch` sequences of
`seq` random token ids that are their own labels (T5's decoder reads them shifted right, as long
as the input), with no padding; the optimizer is torch.optim's, with foreach on as it is by
default on CUDA.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from .recorder import StepRecorder

# "amp": fp32 weights, gradients and optimizer state, the forward under
# torch.autocast("cuda", torch.bfloat16) (cast as CUDA's autocast casts: headroom_gpu.amp).
# "mixed" (with FSDP2): fp32 sharded weights and optimizer state, each layer all-gathered in bf16
# and its gradients reduce-scattered in fp32 (MixedPrecisionPolicy(param_dtype=torch.bfloat16,
# reduce_dtype=torch.float32), torchtitan's default).
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "amp": torch.float32,
          "mixed": torch.float32}
OPTIMIZERS = ("adamw", "sgd", "sgd-momentum", "adamw-8bit")


@dataclass
class StepSpec:
    """What to record."""

    model: str
    batch: int = 1
    seq: int = 2048
    dtype: str = "bf16"
    optimizer: str = "adamw"
    lora: int | None = None
    attention: str = "sdpa"
    checkpoint: bool = False
    compile: bool = False  # torch.compile(model) with Inductor, recorded as headroom_gpu.compiled records it
    fsdp: int | None = None  # FSDP2 over this many ranks (a fake process group), rank 0 recorded
    qlora: int | None = None  # LoRA of this rank over a 4-bit base (headroom_gpu.qlora)
    # QLoRA's checkpointing, which prepare_model_for_kbit_training turns on by default; False:
    # use_gradient_checkpointing=False.
    qlora_checkpoint: bool = True
    # QLoRA's base: bnb_4bit_quant_type ("nf4" or "fp4") and bnb_4bit_use_double_quant.
    qlora_quant_type: str = "nf4"
    qlora_double_quant: bool = True
    # --lora's and --qlora's adapters: every linear layer ("all") or the query and value
    # projections ("qv", headroom_gpu.qlora.target_modules).
    lora_targets: str = "all"
    steps: int = 3
    repeat: bool = True  # steps after the second written as the second repeated (StepRecorder.repeat_step)
    mode: str = "train"  # "train", "infer" (forwards without gradients) or "generate" (prefill, then decode)
    new_tokens: int = 0  # generate: the decode steps after the prefill
    notes: list = field(default_factory=list)


def _config(model: str):
    import transformers

    path = model
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--model {model}: no config.json there (a config.json or a model directory)")
    return transformers.AutoConfig.from_pretrained(path)


def _optimizer(name: str, params):
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-5, foreach=True)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, foreach=True)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=True)
    if name == "adamw-8bit":
        from . import qlora

        return qlora.adamw_8bit(params, lr=1e-5)
    raise ValueError(f"--optimizer {name}: expected one of {', '.join(OPTIMIZERS)}")


def _build(spec: StepSpec):
    import transformers

    from .qlora import HEADS, head, target_modules, untie

    config = _config(spec.model)
    config.use_cache = spec.mode != "train"
    model_head = head(config)
    if spec.mode != "train" and model_head != "causal-lm":
        raise ValueError(f"--infer and --generate record a causal LM's inference, and {config.model_type} is "
                         f"trained as a {model_head.replace('-', ' ')}: plan its inference with `headroom plan "
                         "--infer` (T5's and BERT's are recorded there), or record its training step")
    dtype = DTYPES[spec.dtype]
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        # `dtype` given: from_config builds in the config's own (a Hub config.json's `torch_dtype`,
        # the dtype its checkpoint was saved in) ahead of the default dtype, so a bf16 config asked
        # for fp32 would be trained in bf16.
        auto = getattr(transformers, HEADS[model_head][0])
        model = auto.from_config(config, attn_implementation=spec.attention, dtype=dtype)
    finally:
        torch.set_default_dtype(previous)
    untie(model)
    if spec.checkpoint:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if spec.lora:
        import peft

        lora = peft.LoraConfig(r=spec.lora, lora_alpha=2 * spec.lora, lora_dropout=0.0,
                               target_modules=target_modules(config, spec.lora_targets),
                               task_type=HEADS[model_head][1])
        model = peft.get_peft_model(model, lora)
    if spec.mode == "train":
        model.train()
    else:
        model.eval()
    return model, config


def record(spec: StepSpec, fake: bool = True, route_sdpa: bool = True) -> StepRecorder:
    """Records `spec`'s steps; the recorder holds the program."""
    # Imported first: a module's import-time tensors (default arguments) are not the step's.
    import transformers  # noqa: F401

    if spec.lora or spec.qlora:
        import peft  # noqa: F401
    if spec.qlora:
        from . import qlora

        qlora.check(spec)
    if spec.lora_targets != "all" and not (spec.lora or spec.qlora):
        raise ValueError(f"--lora-targets {spec.lora_targets}: the adapters of --lora or --qlora; give one of them")
    if spec.lora_targets != "all" and spec.qlora and spec.fsdp:
        raise ValueError(f"--lora-targets {spec.lora_targets} with --fsdp: fsdp_qlora's setup names its own targets "
                         "(k, q, v, up, down and gate projections), and is recorded so alone")
    if spec.fsdp and spec.optimizer == "adamw-8bit":
        raise ValueError("--optimizer adamw-8bit with --fsdp: FSDP2's parameters are DTensors, and bitsandbytes' "
                         "optimizer operators have no DTensor sharding rule, so AdamW8bit cannot step them; "
                         "leave --optimizer out (torch's AdamW, as fsdp_qlora steps)")
    if spec.compile and (spec.fsdp or spec.qlora or spec.mode == "generate"):
        flag = "--fsdp" if spec.fsdp else "--qlora" if spec.qlora else "--generate"
        raise ValueError(f"--compile with {flag}: not recorded (the compiled recording covers a model's training step "
                         "and its inference forward); leave --compile out")
    if spec.dtype == "mixed" and not spec.fsdp:
        raise ValueError("--dtype mixed is FSDP2's mixed precision: give --fsdp GPUS, or record --dtype amp (autocast) "
                         "or bf16")
    world = contextlib.nullcontext()
    if spec.fsdp:
        from .fsdp import fake_process_group

        world = fake_process_group(spec.fsdp)
    if spec.qlora:
        config = _config(spec.model)
        config.use_cache = False
        # With FSDP, fsdp_qlora's bf16 storage, which FSDP shards like the rest. On the meta
        # device: nothing to record.
        meta = qlora.build(config, spec.attention,
                           quant_storage=torch.bfloat16 if spec.fsdp else torch.uint8,
                           quant_type=spec.qlora_quant_type, double_quant=spec.qlora_double_quant,
                           compute_dtype=qlora.COMPUTE_DTYPES[spec.dtype])
    with world as mesh, StepRecorder(fake=fake, route_sdpa=route_sdpa, shape=(spec.batch, spec.seq),
                                     compile=spec.compile) as rec, \
            contextlib.ExitStack() as stack:
        if spec.qlora and spec.fsdp:
            model = qlora.prepare_sharded(meta, spec.qlora, mesh, rec)
            stack.enter_context(qlora.cuda_kernels(rec))
        elif spec.qlora:
            model = qlora.prepare(meta, spec.qlora, rec, checkpointing=spec.qlora_checkpoint,
                                  targets=spec.lora_targets)
            stack.enter_context(qlora.cuda_kernels(rec))
        else:
            model, config = _build(spec)
        if spec.fsdp and not spec.qlora:
            from .fsdp import shard_transformer

            from torch.distributed.fsdp import MixedPrecisionPolicy

            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
                if spec.dtype == "mixed" else None
            shard_transformer(model, mesh, mp_policy=policy)
        params = [p for p in model.parameters() if p.requires_grad]
        if spec.compile:
            model = torch.compile(model)
        if spec.mode != "train":
            with torch.no_grad():
                _infer(rec, spec, model, config)
            return rec
        opt = _optimizer(spec.optimizer, params)
        ids = torch.randint(0, config.vocab_size, (spec.batch, spec.seq))
        # Held as a script holds its `loss`, until the next forward's replaces it: what the graph
        # keeps after the backward (under checkpointing, the leaf `enable_input_require_grads`
        # makes of the input embeddings' output, and its gradient) lives through the optimizer
        # step and the next forward. The last one is let go after the recording.
        loss = None
        for i in range(spec.steps):
            # The first step makes the optimizer's state; the second is the steady one, which
            # every later step repeats.
            if i >= 2 and spec.repeat and rec.repeat_step():
                continue
            with rec.step():
                autocast = torch.autocast("cuda", torch.bfloat16) if spec.dtype == "amp" else contextlib.nullcontext()
                with autocast:
                    loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
    del loss
    return rec


def _infer(rec: StepRecorder, spec: StepSpec, model, config) -> None:
    """Inference, each forward one step of the recording. `infer`: `spec.steps` forwards of the
    whole batch with the config's `use_cache` (every position's logits, and the key-value cache a
    forward returns, freed with its output). `generate`: what `model.generate(max_new_tokens=N)`
    runs in greedy decoding: the prefill (the last position's logits, `logits_to_keep=1`) into a
    `DynamicCache`, then N decode steps of one token a sequence, each taking the next token from
    an fp32 copy of the last logits and appending it to the ids, the cache growing by one
    position a step."""
    ids = torch.randint(0, config.vocab_size, (spec.batch, spec.seq))
    if spec.mode == "infer":
        for i in range(spec.steps):
            if i >= 2 and spec.repeat and rec.repeat_step():
                continue
            with rec.step():
                out = model(input_ids=ids)
                del out
        return
    generate(model, config, ids, spec.new_tokens, rec.step)


def generate(model, config, ids: torch.Tensor, new_tokens: int, each_forward: Any = contextlib.nullcontext) -> None:
    """Greedy decoding as `model.generate(max_new_tokens=new_tokens)` runs it, each forward inside
    `each_forward()`: the prefill of `ids` into a `DynamicCache`, then the decode steps."""
    import transformers

    cache = transformers.DynamicCache(config=config)
    # The cache's argument, by the name this version of transformers gives it.
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    name = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
    tokens = ids
    for _ in range(1 + new_tokens):
        with each_forward():
            out = model(input_ids=tokens, **{name: cache}, use_cache=True, logits_to_keep=1)
            last = out.logits[:, -1, :].to(copy=True, dtype=torch.float32)
            del out
            tokens = last.argmax(dim=-1, keepdim=True)
            del last
            ids = torch.cat([ids, tokens], dim=-1)

"""torchtune's single-device recipes (full_finetune_single_device, lora_finetune_single_device),
recorded: the step their training loop runs, with torchtune's own modules, losses and memory
features, from one of their YAML configs.

    python -m headroom_gpu record --recipe 1B_full_single_device.yaml --model llama-3.2-1b/config.json \\
        --seq 2048 --out step.jsonl

The model is the config's torchtune builder (`torchtune.models.llama3_2.llama3_2_1b`, or its
`lora_` form with the config's LoRA arguments) at the dimensions of a transformers config.json
(no weights are read), and the step is the recipe's: the batch copied to the device, the
forward under the recipe's activation-handling context, the labels shifted with the ignore
index, the loss (torchtune's `CEWithChunkedOutputLoss` with the model's output chunked, or
cross-entropy), `backward()`, then the gradients scaled by the tokens, clipped if asked, and
the optimizer step and `zero_grad(set_to_none=True)` — or, with `optimizer_in_bwd`, one
optimizer a parameter stepped from its gradient hook (`register_optim_in_bwd_hooks`), each
gradient freed as soon as its parameter is updated.

Activation offloading runs torchtune's own `OffloadActivations` (with its streams, its stash of
five activations in the forward and of the previous node's in the backward). Its CUDA calls
are stood in for, on the one stream a CPU has, by `_OneStream`: the host copy of an offloaded
activation is held as its size (it is host memory, outside the GPU's allocator: counted in
`host_peak` and not in the recording), and the copy back is a GPU allocation of the same
size, made when the backward asks for it.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from .recorder import StepRecorder

# The YAML keys the recording reads, and those that hold nothing of the step's memory.
HONOURED = ("model", "tokenizer.max_seq_len", "batch_size", "dtype", "optimizer", "loss", "gradient_accumulation_steps",
            "optimizer_in_bwd", "clip_grad_norm", "enable_activation_checkpointing", "enable_activation_offloading",
            "compile")
NOT_MEMORY = ("output_dir", "tokenizer", "dataset", "seed", "shuffle", "checkpointer", "resume_from_checkpoint",
              "save_adapter_weights_only", "epochs", "max_steps_per_epoch", "lr_scheduler", "metric_logger",
              "log_every_n_steps", "log_peak_memory_stats", "log_level", "profiler", "device")
FAMILIES = ("llama3", "llama3_1", "llama3_2")
OPTIMIZERS = ("torch.optim.AdamW", "torch.optim.Adam", "torch.optim.SGD", "bitsandbytes.optim.AdamW8bit",
              "bitsandbytes.optim.PagedAdamW8bit")
LOSSES = ("torchtune.modules.loss.CEWithChunkedOutputLoss", "torch.nn.CrossEntropyLoss")
LORA_KEYS = ("lora_attn_modules", "apply_lora_to_mlp", "apply_lora_to_output", "lora_rank", "lora_alpha",
             "lora_dropout")


def available() -> str | None:
    """Why torchtune cannot be used here, or None."""
    try:
        import torchtune  # noqa: F401
    except ImportError as e:
        return (f"recording a torchtune recipe needs torchtune 0.6.1 and torchao 0.11 (pip install torchtune==0.6.1 "
                f"torchao==0.11.0; where peft is installed too, put torchao 0.11 apart, docs/RECORDING.md says how): {e}")
    return None


def shipped(name: str) -> str:
    """A config torchtune's package ships (`llama3_2/1B_full_single_device.yaml`), which `tune cp`
    copies."""
    import torchtune

    return os.path.join(os.path.dirname(os.path.dirname(torchtune.__file__)), "recipes", "configs", name)


@dataclass
class Recipe:
    """What a torchtune YAML config says of the step."""

    path: str
    family: str
    lora: dict | None
    batch: int
    seq: int | None
    dtype: str
    optimizer: str
    optimizer_args: dict
    loss: str
    chunks: int
    accumulation: int
    optimizer_in_bwd: bool
    clip_grad_norm: float | None
    checkpointing: bool
    offloading: bool
    compile: bool = False
    notes: list = field(default_factory=list)


def read(path: str) -> Recipe:
    """Reads a torchtune YAML config; refuses, naming the key and the fix, what is not recorded."""
    from omegaconf import OmegaConf

    if not os.path.isfile(path):
        raise FileNotFoundError(f"--recipe {path}: no such file (a torchtune YAML config, such as "
                                "llama3_2/1B_lora_single_device.yaml from `tune cp`)")
    cfg = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    unknown = [k for k in cfg if k.split(".")[0] not in HONOURED + NOT_MEMORY]
    if unknown:
        raise ValueError(f"--recipe {path}: {', '.join(sorted(unknown))}: not a key of torchtune's single-device "
                         f"recipes that the recording reads (it reads {', '.join(HONOURED)}); a distributed "
                         "recipe's config is not recorded by --recipe")
    model = cfg.get("model") or {}
    component = str(model.get("_component_", ""))
    parts = component.split(".")
    builder = parts[-1]
    family = parts[2] if len(parts) == 4 and parts[:2] == ["torchtune", "models"] else ""
    if family not in FAMILIES or not builder.removeprefix("lora_").startswith(family):
        raise ValueError(f"model._component_ {component or '(none)'}: only torchtune's Llama 3 builders "
                         f"(torchtune.models.{{{', '.join(FAMILIES)}}}.*, and their lora_ forms) are built from a "
                         "config.json; record another model's step with the Python API (docs/RECORDING.md)")
    lora = None
    if builder.startswith("lora_"):
        for key in ("use_dora", "quantize_base"):
            if model.get(key):
                raise ValueError(f"model.{key}: True is not recorded by --recipe (DoRA and QLoRA's NF4 base are "
                                 "torchao tensors); record LoRA, or QLoRA with --qlora")
        lora = {k: model[k] for k in LORA_KEYS if k in model}
        if "lora_attn_modules" not in lora or "lora_rank" not in lora or "lora_alpha" not in lora:
            raise ValueError(f"model: {component} needs lora_attn_modules, lora_rank and lora_alpha")
    extra = [k for k in model if k != "_component_" and k not in LORA_KEYS + ("use_dora", "quantize_base")]
    if extra:
        raise ValueError(f"model.{extra[0]}: the model's dimensions come from --model's config.json; leave "
                         f"{', '.join('model.' + k for k in extra)} out of the recipe")
    dtype = str(cfg.get("dtype", "fp32"))
    if dtype not in ("bf16", "fp32"):
        raise ValueError(f"dtype: {dtype}: torchtune's recipes train in bf16 or fp32")
    opt = dict(cfg.get("optimizer") or {})
    optimizer = str(opt.pop("_component_", ""))
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer._component_ {optimizer or '(none)'}: expected one of {', '.join(OPTIMIZERS)}")
    loss = dict(cfg.get("loss") or {})
    loss_name = str(loss.pop("_component_", ""))
    if loss_name not in LOSSES:
        raise ValueError(f"loss._component_ {loss_name or '(none)'}: expected one of {', '.join(LOSSES)}")
    in_bwd = bool(cfg.get("optimizer_in_bwd", False))
    accumulation = int(cfg.get("gradient_accumulation_steps", 1) or 1)
    clip = cfg.get("clip_grad_norm")
    if in_bwd and lora:
        raise ValueError("optimizer_in_bwd: torchtune's LoRA recipe has no optimizer in the backward; set it False")
    if in_bwd and (accumulation > 1 or clip is not None):
        # The recipe's own check (full_finetune_single_device.py).
        raise ValueError("optimizer_in_bwd: True needs gradient_accumulation_steps: 1 and clip_grad_norm: null, "
                         "as torchtune's recipe says")
    notes = []
    if optimizer == "bitsandbytes.optim.PagedAdamW8bit":
        notes.append("PagedAdamW8bit recorded as AdamW8bit: its paged state (CUDA unified memory) is counted on the "
                     "GPU, the most it can take")
    tokenizer = cfg.get("tokenizer") or {}
    return Recipe(path=path, family=family, lora=lora, batch=int(cfg.get("batch_size", 1)),
                  seq=tokenizer.get("max_seq_len"), dtype=dtype, optimizer=optimizer, optimizer_args=opt,
                  loss=loss_name, chunks=int(loss.get("num_output_chunks", 8)),
                  accumulation=accumulation, optimizer_in_bwd=in_bwd,
                  clip_grad_norm=None if clip is None else float(clip),
                  checkpointing=bool(cfg.get("enable_activation_checkpointing", False)),
                  offloading=bool(cfg.get("enable_activation_offloading", False)),
                  compile=bool(cfg.get("compile", False)), notes=notes)


def model_args(config_path: str, family: str) -> dict:
    """A torchtune Llama 3 builder's arguments from a transformers config.json."""
    import json

    path = os.path.join(config_path, "config.json") if os.path.isdir(config_path) else config_path
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--model {config_path}: no config.json there (a config.json or a model directory)")
    with open(path, encoding="utf-8") as f:
        c = json.load(f)
    if c.get("model_type") != "llama":
        raise ValueError(f"--model {config_path}: model_type {c.get('model_type')!r}: torchtune's Llama 3 builders "
                         "take a Llama config (model_type llama)")
    heads = c["num_attention_heads"]
    if c.get("head_dim", c["hidden_size"] // heads) != c["hidden_size"] // heads:
        raise ValueError(f"--model {config_path}: head_dim {c['head_dim']} is not hidden_size / num_attention_heads, "
                         "which torchtune's Llama builders assume")
    args = dict(vocab_size=c["vocab_size"], num_layers=c["num_hidden_layers"], num_heads=heads,
                num_kv_heads=c.get("num_key_value_heads", heads), embed_dim=c["hidden_size"],
                max_seq_len=c.get("max_position_embeddings", 8192), intermediate_dim=c["intermediate_size"],
                norm_eps=c.get("rms_norm_eps", 1e-5), rope_base=int(c.get("rope_theta", 500000)))
    scaling = c.get("rope_scaling") or {}
    if family != "llama3" and scaling.get("factor"):
        args["scale_factor"] = int(scaling["factor"])
    if family == "llama3_2":
        args["tie_word_embeddings"] = bool(c.get("tie_word_embeddings", True))
    elif c.get("tie_word_embeddings"):
        raise ValueError(f"--model {config_path}: tied embeddings: torchtune's {family} builder has none "
                         "(llama3_2's does)")
    return args


class _Event:
    def synchronize(self) -> None:
        pass


class _Stream:
    """A CUDA stream on a machine of one stream: program order is the only order."""

    def wait_event(self, _event: Any) -> None:
        pass

    def wait_stream(self, _stream: Any) -> None:
        pass

    def record_event(self) -> _Event:
        return _Event()


class _HostCopy:
    """The host side of an offloaded activation: its size, in host memory outside the GPU's
    allocator (pinned, as torchtune asks), and not its values."""

    def __init__(self, like: torch.Tensor, ledger: "_OneStream"):
        self.shape, self.dtype, self.device = tuple(like.shape), like.dtype, like.device
        # torch.empty_like's layout: the same strides for a dense tensor, else contiguous.
        from torch._prims_common import is_non_overlapping_and_dense_or_false as dense_layout

        dense = dense_layout(like)
        self.stride = tuple(like.stride()) if dense else None
        self.nbytes = like.numel() * like.element_size()
        ledger.host_alloc(self.nbytes)
        weakref.finalize(self, ledger.host_free, self.nbytes)

    def copy_(self, _src: torch.Tensor, non_blocking: bool = False) -> "_HostCopy":
        return self

    def to(self, _device: Any, non_blocking: bool = False) -> torch.Tensor:
        # The copy back to the GPU: a new allocation of the activation's size on its device.
        if self.stride is None:
            return torch.empty(self.shape, dtype=self.dtype, device=self.device)
        return torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device=self.device)


class _OneStream:
    """`torch` as torchtune's `OffloadActivations` sees it, on a machine of one stream: its
    streams and events do nothing (program order is the order), `torch.cuda.stream(s)` is no
    context, and `torch.empty_like(x, device="cpu")` is the host copy (`_HostCopy`)."""

    def __init__(self):
        self.host_live = 0
        self.host_peak = 0
        self.cuda = self._Cuda()

    class _Cuda:
        def default_stream(self) -> _Stream:
            return _Stream()

        def Stream(self) -> _Stream:  # noqa: N802 - torch.cuda's name
            return _Stream()

        def stream(self, _stream: Any) -> contextlib.AbstractContextManager:
            return contextlib.nullcontext()

    def empty_like(self, like: torch.Tensor, **_kwargs: Any) -> _HostCopy:
        return _HostCopy(like, self)

    def host_alloc(self, nbytes: int) -> None:
        self.host_live += nbytes
        self.host_peak = max(self.host_peak, self.host_live)

    def host_free(self, nbytes: int) -> None:
        self.host_live -= nbytes

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


@contextlib.contextmanager
def one_stream_offloading() -> Any:
    """torchtune's `OffloadActivations` runs on this machine, inside: yields the host ledger."""
    from torchtune.training import _activation_offloading as offloading

    shim = _OneStream()
    original = offloading.torch
    offloading.torch = shim
    try:
        yield shim
    finally:
        offloading.torch = original


def _optimizer(recipe: Recipe, params: list) -> torch.optim.Optimizer:
    kwargs = dict(recipe.optimizer_args)
    if recipe.optimizer.startswith("bitsandbytes."):
        from . import qlora

        reason = qlora.available()
        if reason:
            raise ValueError(f"optimizer._component_ {recipe.optimizer}: {reason}")
        import bitsandbytes as bnb

        return bnb.optim.AdamW8bit(params, **kwargs)
    cls = {"torch.optim.AdamW": torch.optim.AdamW, "torch.optim.Adam": torch.optim.Adam,
           "torch.optim.SGD": torch.optim.SGD}[recipe.optimizer]
    if not kwargs.get("fused"):
        kwargs.setdefault("foreach", True)  # what torch.optim picks for CUDA tensors
    return cls(params, **kwargs)


def _build(recipe: Recipe, model: str) -> torch.nn.Module:
    import importlib

    from torchtune import training

    builders = importlib.import_module(f"torchtune.models.{recipe.family}._component_builders")
    args = model_args(model, recipe.family)
    dtype = torch.bfloat16 if recipe.dtype == "bf16" else torch.float32
    with training.set_default_dtype(dtype):
        if recipe.lora:
            lora = dict(recipe.lora)
            attn = list(lora.pop("lora_attn_modules"))
            return getattr(builders, f"lora_{recipe.family}")(attn, **lora, **args)
        return getattr(builders, recipe.family)(**args)


@contextlib.contextmanager
def sized_rope_scaling(fake: bool) -> Any:
    """Llama 3.1's RoPE scaling reads each frequency's value in Python, which a fake tensor does
    not have: under fake tensors its output is made at its size (the table's bytes are the same;
    only values are skipped)."""
    from torchtune.models.llama3_1._position_embeddings import Llama3ScaledRoPE

    original = Llama3ScaledRoPE.apply_scaling
    if fake:
        Llama3ScaledRoPE.apply_scaling = lambda self, freqs, *args, **kwargs: torch.empty_like(freqs)
    try:
        yield
    finally:
        Llama3ScaledRoPE.apply_scaling = original


@dataclass
class Recorded:
    """A recipe's recording, with the host memory offloading used."""

    rec: StepRecorder
    host_peak: int
    batch: int
    seq: int


class RecipeStep:
    """The recipe set up as torchtune's recipe sets it up (the model, LoRA's trainable adapters,
    activation checkpointing, the activation-handling context, the loss and the model's output
    chunks, the optimizer or one a parameter in the backward); `run()` is one optimizer step of
    its training loop. Build it inside `one_stream_offloading()` (and a recorder, to record it).
    `tag`: the recorder's, to name the logits and the gradients an optimizer in the backward
    frees before the recorder's own hook sees them."""

    def __init__(self, recipe: Recipe, model: str, batch: int, seq: int, tag: Any = None):
        from torchtune import modules, training
        from torchtune.modules.loss import CEWithChunkedOutputLoss
        from torchtune.modules.peft import get_adapter_params, set_trainable_params

        self.recipe, self.batch, self.seq, self.tag = recipe, batch, seq, tag or (lambda *_: None)
        self.ignore = -100
        net = self.net = _build(recipe, model)
        if recipe.lora:
            set_trainable_params(net, get_adapter_params(net))
        if recipe.compile:
            # Each layer's, as the recipe compiles them (StepRecorder(compile=True) records them).
            training.compile_model(net, verbose=False)
        if recipe.checkpointing:
            training.set_activation_checkpointing(net, auto_wrap_policy={modules.TransformerSelfAttentionLayer})
        self.handling = training.get_act_offloading_ctx_manager(net, recipe.offloading)
        if recipe.loss.endswith("CEWithChunkedOutputLoss"):
            self.loss_fn = CEWithChunkedOutputLoss(num_output_chunks=recipe.chunks, ignore_index=self.ignore)
        else:
            self.loss_fn = torch.nn.CrossEntropyLoss(ignore_index=self.ignore)
        if recipe.compile:
            self.loss_fn = training.compile_loss(self.loss_fn, verbose=False)
        if recipe.loss.endswith("CEWithChunkedOutputLoss"):
            net.set_num_output_chunks(self.loss_fn.num_output_chunks)
        self.optimizers: list = []
        self.opt = None
        if recipe.optimizer_in_bwd:
            for p in net.parameters():
                # Ahead of torchtune's hook, which steps the parameter and frees its gradient.
                p.register_post_accumulate_grad_hook(lambda q: self.tag(q.grad, "gradients"))
            optim_dict = {p: _optimizer(recipe, [p]) for p in net.parameters()}
            training.register_optim_in_bwd_hooks(model=net, optim_dict=optim_dict)
            self.optimizers = list(optim_dict.values())
        else:
            self.opt = _optimizer(recipe, list(net.parameters()))
            self.opt.zero_grad()
            self.optimizers = [self.opt]
        self.ignore_labels_cache = torch.full((batch, 1), self.ignore)
        self.vocab = net.tok_embeddings.num_embeddings

    def alive(self) -> list:
        """The tensors a step starts with: weights, buffers, optimizer state (with bitsandbytes'
        quantization maps, which each optimizer keeps apart from its state), the label cache."""
        out = list(self.net.parameters()) + list(self.net.buffers()) + [self.ignore_labels_cache]
        for opt in self.optimizers:
            out += [v for state in opt.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
            out += [v for v in getattr(opt, "name2qmap", {}).values() if isinstance(v, torch.Tensor)]
        return out

    def run(self) -> None:
        """One optimizer step of the recipe's training loop."""
        from torchtune import training

        recipe, net, ignore = self.recipe, self.net, self.ignore
        running_loss, num_tokens = 0, 0
        for _ in range(recipe.accumulation):
            # The batch the dataloader gives, copied to the device (utils.batch_to_device).
            tokens = torch.randint(0, self.vocab, (self.batch, self.seq))
            labels = tokens.clone()
            current = (labels != ignore).sum()
            num_tokens += current
            with self.handling:
                logits = net(tokens)
            for chunk in logits if isinstance(logits, list) else [logits]:
                self.tag(chunk, "logits")
            labels = torch.hstack((labels[..., 1:], self.ignore_labels_cache[: labels.shape[0]]))
            if not isinstance(logits, list):
                labels = labels.reshape(-1)
                logits = logits.reshape(-1, logits.size(-1))
            loss = self.loss_fn(logits, labels)
            del logits, labels
            current_loss = loss * current
            del loss
            running_loss += current_loss
            current_loss.backward()
            del current_loss
        if self.opt is not None:
            training.scale_grads(net, 1 / num_tokens)
            if recipe.clip_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(net.parameters(), max_norm=recipe.clip_grad_norm)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        running_loss.item()  # the loss logged


def record(recipe: Recipe, model: str, batch: int | None = None, seq: int | None = None, steps: int = 3,
           repeat: bool = True, fake: bool = True, route_sdpa: bool = True) -> Recorded:
    """Records `steps` optimizer steps of `recipe` (each of `gradient_accumulation_steps`
    micro-batches) on the model of `model`'s config.json, as torchtune's recipe runs them."""
    reason = available()
    if reason:
        raise ValueError(reason)
    batch = batch or recipe.batch
    seq = seq or recipe.seq
    if not seq:
        raise ValueError(f"--recipe {recipe.path}: tokenizer.max_seq_len is null: give --seq, the tokens a sequence")
    with one_stream_offloading() as host, sized_rope_scaling(fake), \
            StepRecorder(fake=fake, route_sdpa=route_sdpa, shape=(batch, seq), compile=recipe.compile) as rec:
        step = RecipeStep(recipe, model, batch, seq, tag=rec.tag)
        for i in range(steps):
            if i >= 2 and repeat and rec.repeat_step():
                continue
            with rec.step():
                step.run()
        del step
    for note in recipe.notes:
        if note not in rec.assumptions:
            rec.assumptions.append(note)
    return Recorded(rec=rec, host_peak=host.host_peak, batch=batch, seq=seq)


def main(parser: Any, args: Any) -> int:
    """`python -m headroom_gpu record --recipe YAML`: the flags the YAML does not say, refused by name."""
    import sys
    import time

    given = [flag for flag, on in (("--lora", args.lora), ("--qlora", args.qlora), ("--checkpoint", args.checkpoint),
                                   ("--fsdp", args.fsdp), ("--infer", args.infer), ("--generate", args.generate),
                                   ("--dtype", args.dtype != "bf16"), ("--optimizer", args.optimizer != "adamw"),
                                   ("--attention", args.attention != "sdpa")) if on]
    if given:
        parser.error(f"{given[0]} with --recipe: the recipe's YAML says it (model, dtype, optimizer, "
                     "enable_activation_checkpointing); change it there")
    try:
        recipe = read(args.recipe)
        start = time.perf_counter()
        out = record(recipe, args.model, args.batch, args.seq, args.steps, repeat=not args.record_every_step)
    except (FileNotFoundError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rec = out.rec
    rec.write(args.out, args.kernels)
    seconds = time.perf_counter() - start
    allocs = sum(1 for op, _ in rec.events if op == "alloc")
    print(f"recorded {args.steps} steps of {args.recipe} ({recipe.family}{' LoRA' if recipe.lora else ''}, "
          f"{out.batch} x {out.seq}) on {args.model}: {allocs} allocations, live peak {rec.peak} bytes, "
          f"in {seconds:.1f} s; wrote {args.out}")
    features = [name for name, on in (("chunked cross-entropy", recipe.loss.endswith("CEWithChunkedOutputLoss")),
                                      ("optimizer in backward", recipe.optimizer_in_bwd),
                                      ("activation checkpointing", recipe.checkpointing),
                                      ("activation offloading", recipe.offloading),
                                      ("torch.compile", recipe.compile)) if on]
    print(f"recipe: {', '.join(features) or 'no memory feature'}; {recipe.optimizer}; {recipe.dtype}; "
          f"{recipe.accumulation} micro-batch{'es' if recipe.accumulation > 1 else ''} a step")
    if recipe.offloading:
        print(f"host memory of activation offloading (pinned, outside the recording): peak {out.host_peak} bytes")
    if rec.sdpa_kernels:
        kernels = ", ".join(f"{k} {n}" for k, n in sorted(rec.sdpa_kernels.items()))
        print(f"scaled dot-product attention as an sm90 GPU runs it: {kernels} calls")
    for a in rec.assumptions:
        print(f"assumed: {a}")
    return 0

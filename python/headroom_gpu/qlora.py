"""QLoRA recorded: LoRA over a 4-bit base (peft + bitsandbytes), as its users set it up.

bitsandbytes quantizes a weight when it moves to the GPU (`Params4bit._quantize`), and its
CUDA kernels run only on a GPU. The recording uses bitsandbytes' own modules and its own
quantization code, on fake CPU tensors: `bitsandbytes.functional.quantize_4bit` calls the
`bitsandbytes::quantize_4bit` operator, whose fake implementation (registered by bitsandbytes)
allocates what the CUDA kernel does, so each layer stores what bitsandbytes stores, by its rules:

- the packed weight: `ceil(out * in / 2)` bytes of uint8 (two NF4 values a byte);
- the absmax of each block of 64 weights: with double quantization
  (`bnb_4bit_use_double_quant`, `compress_statistics=True`) quantized again by
  `quantize_blockwise(absmax - offset, blocksize=256)`: one uint8 a block, an fp32 absmax of
  each 256 of them, the 256-entry fp32 dynamic map, and the fp32 offset (the mean); without it,
  one fp32 a block;
- the 16-entry fp32 NF4 code (`get_4bit_type`), one a layer.

The forward is `bnb.matmul_4bit` (`MatMul4Bit`), which calls `bitsandbytes::gemm_4bit`. Its fake
implementation allocates the output alone, but a GPU does more: bitsandbytes' CUDA kernel, for
more than 1536 rows (a training step's batch × sequence) or an inner size not a multiple of the
block, dequantizes the absmax into fp32 (`dequantize_blockwise` into a buffer, then `+ offset`),
the weight into a temporary of the compute dtype, and runs `F.linear` (`_dequant_linear_fallback`
in `bitsandbytes/backends/cuda/ops.py`). `cuda_kernels()` runs that decomposition in place of the
operator, so the recording holds those temporaries. The backward is `MatMul4Bit.backward`:
`dequantize_4bit` (whose fake allocates the compute-dtype weight as the CUDA kernel does) and a
matmul, recorded as it is.

With FSDP (`prepare_sharded`), as Answer.AI's fsdp_qlora sets it up: the packed weight stored as
bf16 (`bnb_4bit_quant_storage=torch.bfloat16`: `ceil(out * in / 2)` bytes as a `(bytes / 2, 1)`
bf16 tensor), which `fully_shard` shards on dim 0 like any parameter; the `QuantState` is the
module's attribute, no parameter, so every rank keeps it whole. Each layer's forward all-gathers
its packed weights with its adapters and norms, then bitsandbytes dequantizes as above.

bitsandbytes' `AdamW8bit` (`adamw_8bit`), which QLoRA recipes pair with it, runs as it is too:
its state by its own `init_state`, its update by an operator whose fake implementation, like its
CUDA kernel, allocates nothing.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# bitsandbytes' CUDA `gemm_4bit` dequantizes and runs F.linear past this many rows
# (`_gemm_4bit_custom_max_m` in bitsandbytes/backends/cuda/ops.py, 0.50).
CUSTOM_KERNEL_MAX_ROWS = 1536
QUANT_BLOCKSIZE = 64  # Params4bit's default blocksize
NESTED_BLOCKSIZE = 256  # quantize_4bit's blocksize for the absmax under double quantization


def available() -> str | None:
    """None where bitsandbytes can be imported; else why not, and the fix."""
    try:
        import bitsandbytes  # noqa: F401
    except ImportError as e:
        return f"QLoRA needs bitsandbytes (pip install bitsandbytes==0.50.2): {e}"
    return None


def stored_bytes(out_features: int, in_features: int, double_quant: bool = True,
                 blocksize: int = QUANT_BLOCKSIZE) -> dict[str, int]:
    """What bitsandbytes stores for one 4-bit linear layer, by the rules of `quantize_4bit`
    (functional.py) and its operator's fake implementation (_ops.py): a name for each tensor,
    and its bytes."""
    n = out_features * in_features
    blocks = -(n // -blocksize)
    out = {"weight": (n + 1) // 2, "code": 16 * 4}
    if double_quant:
        out.update({"absmax": blocks, "absmax2": -(blocks // -NESTED_BLOCKSIZE) * 4, "code2": 256 * 4, "offset": 4})
    else:
        out["absmax"] = blocks * 4
    return out


class cuda_kernels(TorchDispatchMode):
    """bitsandbytes' `gemm_4bit` as its CUDA kernel runs it for a training step's rows: the
    absmax and the weight dequantized into temporaries, then `F.linear`. Enter it inside the
    recorder, so that the recorder sees the operators it runs instead."""

    def __init__(self, recorder: Any = None):
        super().__init__()
        self.assume = getattr(recorder, "_assume", None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.bitsandbytes.gemm_4bit.default:
            return self._gemm_4bit(*args, **kwargs)
        return func(*args, **kwargs)

    def _gemm_4bit(self, A, B, shapeB, absmax, blocksize, quant_type, bias=None, absmax_8bit=None,
                   absmax_code=None, absmax_offset=None):
        rows = A.numel() // A.shape[-1]
        if self.assume is not None and rows <= CUSTOM_KERNEL_MAX_ROWS:
            self.assume(f"bitsandbytes gemm_4bit: {rows} rows recorded as its dequantize-then-matmul path (a GPU "
                        f"runs its fused kernel up to {CUSTOM_KERNEL_MAX_ROWS} rows where its heuristic says so, "
                        "without the compute-dtype weight)")
        # _dequant_linear_fallback, bitsandbytes/backends/cuda/ops.py
        if absmax_8bit is not None:
            absmax_dq = torch.ops.bitsandbytes.dequantize_blockwise.default(
                absmax_8bit, absmax, absmax_code, NESTED_BLOCKSIZE, torch.float32)
            absmax = absmax_dq + absmax_offset
            del absmax_dq
        weight = torch.ops.bitsandbytes.dequantize_4bit.default(B, absmax, blocksize, quant_type, shapeB, A.dtype)
        del absmax
        return torch.nn.functional.linear(A, weight, bias)


def state_tensors(state: Any) -> list[torch.Tensor]:
    """The tensors a bitsandbytes `QuantState` holds (its nested state's too)."""
    out = [getattr(state, k, None) for k in ("absmax", "code", "offset")]
    nested = getattr(state, "state2", None)
    if nested is not None:
        out += state_tensors(nested)
    return [t for t in out if isinstance(t, torch.Tensor)]


def replace_linear(model: torch.nn.Module, compute_dtype: torch.dtype = torch.bfloat16, double_quant: bool = True,
                   quant_type: str = "nf4", quant_storage: torch.dtype = torch.uint8) -> Any:
    """Replaces the linear layers of a transformers model built on the meta device by
    bitsandbytes' `Linear4bit`, as transformers' loader does for `BitsAndBytesConfig(load_in_4bit=
    True, ...)` (`replace_with_bnb_linear`, the output layer left as it is:
    `get_keys_to_not_convert`, and the modules the model keeps in fp32, made fp32). Run it outside the recorder: nothing is allocated. Returns the
    `BitsAndBytesConfig`. `quant_storage=torch.bfloat16` is FSDP's: the packed bytes stored as a
    bf16 tensor of half as many elements, which FSDP shards as it shards the rest."""
    import transformers
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear
    from transformers.quantizers.base import get_keys_to_not_convert

    config = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quant_type,
                                             bnb_4bit_use_double_quant=double_quant,
                                             bnb_4bit_compute_dtype=compute_dtype, bnb_4bit_quant_storage=quant_storage)
    # transformers' bitsandbytes quantizer leaves the output layer and the modules the model keeps
    # in fp32 (`get_modules_to_not_convert`), and loads the latter in fp32.
    keep = list(getattr(model, "_keep_in_fp32_modules", None) or [])
    replace_with_bnb_linear(model, modules_to_not_convert=get_keys_to_not_convert(model) + keep,
                            quantization_config=config)
    if keep:
        from transformers.quantizers.quantizers_utils import should_convert_module

        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and not should_convert_module(name, keep):
                module.to(torch.float32)
    model.is_loaded_in_4bit = True  # what peft's prepare_model_for_kbit_training asks
    return config


def dynamic_map(device: Any = "cpu", recorder: Any = None) -> None:
    """quantize_blockwise keeps its 8-bit dynamic map in a global, made on the CPU and moved to the
    device on first use (the 1 KiB a GPU keeps): made afresh in each recording, whose fake
    tensors it belongs to."""
    import bitsandbytes.functional as bnbf

    bnbf.name2qmap["dynamic"] = torch.empty(256, dtype=torch.float32, device=device)
    if recorder is not None:
        recorder.tag(bnbf.name2qmap["dynamic"], "weights", "bitsandbytes")


def load(model: torch.nn.Module, device: Any = "cpu", recorder: Any = None,
         part: torch.nn.Module | None = None, scope: Any = None) -> torch.nn.Module:
    """Materializes a model built on the meta device (`replace_linear`'s) on `device`, as
    transformers' loader does: each parameter in its dtype, and each `Linear4bit`'s weight
    arriving in its compute dtype and quantized by bitsandbytes' `quantize_4bit`, one layer at a
    time (the full-precision weight freed once quantized). The 4-bit weight is a parameter of
    the packed bytes carrying its `quant_state`, as bitsandbytes' `Params4bit` does (a fake tensor
    cannot be wrapped in `Params4bit`). With a `recorder`, the quantization state is tagged as
    the layer's weights (the recorder tags parameters alone). `part`, a module of `model`: that
    module's meta tensors alone (FSDP loads and shards one layer at a time); without it, every
    meta tensor, and bitsandbytes' dynamic map where a layer is double-quantized. `scope(name)`, where given, is a context entered
    around each module's loading (the step programs mark each layer's range so)."""
    import contextlib

    import bitsandbytes as bnb

    # Only double quantization's `quantize_blockwise` uses the map: without it no GPU holds one. (A
    # layer FSDP has sharded holds a DTensor, fsdp_qlora's double-quantized weight.)
    if part is None and any(isinstance(m, bnb.nn.Linear4bit) and getattr(m.weight, "compress_statistics", True)
                            for m in model.modules()):
        dynamic_map(device, recorder)
    within = None if part is None else set(map(id, part.modules()))
    root = type(model).__name__
    # A meta tensor two modules share (a tied output layer's weight is the embedding's) is made
    # once and shared, as transformers' loader ties them again after loading.
    made: dict[int, torch.Tensor] = {}
    for name, module in list(model.named_modules()):
        if within is not None and id(module) not in within:
            continue
        with scope(name) if scope is not None else contextlib.nullcontext():
            _load_module(module, name, root, device, recorder, made)
    return model


def _load_module(module: torch.nn.Module, name: str, root: str, device: Any, recorder: Any,
                 made: dict[int, torch.Tensor]) -> None:
    """One module's own parameters and buffers materialized, its 4-bit weight quantized; `made`,
    each meta tensor already materialized (by its id), shared where modules share it."""
    import bitsandbytes as bnb
    import bitsandbytes.functional as bnbf

    if isinstance(module, bnb.nn.Linear4bit) and module.weight.is_meta:
        meta = module.weight
        full = torch.empty(meta.shape, dtype=module.compute_dtype, device=device)
        packed, state = bnbf.quantize_4bit(full, blocksize=meta.blocksize,
                                           compress_statistics=meta.compress_statistics,
                                           quant_type=meta.quant_type, quant_storage=meta.quant_storage)
        del full
        weight = torch.nn.Parameter(packed, requires_grad=False)
        for key in ("blocksize", "compress_statistics", "quant_type", "quant_storage"):
            setattr(weight, key, getattr(meta, key))
        weight.quant_state, weight.bnb_quantized, weight.module = state, True, module
        module.weight, module.quant_state = weight, state
        if recorder is not None:
            for t in state_tensors(state):
                recorder.tag(t, "weights", f"{root}.{name}" if name else root)
    for kind in (module._parameters, module._buffers):
        for key, t in kind.items():
            if t is not None and t.is_meta:
                if id(t) not in made:
                    new = torch.empty(t.shape, dtype=t.dtype, device=device)
                    made[id(t)] = torch.nn.Parameter(new, requires_grad=t.requires_grad) \
                        if kind is module._parameters else new
                kind[key] = made[id(t)]


# The transformers class of each head QLoRA records, and peft's task type for it: a causal LM's
# and a masked LM's adapters wrapped in a plain `PeftModel` (peft has no task type for a masked
# LM), a sequence-to-sequence LM's as one (`SEQ_2_SEQ_LM`: its decoder's inputs and generate).
HEADS = {"causal-lm": ("AutoModelForCausalLM", None), "masked-lm": ("AutoModelForMaskedLM", None),
         "seq2seq-lm": ("AutoModelForSeq2SeqLM", "SEQ_2_SEQ_LM")}


def head(config: Any) -> str:
    """The head a model of `config` is trained with: the one its `architectures` names, else a
    sequence-to-sequence LM for an encoder-decoder (T5), a masked LM for an encoder transformers
    builds as one (BERT), and a causal LM otherwise."""
    for arch in getattr(config, "architectures", None) or []:
        for suffix, name in (("ForCausalLM", "causal-lm"), ("ForMaskedLM", "masked-lm"),
                             ("ForConditionalGeneration", "seq2seq-lm")):
            if arch.endswith(suffix) and not (name == "seq2seq-lm" and not config.is_encoder_decoder):
                return name
    if getattr(config, "is_encoder_decoder", False):
        return "seq2seq-lm"
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    return "masked-lm" if config.model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES else "causal-lm"


QUANT_TYPES = ("nf4", "fp4")


# What each precision of `record --qlora --dtype` sets bitsandbytes' compute dtype
# (`bnb_4bit_compute_dtype`, which is also the dtype the model is loaded in) to:
# - `bf16`: QLoRA as peft's documentation sets it up, the step outside autocast;
# - `fp32`: a base computing in fp32 (`bnb_4bit_compute_dtype=torch.float32`, loaded with
#   `torch_dtype=torch.float32`): each layer's dequantized weight fp32;
# - `amp`: `Trainer(bf16=True)` over QLoRA's bf16 setup: the same model, the step under
#   `torch.autocast("cuda", torch.bfloat16)`, so that the fp32 adapters, norms' outputs and
#   attention run in bf16 where autocast casts them.
# `prepare_model_for_kbit_training` casts every parameter that is not 4-bit to fp32 whatever the
# precision, and peft keeps the adapters fp32 (`autocast_adapter_dtype`).
COMPUTE_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "amp": torch.bfloat16}


def build(config: Any, attention: str, quant_storage: torch.dtype = torch.uint8,
          model_head: str | None = None, quant_type: str = "nf4", double_quant: bool = True,
          compute_dtype: torch.dtype = torch.bfloat16, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """A transformers model of `config` with its `model_head` (`head(config)`'s where not given)
    on the meta device, its linear layers bitsandbytes' 4-bit ones (bf16 compute, NF4, double
    quantization: QLoRA's setup; `quant_type="fp4"` and `double_quant=False` set
    `bnb_4bit_quant_type` and `bnb_4bit_use_double_quant` otherwise, `compute_dtype=torch.float32`
    `bnb_4bit_compute_dtype`), as `from_pretrained(..., quantization_config=BitsAndBytesConfig(...),
    torch_dtype=compute_dtype)` builds it before loading (`dtype`, where given, that `torch_dtype`
    apart from the compute dtype: the dtype of what stays unquantized): the modules the model keeps in fp32
    (`_keep_in_fp32_modules`, T5's `wo`) stay full linear layers in fp32. Build it outside the
    recorder (nothing is allocated); `prepare` loads it inside."""
    import transformers
    from torch._guards import detect_fake_mode

    if detect_fake_mode() is not None:
        raise RuntimeError("headroom_gpu.qlora.build makes bitsandbytes' modules on the meta device, which fake tensors "
                           "cannot hold: call it before entering the StepRecorder, and qlora.prepare inside it")
    auto = getattr(transformers, HEADS[model_head or head(config)][0])
    dtype = dtype or compute_dtype
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            # `dtype` whatever the config's `torch_dtype`, as from_pretrained's torch_dtype.
            model = auto.from_config(config, attn_implementation=attention, dtype=dtype)
    finally:
        torch.set_default_dtype(previous)
    untie(model)
    if quant_type not in QUANT_TYPES:
        raise ValueError(f"bnb_4bit_quant_type {quant_type!r}: one of {', '.join(QUANT_TYPES)}")
    replace_linear(model, compute_dtype=compute_dtype, quant_storage=quant_storage, quant_type=quant_type,
                   double_quant=double_quant)
    return model


def untie(model: torch.nn.Module) -> None:
    """Gives the output layer a weight of its own where the config says it has one and
    `from_config` tied it anyway. transformers 5's `T5Config` reads a config.json's
    `tie_word_embeddings: false` (T5 v1.1's: flan-t5's, T0's, mT5's) as `scale_decoder_outputs`
    off and sets the flag itself true; T5 is built tied and untied only when a checkpoint holds
    both weights with different values, as v1.1's do. A model of such a config is made here as
    loading its checkpoint leaves it: a parameter beside the embeddings, on their device (on the
    meta device, QLoRA's `build`, one that `load` makes and `prepare_model_for_kbit_training`
    casts to fp32 like the embeddings; under the recorder's fake tensors, the full and LoRA
    steps', one the recording allocates as it allocates every weight)."""
    config = model.config
    own = getattr(config, "tie_word_embeddings", True) is False or getattr(config, "scale_decoder_outputs", True) is False
    out, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    if not own or out is None or out.weight is not embeddings.weight:
        return
    out.weight = torch.nn.Parameter(torch.empty_like(embeddings.weight), requires_grad=embeddings.weight.requires_grad)
    for name, module in model.named_modules():
        if module is out:
            getattr(model, "all_tied_weights_keys", {}).pop(f"{name}.weight", None)


# LoRA's targets: every linear layer (peft's "all-linear"), or the query and value projections.
TARGETS = ("all", "qv")
# The query and value projections of the families peft's table of defaults
# (`TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING`) lacks, named as a user's run names them:
# the MoE families' `q_proj` and `v_proj`, as their dense kin's defaults are; Phi-3's fused
# `qkv_proj`, as peft's defaults for the other fused families are their fused layer (GPT-2's
# `c_attn`, GPT-NeoX's and BLOOM's `query_key_value`): no adapter can wrap a part of one.
# Mixtral's default (`q_proj`, `v_proj`) is in the table, but peft 0.21 rewrites a Mixtral config's
# targets for transformers 5's fused experts before it fills the default in, leaving none
# (`NoMatchingPeftModuleError`). The same table as the recorded LoRA steps'
# (`scripts/validate/step_programs.py`, `QV_TARGETS`).
QV_TARGETS = {"phi3": ["qkv_proj"], "qwen2_moe": ["q_proj", "v_proj"], "qwen3_moe": ["q_proj", "v_proj"],
              "mixtral": ["q_proj", "v_proj"]}


def target_modules(config: Any, targets: str = "all") -> Any:
    """peft's `target_modules` for `targets` (`TARGETS`) of a model of `config`: "all-linear", or
    the family's query and value projections (`QV_TARGETS`; None, peft's default for the family,
    where the table lacks it)."""
    if targets not in TARGETS:
        raise ValueError(f"LoRA targets {targets!r}: one of {', '.join(TARGETS)}")
    return "all-linear" if targets == "all" else QV_TARGETS.get(config.model_type)


def prepare(model: torch.nn.Module, rank: int, recorder: Any = None, scope: Any = None,
            device: Any = "cpu", checkpointing: bool = True, targets: str = "all") -> torch.nn.Module:
    """Loads `build`'s model (quantizing it) and sets QLoRA up as peft's documentation does:
    `prepare_model_for_kbit_training` (every parameter frozen, the 16-bit ones cast to fp32,
    gradient checkpointing on, non-reentrant) and LoRA of `rank` over every linear layer
    (`target_modules="all-linear"`, alpha 2·rank, no dropout), peft's adapters in fp32, with the
    task type of the model's head (`HEADS`). `targets="qv"`: the adapters on the query and value
    projections alone (`target_modules`). `scope` and `device`: as `load`'s (`"cuda"` sets the
    same job up on a GPU, where bitsandbytes quantizes with its own kernels). `checkpointing=False`:
    `prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)`, the same casts with
    every layer's activations kept for the backward."""
    import peft

    modules = target_modules(model.config, targets)
    load(model, device=device, recorder=recorder, scope=scope)
    model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=checkpointing,
                                                 gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=modules, lora_dropout=0.0,
                           task_type=HEADS[head(model.config)][1])
    model = peft.get_peft_model(model, lora)
    model.train()
    return model


# fsdp_qlora's LoRA (train.py's defaults: `lora_target_modules="all"`, its list for Llama and
# Mistral; `lora_alpha=16`, `lora_dropout=0.1`).
FSDP_QLORA_TARGETS = ("k_proj", "q_proj", "v_proj", "up_proj", "down_proj", "gate_proj")
FSDP_QLORA_ALPHA = 16
FSDP_QLORA_DROPOUT = 0.1


def _gathered_quant_state(module: torch.nn.Module, args: Any) -> None:
    """The all-gathered weight is a plain parameter without the `quant_state` FSDP drops when it
    shards; bitsandbytes' `fix_4bit_weight_quant_state_from_module` gives it the module's again,
    wrapping it in a `Params4bit` (a view: no bytes), which a fake tensor cannot be. Given here
    before bitsandbytes looks, to the same effect."""
    if getattr(module.weight, "quant_state", None) is None:
        module.weight.quant_state = module.quant_state


def prepare_sharded(model: torch.nn.Module, rank: int, mesh: Any, recorder: Any = None) -> torch.nn.Module:
    """Answer.AI's fsdp_qlora setup of `build(..., quant_storage=torch.bfloat16)`'s model, on
    FSDP2: gradient checkpointing of each decoder layer (non-reentrant, its default), peft's
    LoRA of `rank` over fsdp_qlora's projections (alpha 16, dropout 0.1), every other
    parameter frozen and left in bf16 (fsdp_qlora runs no `prepare_model_for_kbit_training`);
    then each decoder layer loaded (its weights quantized) and sharded with `fully_shard`
    (`reshard_after_forward=True`, no mixed-precision policy: fsdp_qlora's `bf16` precision), one
    layer at a time, and the model last. FSDP2 shards each packed bf16 weight and each adapter
    on dim 0; the `QuantState` is the module's own attribute, which FSDP does not touch: every
    rank keeps all of it."""
    import bitsandbytes as bnb
    import peft
    from torch.distributed.fsdp import fully_shard

    from .fsdp import layers

    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = peft.LoraConfig(r=rank, lora_alpha=FSDP_QLORA_ALPHA, target_modules=list(FSDP_QLORA_TARGETS),
                           lora_dropout=FSDP_QLORA_DROPOUT)
    model = peft.get_peft_model(model, lora)
    dynamic_map(recorder=recorder)
    for layer in layers(model):
        load(model, recorder=recorder, part=layer)
        fully_shard(layer, mesh=mesh, reshard_after_forward=True)
    load(model, recorder=recorder)
    fully_shard(model, mesh=mesh, reshard_after_forward=True)
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            module.register_forward_pre_hook(_gathered_quant_state)
    model.train()
    return model


def check(spec: Any) -> None:
    """What `record --qlora` records, and what it does not combine with."""
    reason = available()
    if reason:
        raise ValueError(f"--qlora: {reason}")
    if spec.lora:
        raise ValueError("--qlora RANK is LoRA over a 4-bit base: give --qlora or --lora, not both")
    if spec.dtype not in COMPUTE_DTYPES:
        raise ValueError(f"--qlora with --dtype {spec.dtype}: QLoRA is recorded computing in bf16 (default), in fp32 "
                         "(--dtype fp32) or in bf16 under autocast (--dtype amp); peft keeps the rest in fp32")
    if spec.fsdp and spec.dtype != "bf16":
        raise ValueError(f"--dtype {spec.dtype} with --fsdp: fsdp_qlora's setup computes in bf16 outside autocast, "
                         "and is recorded so alone")
    if spec.fsdp and (spec.qlora_quant_type != "nf4" or not spec.qlora_double_quant):
        raise ValueError("--base-weights and --double-quant with --fsdp: fsdp_qlora's setup is NF4 with double "
                         "quantization, and is recorded so alone")


def adamw_8bit(params: Any, **kwargs: Any) -> torch.optim.Optimizer:
    """bitsandbytes' `AdamW8bit`, itself: its state is made and updated by its own code and its
    operators' fake implementations (`optimizer_update_8bit_blockwise`)."""
    reason = available()
    if reason:
        raise ValueError(f"--optimizer adamw-8bit: {reason}")
    import bitsandbytes as bnb

    return bnb.optim.AdamW8bit(params, **kwargs)


def adamw_8bit_state_bytes(numel: int, min_8bit_size: int = 4096) -> int:
    """What `AdamW8bit` keeps for a parameter of `numel` elements, by `Optimizer2State.init_state`
    (bitsandbytes/optim/optimizer.py, 0.50): two fp32 moments under `min_8bit_size` elements;
    else two uint8 moments and an fp32 absmax of each block of 256 for each (the two 256-entry
    quantization maps are shared by every parameter)."""
    if numel < min_8bit_size:
        return 2 * numel * 4
    blocks = -(numel // -256)
    return 2 * numel + 2 * blocks * 4

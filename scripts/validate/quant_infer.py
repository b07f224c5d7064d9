"""Inference over bitsandbytes' 4-bit and 8-bit linear layers for `infer_programs.py` (keys ending
`/nf4`, `/nf4-fp32-nodq` and `/int8`). 4-bit:
a model as `from_pretrained(..., quantization_config=BitsAndBytesConfig(load_in_4bit=True,
bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16),
torch_dtype=torch.bfloat16)` loads it (QLoRA's load, `/nf4`), or with `BitsAndBytesConfig(load_in_4bit=True)`'s
defaults (`/nf4-fp32-nodq`: no double quantization, so each layer keeps its fp32 absmax; fp32
compute, so `Linear4bit.forward` casts each layer's input to fp32, dequantizes its weight into an
fp32 temporary and casts the output back, its bias made fp32 in place at the first forward),
recorded under the CPU profiler as the other inference templates are, with bitsandbytes' CUDA
operators' allocations in place of its CPU ones.

bitsandbytes quantizes a weight when it moves to the GPU and its CUDA kernels run only on a GPU;
its CPU backend quantizes and multiplies otherwise (its own packing, `_convert_weight_packed_for_cpu`,
at the first forward). So the model is built and loaded as `headroom_gpu.qlora` builds and loads
it (transformers' `replace_with_bnb_linear`, each weight arriving in bf16 and quantized, the full
weight freed), and `CudaPath` answers bitsandbytes' operators with what their CUDA kernels
(`bitsandbytes/backends/cuda/ops.py`, 0.50.2) allocate, in their order:

- `quantize_4bit`: the fp32 absmax of each block of 64, then the packed weight, `ceil(n / 2)`
  uint8; `quantize_blockwise` (double quantization of that absmax, blocks of 256): its fp32
  absmax, then one uint8 an element. What qlora.py's `stored_bytes` lists.
- `gemm_4bit`, which `matmul_4bit` calls for any input when no gradient is asked (inference):
  at `CUSTOM_FLOOR_ROWS` rows or fewer (a decode step's one token a sequence, at the recorded
  batches of 2 and 3) the fused kernel, which makes its output alone; over it, the
  dequantize-then-matmul path (`_dequant_linear_fallback`): the absmax dequantized into an fp32
  buffer, that plus the offset, the weight dequantized into a temporary of the compute dtype, then
  `F.linear`, each temporary freed as the function returns. That is the path past 1536 rows; from
  5 to 1536 rows bitsandbytes asks a per-architecture heuristic (`_gemm_4bit_use_custom_cuda`),
  which for a weight of 4M elements or more picks the fused kernel up to 512 rows on most GPUs.
  Recorded so for every prompt (the higher of the two: one layer's weight in bf16 more, where the
  GPU takes the fused kernel), and stated in `ASSUMED`.

LLM.int8() (keys ending `/int8`): `Linear8bitLt` as `BitsAndBytesConfig(load_in_8bit=True)` loads
it (threshold 6.0, no fp16 weights kept): each weight arriving in bf16, copied to fp16 and quantized
by `int8_vectorwise_quant` (`Int8Params._quantize`: the int8 weight `CB` and an fp32 scale a row
`SCB`). A forward is `MatMul8bitLt`'s fast path (no gradient): the input cast to fp16 and quantized a
row at a time (`int8_vectorwise_quant`: an fp32 scale a row, the int8 input, and at the threshold
the input's `abs() >= 6.0` and its column-wise `any`), `int8_linear_matmul`'s int32 product,
`int8_mm_dequant`'s fp16 output and its cast to bf16 (`int8_mixed_scaled_mm` and `int8_scaled_mm`
are bitsandbytes' own compositions of these, run as written). The outlier columns are the data's:
the recording's weights and inputs are zeros, and have none (`ASSUMED_INT8`).

The values are zeros (no kernel runs): generate's tokens are chosen from zero logits, which
changes no tensor's size (`min_new_tokens` keeps it going).
"""

import contextlib

import torch
from torch.profiler import record_function
from torch.utils._python_dispatch import TorchDispatchMode

import qlora_programs as qp
import step_programs as sp

# The formats recorded, as a key's last part: 4-bit as QLoRA loads it (`nf4`: double
# quantization, bf16 compute) and as `BitsAndBytesConfig(load_in_4bit=True)` loads it by default
# (`nf4-fp32-nodq`: no double quantization, fp32 compute, over the same bf16 load), and LLM.int8().
# FP4 stores and runs as NF4 does (the same packed bytes, absmax and kernels; only the 16-entry
# code's values differ), so the planner plans either from these.
QUANTS = ("nf4", "int8", "nf4-fp32-nodq")
# bitsandbytes' settings of each 4-bit format: `bnb_4bit_use_double_quant`, `bnb_4bit_compute_dtype`.
FOUR_BIT = {"nf4": (True, torch.bfloat16), "nf4-fp32-nodq": (False, torch.float32)}
# bitsandbytes' `_GEMM_4BIT_CUSTOM_FLOOR_M`: at this many rows or fewer its fused kernel runs.
CUSTOM_FLOOR_ROWS = 4
ASSUMED = ("bitsandbytes gemm_4bit: a prompt's forward recorded on its dequantize-then-matmul path (a GPU's past 1536 "
           "rows; from 5 to 1536 its per-architecture heuristic chooses, and for a weight of 4M elements or more picks "
           "the fused kernel up to 512 rows, without the dequantized weight), a decode step of up to "
           f"{CUSTOM_FLOOR_ROWS} sequences on its fused kernel (no dequantized weight)")


def parts(variant):
    """A key's variant as its parts: T5's `gated`, and a quantization of `QUANTS`."""
    return [p for p in variant.split("/") if p]


def quant_of(variant):
    return next((p for p in parts(variant) if p in QUANTS), None)


class CudaPath(TorchDispatchMode):
    """bitsandbytes' operators as its CUDA kernels allocate (the module's docstring)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.bitsandbytes.quantize_4bit.default:
            return _quantize_4bit(*args, **kwargs)
        if func is torch.ops.bitsandbytes.quantize_blockwise.default:
            return _quantize_blockwise(*args, **kwargs)
        if func is torch.ops.bitsandbytes.gemm_4bit.default:
            return _gemm_4bit(*args, **kwargs)
        if func.namespace == "bitsandbytes" and func.overloadpacket.__name__ in INT8_OPS \
                and func._overloadname == "default":
            return INT8_OPS[func.overloadpacket.__name__](*args, **kwargs)
        if func.namespace == "bitsandbytes":
            raise sp.Unexplained(f"bitsandbytes' {func} has no CUDA allocations recorded here")
        return func(*args, **kwargs)


def _quantize_4bit(A, blocksize, quant_type, quant_storage):
    n = A.numel()
    absmax = torch.zeros((-(n // -blocksize),), dtype=torch.float32)
    out = torch.zeros(((n + 1) // (quant_storage.itemsize * 2), 1), dtype=quant_storage)
    return out, absmax


def _quantize_blockwise(A, code, blocksize):
    n = A.numel()
    absmax = torch.zeros((-(n // -blocksize),), dtype=torch.float32)
    out = torch.zeros(A.shape, dtype=torch.uint8)
    return out, absmax


def _gemm_4bit(A, B, shapeB, absmax, blocksize, quant_type, bias=None, absmax_8bit=None, absmax_code=None,
               absmax_offset=None):
    rows = A.numel() // A.shape[-1]
    if rows <= CUSTOM_FLOOR_ROWS:
        # _gemm_4bit_kernel_impl: the output alone.
        return torch.zeros((*A.shape[:-1], shapeB[0]), dtype=A.dtype)
    # _dequant_linear_fallback, line for line (its locals live until it returns).
    if absmax_8bit is not None:
        absmax_dq = torch.zeros(absmax_8bit.shape, dtype=torch.float32)
        absmax = absmax_dq + absmax_offset
    B_dq = torch.zeros(shapeB, dtype=A.dtype)
    return torch.nn.functional.linear(A, B_dq, bias)


# Grouped heads as 15 over 5 (`step_programs.GQA`'s ratios: no law reads two ways,
# `law_ambiguity.py`), 64 wide over qlora_programs.py's hidden size of 768: every projection's
# out x in whole blocks (960 x 768 and 320 x 768, Phi-3's fused 1,600 x 768). qlora_programs.py's
# 12 over 4 of 80 makes a key four heads wide, so half a bf16 key (rotate_half's) reads as an fp32
# head.
GQA = {"num_attention_heads": 15, "num_key_value_heads": 5, "head_dim": 64}
# Llama's, Gemma-2's and Gemma 3's configs take no hidden size that is not a multiple of the heads.
# A hidden size of 15 a and heads of d make the query's weight 225 a d elements, whole blocks of
# 16,384 where a d holds 2^14; at a = d the query is as wide as the hidden size and its laws read
# `h` for `q` (a Gemma's query is not), and a, d in a ratio of 2 or 4 (or a over d of 4/3: the
# key-value width a quarter of the hidden size) make two widths read as one at two element
# widths. 15 heads of 256 over 5 on a hidden size of 2,880 (a = 192): the query 3,840 wide, the
# key 1,280; the MLP's 1,792 = 7 x 256 (whole blocks with 2,880) no small multiple, half or twice
# of the other widths or of the vocabulary.
GQA_WIDE = {"hidden_size": 2880, "num_attention_heads": 15, "num_key_value_heads": 5, "head_dim": 256,
            "intermediate_size": 1792}
WIDE_FAMILIES = ("llama", "gemma2", "gemma3_text")
GQA_FAMILIES = tuple(f for f in sp.GQA_FAMILIES if f not in WIDE_FAMILIES)


def config(cfg, family, layers):
    """The inference recording's config at widths whose every quantized weight is whole blocks of
    bitsandbytes' (qlora_programs.py's), grouped heads 15 over 5."""
    cfg = qp.qlora_config(family, layers, cfg)
    if family in GQA_FAMILIES:
        cfg.update(GQA)
    elif family in WIDE_FAMILIES:
        cfg.update(GQA_WIDE)
    return cfg


def build(cfg, head, attn, quant="nf4"):
    """`cfg`'s model on the meta device with bitsandbytes' 4-bit layers (`qlora.build`): NF4 with
    `FOUR_BIT`'s double quantization and compute dtype for `quant`, the rest bf16."""
    import transformers

    from headroom_gpu import qlora

    if quant == "int8":
        return build_int8(cfg, head, attn)
    fields = dict(cfg)
    config_ = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
    double_quant, compute = FOUR_BIT[quant]
    return qlora.build(config_, attn, model_head=head, double_quant=double_quant, compute_dtype=compute,
                       dtype=torch.bfloat16)


def load(model, quant="nf4"):
    """`build`'s model loaded on the CPU (inside the profiler, under `CudaPath`), each layer's weight
    quantized; bitsandbytes' CPU repacking at the first forward turned off (a GPU has none)."""
    import bitsandbytes as bnb

    from headroom_gpu import qlora

    if quant == "int8":
        return load_int8(model)

    def scope(name):
        # Each layer's loading inside its range, as its forward is: what it stores is the layer's.
        tag = qp._layer_of(name)
        return record_function(tag) if tag else contextlib.nullcontext()

    qlora.load(model, device="cpu", scope=scope)
    for m in model.modules():
        if isinstance(m, bnb.nn.Linear4bit):
            m.support_avx512bf16_for_cpu = False
    # `qlora.load` leaves every tensor it makes uninitialized (a fake tensor has no values): here
    # they are real, and an index buffer (BERT's `token_type_ids`, its positions) read from leftover
    # memory stops the forward. Zeroed in place, which allocates nothing.
    with torch.no_grad():
        for t in (*model.buffers(), *(p for p in model.parameters() if getattr(p, "quant_state", None) is None)):
            t.zero_()
    return model


def param_entry(p):
    """A parameter's shape and bytes an element: a packed 4-bit weight as its layer's out x in at
    half a byte."""
    state = getattr(p, "quant_state", None)
    if state is not None:
        return list(state.shape), 0.5
    return list(p.shape), p.element_size()


def int8_state(model):
    """Each `Linear8bitLt`'s row scales (`SCB`), which its first forward moves from the weight to
    the module's `state`."""
    import bitsandbytes as bnb

    out = []
    for m in model.modules():
        if isinstance(m, bnb.nn.Linear8bitLt):
            out += [t for t in (m.state.SCB, getattr(m.weight, "SCB", None)) if isinstance(t, torch.Tensor)]
    return out


def kept_tensors(model):
    """The tensors bitsandbytes keeps beside the parameters: each layer's quantization state, and
    the 8-bit dynamic map."""
    import bitsandbytes.functional as bnbf

    from headroom_gpu.qlora import state_tensors

    out = [bnbf.name2qmap["dynamic"]] if "dynamic" in bnbf.name2qmap else []
    out += int8_state(model)
    for p in model.parameters():
        state = getattr(p, "quant_state", None)
        if state is not None:
            out += state_tensors(state)
    return out


def persistent(model):
    """`kept_tensors`' storages, by address."""
    return [t.untyped_storage().data_ptr() for t in kept_tensors(model)]


def fractions(params, dims):
    """Each quantized layer's (out x in, units, coefficient), for `fixed_law`."""
    return [(s[0] * s[1], *reversed(sp.shape_units(s, dims))) for s in
            (p["shape"] for p in params if p["bytes"] == 0.5)]


def fixed_law(n, param_shapes, fracs, d, what, widths, ops):
    return qp.fixed_law(n, param_shapes, fracs, d, what, widths, ops)


# LLM.int8() (`--quantize int8`, keys ending `/int8`): bitsandbytes' `Linear8bitLt` as
# `BitsAndBytesConfig(load_in_8bit=True)` loads it (threshold 6.0, no fp16 weights kept).
INT8_THRESHOLD = 6.0
ASSUMED_INT8 = ("bitsandbytes LLM.int8(): no input column above the 6.0 threshold (the recording's weights and "
                "inputs are zeros); a real model's few outlier columns (about 6) add each layer's input columns in the compute "
                "dtype and the weight's in fp16, a few bytes a token and a row")


def _int8_vectorwise_quant(A, threshold=0.0):
    # bitsandbytes/backends/cuda/ops.py's kernel, line for line.
    rows = A.numel() // A.shape[-1]
    row_stats = torch.zeros(rows, dtype=torch.float32)
    out_row = torch.zeros(A.shape, dtype=torch.int8)
    outlier_cols = None
    if threshold > 0.0:
        outliers = A.abs() >= threshold
        if outliers.any():
            outlier_cols = torch.argwhere(outliers.any(dim=0)).view(-1)
        else:
            outlier_cols = torch.empty(0, dtype=torch.int64)
    if rows > 1 and outlier_cols is not None:
        out_row[:, outlier_cols] = 0
    return out_row, row_stats, outlier_cols


def _int8_linear_matmul(A, B):
    return torch.zeros((*A.shape[:-1], B.shape[0]), dtype=torch.int32)


def _int8_mm_dequant(A, row_stats, col_stats, dtype=None, bias=None):
    out = torch.zeros(A.shape, dtype=torch.float16)
    if bias is not None and bias.dtype != torch.float16:
        out.add_(bias)
    return out.to(dtype or torch.float16)


def _int8_scaled_mm(A, B, row_stats, col_stats, bias=None, dtype=None):
    # backends/default/ops.py (no CUDA kernel of its own): its two CUDA operators.
    out_i32 = _int8_linear_matmul(A, B)
    return _int8_mm_dequant(out_i32, row_stats, col_stats, dtype=dtype or torch.float16, bias=bias)


def _int8_mixed_scaled_mm(A, CA, CB, SCA, SCB, outlier_cols=None, bias=None):
    # backends/default/ops.py; the outlier columns' branch is the data's (none here: ASSUMED_INT8).
    if outlier_cols is not None and outlier_cols.numel():
        raise sp.Unexplained("LLM.int8(): outlier columns in a recording of zeros")
    subA = torch.empty(0, dtype=A.dtype)
    output = _int8_scaled_mm(CA, CB, SCA, SCB, bias=bias, dtype=A.dtype)
    return output, subA


INT8_OPS = {
    "int8_vectorwise_quant": _int8_vectorwise_quant,
    "int8_linear_matmul": _int8_linear_matmul,
    "int8_mm_dequant": _int8_mm_dequant,
    "int8_scaled_mm": _int8_scaled_mm,
    "int8_mixed_scaled_mm": _int8_mixed_scaled_mm,
}


def build_int8(cfg, head, attn):
    """`cfg`'s model on the meta device with bitsandbytes' `Linear8bitLt` in place of its linear
    layers as transformers' quantizer places them (the output layer and the modules the model
    keeps in fp32 left as they are), the rest bf16."""
    import transformers
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear
    from transformers.quantizers.base import get_keys_to_not_convert

    from headroom_gpu import qlora

    fields = dict(cfg)
    config_ = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
    auto = getattr(transformers, qlora.HEADS[head][0])
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("meta"):
            model = auto.from_config(config_, attn_implementation=attn)
    finally:
        torch.set_default_dtype(previous)
    bnb_config = transformers.BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=INT8_THRESHOLD)
    keep = list(getattr(model, "_keep_in_fp32_modules", None) or [])
    replace_with_bnb_linear(model, modules_to_not_convert=get_keys_to_not_convert(model) + keep,
                            quantization_config=bnb_config)
    if keep:
        # Loaded in fp32, as `qlora.replace_linear` loads them (T5's `wo`).
        from transformers.quantizers.quantizers_utils import should_convert_module

        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and not should_convert_module(name, keep):
                module.to(torch.float32)
    return model


def load_int8(model):
    """`build_int8`'s model loaded on the CPU (inside the profiler, under `CudaPath`): each
    `Linear8bitLt`'s weight arriving in bf16 and quantized as `Int8Params._quantize` does on its
    way to the GPU (an fp16 copy, `int8_vectorwise_quant`: the int8 weight `CB` and an fp32 scale a
    row `SCB`), each layer inside its range; every other meta tensor made in its dtype, as zeros."""
    import bitsandbytes as bnb

    made = {}
    for name, module in list(model.named_modules()):
        tag = qp._layer_of(name)
        with record_function(tag) if tag else contextlib.nullcontext():
            if isinstance(module, bnb.nn.Linear8bitLt) and module.weight.is_meta:
                full = torch.empty(module.weight.shape, dtype=torch.bfloat16)
                B = full.contiguous().to(dtype=torch.float16)
                del full
                CB, SCB, _ = bnb.functional.int8_vectorwise_quant(B)
                del B
                module.weight = bnb.nn.Int8Params(CB, requires_grad=False, has_fp16_weights=False, CB=CB, SCB=SCB)
            for kind in (module._parameters, module._buffers):
                for key, t in kind.items():
                    if t is not None and t.is_meta:
                        if id(t) not in made:
                            # Zeros, so that no layer's input reaches the outlier threshold
                            # (ASSUMED_INT8): uninitialized memory would decide it.
                            new = torch.zeros(t.shape, dtype=t.dtype)
                            made[id(t)] = torch.nn.Parameter(new, requires_grad=t.requires_grad) \
                                if kind is module._parameters else new
                        kind[key] = made[id(t)]
    return model

#!/usr/bin/env python3
"""What autograd keeps of a mixture of experts' weights under peft's LoRA (docs/VALIDATION.md,
"The merged expert weights of peft's LoRA"): real tensors on the CPU, no recorder.

For Qwen3-MoE, Mixtral and Qwen2-MoE (small configs: 3 layers, 8 experts, 2 a token) at fp32
and bf16, with peft's "all-linear" LoRA (r = 8) and without adapters (full fine-tuning), one
forward runs under `torch.autograd.graph.saved_tensors_hooks`, and every storage autograd
saves for the backward is tallied: those as large as an expert stack (E x 2f x h or E x h x f)
that are no parameter's are copies of the experts' weights. With peft's wrapper of a stack
(`ParamWrapper`), each layer's `gate_up_proj` and `down_proj` are folded with their adapter
into one new tensor W + s * B @ A (`torch.baddbmm`, `_LoraFactorsProxy`) that `grouped_mm`
multiplies by and autograd saves for the input's gradient: every layer's at once until its
backward. Prints one line a job:

    /work/venv-torch/bin/python scripts/validate/moe_lora_saved.py
"""

import sys

import torch

FAMILIES = {
    "qwen3_moe": {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 96, "head_dim": 16},
    "mixtral": {"num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 96},
    "qwen2_moe": {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 96,
                  "shared_expert_intermediate_size": 160},
}
COMMON = {"hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
          "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 128}


def job(family, dtype, adapters):
    """(parameters that are expert stacks, their bytes, stacks peft wrapped, copies saved, their bytes)."""
    import peft
    import transformers

    torch.manual_seed(0)
    cfg = transformers.AutoConfig.for_model(family, **{**COMMON, **FAMILIES[family]})
    cfg._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(cfg).to(dtype)
    if adapters:
        model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, target_modules="all-linear",
                                                           task_type="CAUSAL_LM"))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    stacks = [p for n, p in model.named_parameters() if p.dim() == 3 and "experts" in n]
    sizes = {p.numel() for p in stacks}
    wrapped = sum(type(m).__name__ == "ParamWrapper" for m in model.modules())
    saved = {}

    def pack(t):
        s = t.untyped_storage()
        if t.numel() in sizes and s.data_ptr() not in params:
            saved[s.data_ptr()] = s.nbytes()
        return t

    ids = torch.randint(0, COMMON["vocab_size"], (2, 32))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return len(stacks), sum(p.nbytes for p in stacks), wrapped, len(saved), sum(saved.values())


def main():
    print("family     dtype    adapters      expert stacks (bytes)  wrapped  saved copies (bytes)")
    for family in FAMILIES:
        for dtype in (torch.float32, torch.bfloat16):
            for adapters in (True, False):
                n, nbytes, wrapped, copies, copied = job(family, dtype, adapters)
                print(f"{family:10} {str(dtype).removeprefix('torch.'):8} {'lora-all' if adapters else 'none':9} "
                      f"{n:6d} ({nbytes:9,d})  {wrapped:7d}  {copies:6d} ({copied:9,d})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m headroom_gpu record`: record a transformers model's training step, or its inference
(`--infer`, `--generate N`), without a GPU.

    python -m headroom_gpu record --model llama-3-8b/config.json --batch 1 --seq 4096 \\
        --dtype bf16 --optimizer adamw --out step.jsonl
    python -m headroom_gpu record --model llama-3-8b/config.json --batch 8 --seq 1024 --generate 128 --out gen.jsonl
    headroom plan --model llama-3-8b/config.json --gpu h100-sxm --batch 1 --seq 4096 --program step.jsonl

Exit status: 0 when the step was recorded, 2 on bad input (a missing config, torch or
transformers not installed).
"""

from __future__ import annotations

import argparse
import sys
import time


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m headroom_gpu")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser(
        "record",
        help="record a training step, or inference, under fake tensors (no GPU) as a step program for "
             "`headroom plan --program`",
        description="Builds the model from its config with transformers' from_config, with the head it is trained "
        "with (T5: sequence-to-sequence LM; BERT: masked LM; else causal LM), under fake tensors (no memory, no "
        "GPU, no weights read), runs --steps optimizer steps of --batch sequences of --seq tokens (or, with "
        "--infer or --generate, a causal LM's inference), and writes every allocation and free as "
        "the JSONL step program `headroom plan --program` replays. Scaled dot-product attention takes the kernel "
        "an sm90 GPU takes.",
    )
    r.add_argument("--model", required=True, help="a Hugging Face config.json, or a model directory holding one")
    r.add_argument("--recipe", metavar="YAML",
                   help="a torchtune single-device recipe's config (full_finetune_single_device or "
                        "lora_finetune_single_device): its step recorded as torchtune runs it, on torchtune's Llama 3 "
                        "builder at --model's dimensions (docs/RECORDING.md says which keys are read); needs torchtune")
    r.add_argument("--batch", type=int, help="sequences a step (default 1; with --recipe, its batch_size)")
    r.add_argument("--seq", type=int, help="tokens a sequence (default 2048; with --recipe, its tokenizer.max_seq_len)")
    r.add_argument("--dtype", choices=("bf16", "fp16", "fp32", "amp", "mixed"), default="bf16",
                   help="the dtype of the weights, gradients, optimizer state and activations (default bf16); amp: "
                        "fp32 weights and the forward under torch.autocast('cuda', torch.bfloat16), cast as on a GPU; "
                        "mixed (with --fsdp): fp32 shards, layers all-gathered in bf16, gradients reduced in fp32")
    r.add_argument("--optimizer", choices=("adamw", "sgd", "sgd-momentum", "adamw-8bit"), default="adamw",
                   help="torch.optim's, foreach as on CUDA (default adamw); adamw-8bit: bitsandbytes' AdamW8bit "
                        "(needs bitsandbytes)")
    r.add_argument("--lora", type=int, metavar="RANK", help="peft LoRA of this rank over every linear layer (--lora-targets qv: the query "
                                                                 "and value projections)")
    r.add_argument("--qlora", type=int, metavar="RANK",
                   help="QLoRA: peft LoRA of this rank over every linear layer (--lora-targets qv: the query and "
                        "value projections) of a 4-bit base (bitsandbytes NF4, "
                        "double quantization, bf16 compute; --dtype fp32 computes in fp32, --dtype amp in bf16 "
                        "under torch.autocast('cuda', torch.bfloat16) as Trainer(bf16=True) runs it), set up by "
                        "peft's prepare_model_for_kbit_training "
                        "(gradient checkpointing on), the model's own head (T5: sequence-to-sequence LM; BERT: "
                        "masked LM; else causal LM); with --fsdp, Answer.AI's fsdp_qlora setup (the 4-bit weights "
                        "stored as bf16 and sharded, its LoRA targets, the rest frozen in bf16); needs bitsandbytes")
    r.add_argument("--base-weights", choices=("nf4", "fp4"), default="nf4",
                   help="with --qlora: the 4-bit data type (bnb_4bit_quant_type; default nf4, QLoRA's); fp4 stores "
                        "the same bytes")
    r.add_argument("--double-quant", choices=("on", "off"), default="on",
                   help="with --qlora: bnb_4bit_use_double_quant (default on, QLoRA's: each block's absmax "
                        "quantized again to a byte); off keeps an fp32 absmax a block of 64")
    r.add_argument("--lora-targets", choices=("all", "qv"), default="all",
                   help="the layers --lora's and --qlora's adapters wrap: every linear layer (all, default) or the "
                        "query and value projections (qv: peft's default targets for the family, e.g. q_proj and "
                        "v_proj; a fused query-key-value layer as one)")
    r.add_argument("--attention", choices=("sdpa", "eager"), default="sdpa", help="transformers' attn_implementation")
    r.add_argument("--checkpoint", action="store_true", help="gradient checkpointing (transformers', non-reentrant)")
    r.add_argument("--no-checkpoint", action="store_true",
                   help="with --qlora: prepare_model_for_kbit_training(use_gradient_checkpointing=False), every "
                        "layer's activations kept for the backward")
    r.add_argument("--compile", action="store_true",
                   help="torch.compile the model (Inductor): what its forward graphs save for the backward is what "
                        "Inductor's partitioner saves, the graphs' operators run eagerly (each fused kernel's "
                        "intermediates allocated: the transient memory inside a graph is an upper bound; no kernels, "
                        "so no step time); not with --fsdp, --qlora or --generate")
    r.add_argument("--fsdp", type=int, metavar="GPUS",
                   help="FSDP2 (fully_shard on each layer and the model) over this many GPUs, rank 0's step recorded "
                        "in a fake process group; plan it with --gpus GPUS, which adds NCCL's buffers "
                        "(docs/RECORDING.md)")
    r.add_argument("--steps", type=int, default=3,
                   help="optimizer steps (default 3): the first makes the optimizer's state, the second is the steady "
                        "one, and each later step is written as the second repeated (the same operations, sizes and "
                        "order as recording it, at no cost)")
    r.add_argument("--record-every-step", action="store_true",
                   help="run every step under fake tensors instead of repeating the second (for a step that is not "
                        "the same each time)")
    r.add_argument("--infer", action="store_true",
                   help="inference: --steps forwards without gradients (eval mode, torch.no_grad, the config's "
                        "use_cache), each of --batch sequences of --seq tokens")
    r.add_argument("--generate", type=int, metavar="N",
                   help="inference as generate runs it: the prefill of --batch prompts of --seq tokens into "
                        "transformers' DynamicCache, then N decode steps of one token (greedy)")
    r.add_argument("--kernels", choices=("last", "all", "none"), default="last",
                   help="the kernels each operator runs, for the step time: of the last step (default), of every "
                        "step, or none (a smaller file, planned without a step time)")
    r.add_argument("--out", required=True, help="the step program to write (JSONL)")
    return p


def _positive(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for name in ("batch", "seq", "steps", "lora", "qlora", "fsdp", "generate"):
        v = getattr(args, name)
        if v is not None and v < 1:
            p.error(f"--{name} {v}: must be at least 1")


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    _positive(p, args)
    if args.recipe:
        from .torchtune_recipe import main as recipe_main

        return recipe_main(p, args)
    args.batch = args.batch or 1
    args.seq = args.seq or 2048
    inference = args.infer or args.generate is not None
    if inference:
        for flag, given in (("--checkpoint", args.checkpoint), ("--optimizer", args.optimizer != "adamw")):
            if given:
                p.error(f"{flag} is a training flag: leave it out with --infer or --generate")
    if args.no_checkpoint and not args.qlora:
        p.error("--no-checkpoint turns off the checkpointing --qlora's setup turns on: without --qlora, "
                "checkpointing is off unless --checkpoint is given")
    if args.no_checkpoint and args.fsdp:
        p.error("--no-checkpoint with --fsdp: fsdp_qlora's setup checkpoints every layer, and is recorded so alone")
    if args.no_checkpoint and args.checkpoint:
        p.error("--checkpoint and --no-checkpoint: choose one")
    for flag, given in (("--base-weights", args.base_weights != "nf4"), ("--double-quant", args.double_quant != "on")):
        if given and not args.qlora:
            p.error(f"{flag} sets --qlora's 4-bit base: add --qlora RANK")
    if args.infer and args.generate is not None:
        p.error("--infer and --generate: choose one (--generate N records the prefill and N decode steps)")
    try:
        from .transformers_step import StepSpec, record
    except ImportError as e:
        print(f"error: recording needs torch and transformers (pip install torch transformers): {e}", file=sys.stderr)
        return 2
    spec = StepSpec(model=args.model, batch=args.batch, seq=args.seq, dtype=args.dtype, optimizer=args.optimizer,
                    lora=args.lora, qlora=args.qlora, qlora_checkpoint=not args.no_checkpoint,
                    qlora_quant_type=args.base_weights, qlora_double_quant=args.double_quant == "on",
                    lora_targets=args.lora_targets,
                    attention=args.attention, checkpoint=args.checkpoint,
                    fsdp=args.fsdp, compile=args.compile, steps=args.steps, repeat=not args.record_every_step,
                    mode="generate" if args.generate is not None else "infer" if args.infer else "train",
                    new_tokens=args.generate or 0)
    start = time.perf_counter()
    try:
        rec = record(spec)
    except (FileNotFoundError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rec.write(args.out, args.kernels)
    seconds = time.perf_counter() - start
    allocs = sum(1 for op, _ in rec.events if op == "alloc")
    what = (f"the prefill and {spec.new_tokens} decode steps" if spec.mode == "generate"
            else f"{spec.steps} forwards" if spec.mode == "infer" else f"{spec.steps} steps")
    print(f"recorded {what} of {args.model}: {allocs} allocations, live peak {rec.peak} bytes, "
          f"in {seconds:.1f} s; wrote {args.out}")
    if rec.sdpa_kernels:
        kernels = ", ".join(f"{k} {n}" for k, n in sorted(rec.sdpa_kernels.items()))
        print(f"scaled dot-product attention as an sm90 GPU runs it: {kernels} calls")
    for a in rec.assumptions:
        print(f"assumed: {a}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What torch.compile keeps for the backward of torchtitan's Llama block and loss.

The FSDP2 program (`crates/headroom-plan/src/synth/fsdp2.rs`) plans a compiled block under
torchtitan's per-op checkpointing as keeping its input, wq's and wv's outputs, the attention
output and its log-sum-exp, and w1's output (not w2's, which no backward reads); under full
checkpointing its input; without checkpointing what the fused kernels' backwards read; and
a compiled loss as keeping the bf16 logits and two fp32 values per token. This script compiles
a small block and the loss with Inductor, records the forward graph the partitioner hands
to Inductor, and prints what it saves, per token, beside what the program plans.

Runs on CPU (the CPU flash kernel stands for the CUDA one on torchtitan's save list), or
on a GPU, where it also measures the loss's peak:

    python3 scripts/validate/compiled_saves.py [--json] [--device cuda]

Exit status 0 when what Inductor saves equals the plan, 1 when not.
"""

import argparse
import json
import sys
from collections import defaultdict
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch._inductor.compile_fx import compile_fx, compile_fx_inner
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

HIDDEN, HEADS, KV_HEADS, FFN, VOCAB = 256, 4, 2, 768, 1024
HEAD_DIM = HIDDEN // HEADS
BATCH, SEQ = 2, 80
TOKENS = BATCH * SEQ
DTYPE = torch.bfloat16

# torchtitan's `_save_list` (torchtitan 9dec370, models/llama/parallelize_llama.py), with
# the CPU flash kernel beside the CUDA ones.
SAVE_LIST = {
    torch.ops.aten.mm.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    torch.ops.aten.abs.default,
    torch.ops.aten.max.default,
}


def per_op_policy():
    """torchtitan's `_custom_policy`: save listed ops' outputs but every second mm's."""
    meta = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        key = f"{mode}_mm_count"
        if func == torch.ops.aten.mm.default:
            meta[key] += 1
        save = func in SAVE_LIST and not (func == torch.ops.aten.mm.default and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        y = x.float()
        return (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6)).type_as(x) * self.weight


def rotary(x, freqs):
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs).flatten(3).type_as(x)


class Block(nn.Module):
    """torchtitan's TransformerBlock: `h = x + attention(norm(x))`, `out = h + ffn(norm(h))`."""

    def __init__(self, mode):
        super().__init__()
        self.mode = mode
        self.attention_norm, self.ffn_norm = RMSNorm(HIDDEN), RMSNorm(HIDDEN)
        self.wq = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.wk = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.wv = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.wo = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)
        self.w1 = nn.Linear(HIDDEN, FFN, bias=False)
        self.w2 = nn.Linear(FFN, HIDDEN, bias=False)
        self.w3 = nn.Linear(HIDDEN, FFN, bias=False)
        angles = torch.outer(torch.arange(SEQ).float(), 1.0 / 10000 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
        self.register_buffer("freqs", torch.polar(torch.ones_like(angles), angles).view(1, SEQ, 1, -1))

    def attention(self, x):
        b, s, _ = x.shape
        xq = self.wq(x).view(b, s, HEADS, HEAD_DIM)
        xk = self.wk(x).view(b, s, KV_HEADS, HEAD_DIM)
        xv = self.wv(x).view(b, s, KV_HEADS, HEAD_DIM)
        xq, xk = rotary(xq, self.freqs), rotary(xk, self.freqs)
        rep = HEADS // KV_HEADS
        xk = xk.repeat_interleave(rep, dim=2)
        xv = xv.repeat_interleave(rep, dim=2)
        out = F.scaled_dot_product_attention(xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).contiguous().view(b, s, -1))

    def body(self, x):
        h = x + self.attention(self.attention_norm(x))
        y = self.ffn_norm(h)
        return h + self.w2(F.silu(self.w1(y)) * self.w3(y))

    def forward(self, x):
        if self.mode == "per-op":
            return checkpoint(self.body, x, use_reentrant=False, context_fn=per_op_policy)
        if self.mode == "full":
            return checkpoint(self.body, x, use_reentrant=False)
        return self.body(x)


def saved_by_inductor(fn, *inputs):
    """The tensors the forward graph returns for the backward: (dtype, numel, whether a graph
    input, name) each."""
    # A cached compilation would skip the partition this reads.
    torch._inductor.config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False
    saved = []

    def inner(gm, example_inputs, **kwargs):
        if not kwargs.get("is_backward", False) and not saved:
            output = next(n for n in gm.graph.nodes if n.op == "output")
            for a in output.args[0][1:]:
                v = getattr(a, "meta", {}).get("val")
                if isinstance(v, torch.Tensor):
                    saved.append((str(v.dtype).replace("torch.", ""), v.numel(), a.op == "placeholder", a.name))
        return compile_fx_inner(gm, example_inputs, **kwargs)

    compiled = torch.compile(fn, backend=partial(compile_fx, inner_compile=inner), fullgraph=True)
    out = compiled(*inputs)
    out.float().sum().backward()
    return saved


def bytes_per_token(saved):
    width = {"bfloat16": 2, "float32": 4, "int64": 8, "float16": 2, "bool": 1}
    return sum(width.get(d, 4) * n for d, n in saved) / TOKENS


def measured_loss_peaks(dev):
    """The loss's forward and backward at 2 x 8192 tokens of a 128256-entry vocabulary: the
    most allocated beyond the bf16 logits, per logit, eager and compiled. The program plans
    12 bytes (three fp32 copies at log-softmax's backward) and 2 (the bf16 gradient)."""
    tokens, vocab = 2 * 8192, 128256
    labels = torch.randint(0, vocab, (tokens,), device=dev)

    def loss_fn(pred):
        return F.cross_entropy(pred.float(), labels)

    out = {}
    for name, fn in [("eager", loss_fn), ("compiled", torch.compile(loss_fn))]:
        for _ in range(2):  # the second run: compiled, and the cache warm
            pred = torch.randn(tokens, vocab, dtype=DTYPE, device=dev, requires_grad=True)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            fn(pred).backward()
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - base
            del pred
        out[name] = peak / (tokens * vocab)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument(
        "--device",
        default="cpu",
        help="cpu, or cuda: the same partitions with CUDA's flash kernel, and the loss's measured peak "
        "at torchtitan's 2 x 8192 tokens of Llama 3's vocabulary",
    )
    a = ap.parse_args()
    torch.manual_seed(0)
    dev = torch.device(a.device)
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    # The program's compiled blocks, per token: under per-op checkpointing the input, wq's
    # and wv's outputs, the attention output, its fp32 log-sum-exp (heads a token) and w1's
    # output; under full checkpointing the input; without checkpointing the input, the two
    # norms' outputs and fp32 reciprocal roots, the rotated query, the repeated keys and
    # values, the attention output and its log-sum-exp, the residual h (or wo's output, its
    # size), w1's, w3's and their product.
    planned = {
        "per-op": 2 * (HIDDEN + q + kv + q + FFN) + 4 * HEADS,
        "full": 2 * HIDDEN,
        "none": 2 * (4 * HIDDEN + 4 * q + 3 * FFN) + 4 * HEADS + 2 * 4,
    }
    blocks = {}
    for mode in planned:
        block = Block(mode).to(device=dev, dtype=DTYPE)
        x = torch.randn(BATCH, SEQ, HIDDEN, dtype=DTYPE, device=dev, requires_grad=True)
        saved = saved_by_inductor(block, x)
        # What the block made and keeps, and its activation input: not the parameters, which
        # the graph takes as inputs too and FSDP2 holds apart.
        kept = [(d, n) for d, n, is_input, _ in saved if not is_input or n == TOKENS * HIDDEN]
        blocks[mode] = {"saved": saved, "bytes_per_token": bytes_per_token(kept), "planned": planned[mode]}
    logits = torch.randn(BATCH, SEQ, VOCAB, dtype=DTYPE, device=dev, requires_grad=True)
    labels = torch.randint(0, VOCAB, (BATCH, SEQ), device=dev)

    def loss_fn(pred):
        return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))

    loss_saved = saved_by_inductor(loss_fn, logits)
    # The logits (the graph's input) and what the fused kernel reduces per token (its maximum
    # and log-sum-exp); the labels are the step's inputs, counted apart.
    loss_got = bytes_per_token([(d, n) for d, n, _, _ in loss_saved if d != "int64"])
    loss_planned = 2 * VOCAB + 8
    out = {
        "torch": torch.__version__,
        "blocks": blocks,
        "loss_saved": loss_saved,
        "loss_bytes_per_token": loss_got,
        "loss_planned": loss_planned,
    }
    ok = all(abs(b["bytes_per_token"] - b["planned"]) < 1 for b in blocks.values())
    ok = ok and abs(loss_got - loss_planned) < 1
    if dev.type == "cuda":
        out["loss_peak_bytes_per_logit"] = measured_loss_peaks(dev)
    out["agree"] = ok
    if a.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k}: {v}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Reads recorded templates' laws again by the recorders' present per-head rule.

A law is a function of the three recorded sizes, and a tensor of a fixed number of bytes a
position pair (`tok_s`, `pos_s`) is per head or the same whatever the heads by a rule the
recorders (`step_programs.py`, `infer_programs.py`) share, `head_law` below:

- Until 2026-11-28 such a tensor was per head only above 16 bytes a pair, so the templates
  recorded with 8 heads in bf16 (16 bytes a pair) or 4 heads (8 and 16) kept an eager
  attention's scores and probabilities, and T5's position bias, the same size whatever a
  model's heads. Any whole number of at least two bytes a head is now per head.
- Until 2026-11-29 one byte a head was never per head, so SDPA's math path kept
  `_safe_softmax`'s bools (`isneginf` over the scores, `all` over their rows) the size of the
  recording's heads: 8 bytes a pair for Llama at 32 heads. What made a tensor now decides it
  with its bytes: a bool these operators make is per head at one byte a head, a mask's one
  byte a pair is not.
- Until the same day a decode step's scores and probabilities (b x heads x 1 x past: `tok`
  and `seq` at a fixed count of bytes a position) were read as bytes at 16 or fewer a
  position, as int64 ids of that many bytes are. The operators that make them (`is_scores`)
  now make them per head at two bytes a head and more.
- Until 2026-11-29 the statistics of a norm over each head (Qwen3's and Gemma 3's key and query
  norms, one fp32 element a head a token) were bytes a token at 16 or fewer: the same whatever a
  model's key-value heads. What made them (`NORM_SITES`) now reads them per query head or per
  key-value head (`norm_law`).

This applies the rule to what each template recorded, as recording it again would, and
changes no size at the recording's own widths (each template's seven-layer check is
unchanged). Where one law stood for tensors the rule now reads apart (Gemma-3's 4-byte
`isneginf` at 4 heads beside its fp32 mask, Gemma-2's decode-step scores beside an int64
mask), each tensor gets its own:

    python3 scripts/validate/per_head_laws.py data/programs/hf*.tpl [--check]

`--check` changes nothing and exits 1 where a template still holds a law to read again.
"""

import argparse
import json
import os
import sys

# Position pairs: the encoder's (s x s), the decoder's (t x t), and the cross-attention's (t x s);
# and the same with the positions attended to padded to 16 (the memory-efficient kernel's bias
# gradient: step_programs.padded_pairs).
PAIRS = ("tok_s", "pos_s", "ttok_t", "tpos_t", "ttok_s", "tpos_s", "tok_s16", "ttok_t16", "ttok_s16")

# What `_safe_softmax` (SDPA's math path: aten/src/ATen/native/transformers/attention.cpp)
# makes to find the rows a mask fills with -inf, one bool a head: `isneginf` over the scores
# (b x heads x s x s, or x past in a decode step) and `all` over each row (b x heads x s x 1).
PER_HEAD_BOOLS = ("aten::isneginf", "aten::all")

# What makes a decode step's attention scores and probabilities (b x heads x 1 x past): the
# scores' matmul (eager's `matmul > bmm`, Bloom's `baddbmm`, SDPA's math path's `bmm`) and the
# softmax (its output, `_softmax`, or the `empty_strided` under `softmax` it writes into). A
# decode step's law grows with the past (`tok`) and has the step's own position as a constant
# (`seq`), both a fixed count of bytes a position: per head there, where by bytes alone 16 bytes
# a position (bf16 over 8 heads) are as likely two int64 ids.
SCORE_OPS = ("aten::bmm", "aten::baddbmm", "aten::_softmax")
SCORE_SITES = ("aten::softmax > aten::empty_strided",)

# What an RMS norm over each head makes (Qwen3's and Gemma 3's `q_norm` and `k_norm`, in fp32
# whatever the job's precision): the mean of squares and its `rsqrt`, and in the
# backward the gradient reaching `rsqrt` and its two steps; and SDPA's CPU kernel's fp32
# logsumexp, one a head. One fp32 element a head a token: a query's norm `heads` wide, a key's
# `kv_heads`. At the recordings' 4 heads over 2 (16 and 8 bytes) or a key's 4 (16) these are a
# few bytes a token, which `per_unit` reads as bytes, the same whatever the model's heads. The
# mean plus epsilon (`aten::add`) is left as it was read: decode steps add int64 positions of
# the same few bytes a sequence. Recorded at 5 key-value heads (`step_programs.GQA`),
# each is 20 bytes or more a token, which `per_unit` reads as the unit it is.
NORM_SITES = ("aten::mean", "aten::rsqrt",
              "autograd::engine::evaluate_function: MulBackward0 > aten::sum",
              "autograd::engine::evaluate_function: RsqrtBackward0 > aten::pow",
              "autograd::engine::evaluate_function: RsqrtBackward0 > aten::mul",
              "aten::scaled_dot_product_attention > aten::empty")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import template_file  # noqa: E402


def op_of(site):
    """The operator that made a tensor, from its site (`top > leaf`, or `leaf`)."""
    return site.rsplit(" > ", 1)[-1]


def heads_of(per, heads, least):
    """`per` bytes as bytes a head, where they are a whole number of at least `least` a head."""
    if abs(per - round(per)) < 1e-9 and per % heads == 0 and per >= least * heads:
        return per / heads
    return None


def is_scores(site):
    """Whether the tensor a site made is attention's scores or probabilities (`SCORE_OPS`)."""
    return op_of(site) in SCORE_OPS or site in SCORE_SITES


def norm_law(law, heads, kv_heads, site):
    """`law` read per head where a per-head norm made it (`NORM_SITES`): a token's (or, in a
    decode step, a sequence's) few bytes that are one fp32 element a query head (`heads`) or a
    key-value head (`kv_heads`); otherwise `law` itself. A hidden state's norm (one element a
    token) stays bytes."""
    if site not in NORM_SITES:
        return law
    out = dict(law)
    for kind in ("tok", "seq"):
        units = law.get(kind)
        if not units or set(units) != {"one"}:
            continue
        n = units["one"] / 4
        if n >= 2 and n == heads:
            out[kind] = {"heads": 4.0}
        elif n >= 2 and kv_heads and n == kv_heads:
            out[kind] = {"kv_heads": 4.0}
    return out


def head_law(law, heads, op="", kv_heads=None):
    """`law` (bytes `one` as the sizes gave them) read by the rule, for a tensor made at site `op`
    (`top > leaf`, or the leaf operator alone).

    A position pair's bytes are per head where they are a whole number of at least two a head —
    an eager attention's scores and probabilities, T5's position bias (bf16 over 8 heads: 16
    bytes a pair) — and otherwise the same whatever the heads, as a mask's one byte or one
    16-bit element a pair is. A bool of `PER_HEAD_BOOLS` is per head at one byte a head, in
    every length it grows with (a decode step's `isneginf` is `b x heads x (past + 1)`), and so
    are scores and probabilities (`is_scores`) at two bytes a head: a decode step's one query
    position against the past, and its constant with it."""
    if not heads:
        return law
    law = norm_law(law, heads, kv_heads, op)
    site, op = op, op_of(op)
    least = 1 if op in PER_HEAD_BOOLS else 2
    grows = [k for k in law if k != "fixed"]
    if is_scores(site) and any(k in law for k in ("tok", "pos")):
        if any(set(law[k]) != {"one"} or heads_of(law[k]["one"], heads, 2) is None for k in law):
            return law
        return {k: {"heads": heads_of(u["one"], heads, 2)} for k, u in law.items()}
    if op in PER_HEAD_BOOLS:
        if not grows or any(set(law[k]) != {"one"} or heads_of(law[k]["one"], heads, 1) is None for k in grows):
            return law
        return {k: ({"heads": heads_of(u["one"], heads, 1)} if k != "fixed" else u) for k, u in law.items()}
    out = dict(law)
    for k in PAIRS:
        if k in law and set(law[k]) == {"one"}:
            per = heads_of(law[k]["one"], heads, least)
            if per is not None:
                out[k] = {"heads": per}
    return out


def relaw(template):
    """`template`'s tensors' laws read again in place (split where tensors sharing a law now
    read apart, the table in order of first use, as the recorders write it); how many tensors
    changed."""
    heads, kv_heads = template["dims"].get("heads"), template["dims"].get("kv_heads")
    laws, sites, rows = template["laws"], template["sites"], template["tensors"]
    new_laws = [head_law(laws[r[0]], heads, sites[r[2]], kv_heads) if r[3] == -1 and r[4] == -1 else laws[r[0]]
                for r in rows]
    changed = sum(new != laws[r[0]] for new, r in zip(new_laws, rows))
    if not changed:
        return 0
    table, index = [], {}
    for new, r in zip(new_laws, rows):
        k = json.dumps(new, sort_keys=True)
        if k not in index:
            index[k] = len(table)
            table.append(new)
        r[0] = index[k]
    template["laws"] = table
    return changed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 where a law would change")
    args = ap.parse_args()
    stale = 0
    for path in args.files:
        data = template_file.read(path)
        for key, template in sorted(data["templates"].items()):
            if "laws" not in template:
                continue  # a recording that failed, kept with its reason
            n = relaw(template)
            if n:
                stale += 1
                print(f"{os.path.basename(path)} {key}: {n} tensor(s) read again")
        if not args.check:
            template_file.write(path, data, packed=template_file.is_packed(path))
    if args.check and stale:
        sys.exit(1)


if __name__ == "__main__":
    main()

"""Whether a recording's sizes can tell a tensor's size law from another that reads the same.

A law says how a tensor's bytes follow the model's dimensions: `{"tok": {"kv": 4.0}}` is an
fp32 tensor as wide as the keys, a token's worth per token. The recorders (`step_programs.py`,
`infer_programs.py`, `qlora_programs.py`) read it from bytes alone, at one model: where two
dimensions of the recording config stand in a ratio that two element widths also stand in, one
size has two readings, and the recorder takes the first it tries. With 8 query heads over 4
key-value heads (or 4 over 2), an fp32 key (`kv` x 4 bytes a token) is as large as a bf16
query (`q` x 2): the law chosen is right at the recording's heads and wrong twice over on a
model whose heads are not twice its key-value heads (Llama 3 8B's 32 over 8).

The invariant: a law of a recorded template reads one way only. For each unit the heads' counts
tie (`q`, `kv`, `d`, `heads`, `kv_heads`) a law holds, a width a token, a position, a sequence,
or fixed, no other of them of a different size at the recording makes the same bytes as one bf16
or fp32 element a unit; and where the family's config gives a head a width of its own, none of
`q`, `kv`, `d` is as wide as another of the recording's widths (`h`, `f`, ...: `shared_widths`).
A recording that breaks it is an error, not a silent choice: `step_programs.py` and
`infer_programs.py` refuse to write a template with such a law, the three recorders one recorded
at such widths (`step_programs.dims`), and the planner's own audit
(`crates/headroom-plan/src/program_template/law_ambiguity.rs`) fails its test on a bundled one.
The way out is a recording config whose heads' ratios no element widths share: 15 query heads
over 5 key-value heads of 40 (`step_programs.GQA`), where 12 over 4 still lets half a bf16 key
(rotate_half's) read as an fp32 head (`kv` = 4 `d`), and 8 over 4 or 4 over 2 an fp32 key as a
bf16 query.

    python3 scripts/validate/law_ambiguity.py data/programs/hf*.tpl [--check] [--verbose]

prints each template recorded at shared widths or holding a law with a rival reading (with the
count of its tensors that have one); `--check` exits 1 where any does.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import template_file  # noqa: E402

# Units that the heads' counts tie together, each with those it can be mistaken for: a query
# is `heads` heads wide, a key or value `kv_heads` heads, each head `d`. Their ratios (heads
# over key-value heads, and either count) are a model's own, so a law read in the wrong one is
# wrong on every model whose counts differ from the recording's. (Other units' ratios can be
# structural: GPT-2's MLP is four times its hidden size in every GPT-2.)
TIED = {"q": ("kv", "d"), "kv": ("q", "d"), "d": ("q", "kv"), "heads": ("kv_heads",), "kv_heads": ("heads",)}
# Element widths one tensor and another can differ by where 16-bit and 32-bit tensors meet
# (AMP, LoRA's fp32 adapters over a bf16 base, fp32 norms and rotary tables): bf16, fp32.
ELEMENT_BYTES = (2, 4)
# At or below this many bytes a unit's worth, `per_unit` reads a law as bytes (`one`), not a unit.
SMALL = 16
# The model's other widths a head-tied one can share a size with at a recording.
WIDTHS = ("h", "f", "kf", "kh", "V", "P", "qkv", "fs", "r", "Er")
# Families whose config gives a head no width of its own: a query, key and value are the hidden
# size wide in every model of the family, so `h` read for `q` is right on all of them.
HEAD_WIDTH_IS_HIDDEN = ("gpt2", "bert", "bloom", "gpt_neox")


def shared_widths(d, family):
    """The head-tied widths (`q`, `kv`, `d`) the recording's dimensions `d` give the size of another
    of the model's widths: `[(tied, other)]`. A tensor that follows one reads as the other (a
    query's weight as `h*h` at a query as wide as the hidden size), right at the recording and
    wrong on a model of `family` whose heads are not the hidden size over their count (Gemma's)."""
    if family in HEAD_WIDTH_IS_HIDDEN:
        return []
    return [(u, v) for u in ("q", "kv", "d") if d.get(u) for v in WIDTHS if d.get(v) == d[u]]


def rivals(nbytes, d, unit):
    """The other readings of `nbytes` (one token's, position's or sequence's bytes, read as
    `unit`) that the recording's dimensions `d` cannot tell from it: `[{unit': bytes a unit'}]`,
    each a unit `TIED` to `unit` of another size at the recording, one element of 2 or 4 bytes
    a unit'."""
    if unit not in TIED or not d.get(unit) or nbytes <= SMALL:
        return []
    out = []
    for other in TIED[unit]:
        size = d.get(other)
        if not size or size == d[unit]:
            continue
        for w in ELEMENT_BYTES:
            if abs(nbytes - w * size) < 1e-6:
                out.append({other: float(w)})
    return out


def law_rivals(law, d):
    """Each single-unit term of `law` with a rival reading: `[(kind, {unit: bytes}, rivals)]`."""
    out = []
    for kind, units in law.items():
        if kind in ("tok_s", "pos_s", "ttok_t", "tpos_t", "ttok_s", "tpos_s", "tok_s16", "ttok_t16", "ttok_s16") \
                or len(units) != 1:
            continue
        (unit, per), = units.items()
        if "*" in unit or unit == "one":
            continue
        found = rivals(per * d.get(unit, 0), d, unit)
        if found:
            out.append((kind, {unit: per}, found))
    return out


def audit(template):
    """The tensors of a compact template (the planner's form) whose law has a rival reading,
    parameters and gradients left out (their laws come from their shapes): `[(index, site,
    kind, law, rivals)]`."""
    d = template["dims"]
    out = []
    for i, row in enumerate(template["tensors"]):
        if row[3] != -1 or row[4] != -1:
            continue
        for kind, mine, found in law_rivals(template["laws"][row[0]], d):
            out.append((i, template["sites"][row[2]], kind, mine, found))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--check", action="store_true", help="exit 1 where a template holds a law with a rival reading")
    ap.add_argument("--verbose", action="store_true", help="print each such tensor's law and its rivals")
    args = ap.parse_args()
    found = 0
    for path in args.files:
        for key, t in sorted(template_file.read(path)["templates"].items()):
            if "laws" not in t:
                continue
            shared = shared_widths(t["dims"], key.split("/")[0])
            if shared:
                found += 1
                print(f"{os.path.basename(path)} {key}: recorded where {', '.join(f'{u} = {v}' for u, v in shared)}")
            hits = audit(t)
            if not hits:
                continue
            found += 1
            d = t["dims"]
            print(f"{os.path.basename(path)} {key}: {len({h[0] for h in hits})} tensor(s) with a rival law "
                  f"(recorded at {d.get('heads')} heads over {d.get('kv_heads')})")
            if args.verbose:
                for i, site, kind, mine, others in hits:
                    print(f"    tensor {i} {site}: {kind} {mine} or {others}")
    if args.check and found:
        sys.exit(1)


if __name__ == "__main__":
    main()

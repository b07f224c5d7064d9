"""Reads recorded templates' position-pair laws again by the recorder's present rule.

Until 2026-11-28 the recorders (`step_programs.py`, `infer_programs.py`) took a tensor of a
fixed number of bytes a position pair (`tok_s`, `pos_s`) as one per head only above 16 bytes a
pair, so the templates recorded with 8 heads in bf16 (16 bytes a pair) or 4 heads (8 and 16)
kept an eager attention's scores and probabilities, and T5's position bias, the same size
whatever a model's heads. `pair_law` (below, the rule both recorders use) now takes any whole number of at least two
bytes a head as per head. A law is a function of the three recorded sizes alone, so this
applies the rule to what each template recorded, as recording it again would, and changes no
size at the recording's own widths (each template's seven-layer check is unchanged):

    python3 scripts/validate/per_head_laws.py data/programs/hf-*.tpl [--check]

`--check` changes nothing and exits 1 where a template still holds such a law.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import template_file  # noqa: E402


def pair_law(kind_s, per, heads):
    """A law of `per` bytes a position pair (`kind_s`: `tok_s` or `pos_s`): per head where `per`
    is a whole number of at least two bytes a head — an eager attention's scores and
    probabilities, T5's position bias (bf16 over 8 heads: 16 bytes a pair) — and otherwise the
    same whatever the heads, as a mask's one byte or one 16-bit element a pair is. The
    recorders' rule (`step_programs.law`, `infer_programs`), kept here apart from torch."""
    if abs(per - round(per)) < 1e-9 and per % heads == 0 and per >= 2 * heads:
        return {kind_s: {"heads": per / heads}}
    return {kind_s: {"one": per}}


def relaw(template):
    """The keys of `template`'s laws read again, in place; how many changed."""
    heads = template["dims"].get("heads")
    changed = 0
    for i, law in enumerate(template["laws"]):
        if heads and len(law) == 1:
            (kind, units), = law.items()
            if kind in ("tok_s", "pos_s") and set(units) == {"one"}:
                new = pair_law(kind, units["one"], heads)
                if new != law:
                    template["laws"][i] = new
                    changed += 1
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
            n = relaw(template)
            if n:
                stale += 1
                print(f"{os.path.basename(path)} {key}: {n} law(s) per head")
        if not args.check:
            template_file.write(path, data, packed=template_file.is_packed(path))
    if args.check and stale:
        sys.exit(1)


if __name__ == "__main__":
    main()

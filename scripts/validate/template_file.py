#!/usr/bin/env python3
"""The program template files of `data/programs/`: read, write, merge, convert.

A file holds the recorders' header (`about`, versions, shapes, ...) and `templates`, a map from
key to one recorded template. It is kept in one of two forms (docs/TRACE_FORMAT.md, "Program
templates"):

- `.tpl`, the bundled form: a binary index of the keys, then each template's JSON compressed
  on its own (zlib, level 9, keys sorted), so the planner inflates only the template it plans;
- `.json`, the recorders' text: the header, then one template a line by key.

`read` takes either (by its first bytes); `write` writes `.tpl` for a path ending in `.tpl`
and the text otherwise, unless told. Writing the same data again gives the same bytes.

    python3 scripts/validate/template_file.py cat FILE [KEY]       # the file as JSON, or one template
    python3 scripts/validate/template_file.py keys FILE
    python3 scripts/validate/template_file.py pack IN.json OUT.tpl
    python3 scripts/validate/template_file.py unpack IN.tpl OUT.json
    python3 scripts/validate/template_file.py merge OUT BASE OURS THEIRS

`merge` is a three-way merge by key (and by header field): what one side changed and the other
kept is taken from the side that changed it; a key both changed, to different templates, is a
conflict, named, and nothing is written. It is git's merge driver for these files
(`git config merge.tpl.driver "python3 scripts/validate/template_file.py merge %A %O %A %B"`;
`.gitattributes` names the driver `tpl`), and `cat` their text form for `git diff`
(`git config diff.tpl.textconv "python3 scripts/validate/template_file.py cat"`).
"""

import argparse
import glob
import json
import os
import struct
import sys
import zlib

MAGIC = b"HRTPL\n"
VERSION = 1
LEVEL = 9
# The index's fixed-size parts, little-endian: after the magic, the version and the header's
# length; after the header, the count; each entry's key length, then after its key the offset
# (from the start of the data), deflated length and inflated length.
_VERSION_HEAD = struct.Struct("<HI")
_COUNT = struct.Struct("<I")
_KEY_LEN = struct.Struct("<H")
_ENTRY = struct.Struct("<III")


class TemplateFileError(Exception):
    """A file that is not a template file, or a merge that conflicts."""


def _text(value):
    """A template's or a header's JSON as the recorders write it (compact, ASCII)."""
    return json.dumps(value, separators=(",", ":"))


def is_packed(path):
    with open(path, "rb") as f:
        return f.read(len(MAGIC)) == MAGIC


def _index(blob, path):
    """The header and `[(key, offset, length, inflated)]` of a `.tpl` file's bytes, and where
    its data begins."""
    try:
        if blob[:len(MAGIC)] != MAGIC:
            raise TemplateFileError(f"{path}: not a template file (no {MAGIC!r} at its start)")
        at = len(MAGIC)
        version, head_len = _VERSION_HEAD.unpack_from(blob, at)
        if version != VERSION:
            raise TemplateFileError(f"{path}: template file version {version}; this reads {VERSION}")
        at += _VERSION_HEAD.size
        head = json.loads(blob[at:at + head_len].decode("utf-8"))
        at += head_len
        (count,) = _COUNT.unpack_from(blob, at)
        at += _COUNT.size
        entries = []
        for _ in range(count):
            (key_len,) = _KEY_LEN.unpack_from(blob, at)
            at += _KEY_LEN.size
            key = blob[at:at + key_len].decode("utf-8")
            at += key_len
            entries.append((key, *_ENTRY.unpack_from(blob, at)))
            at += _ENTRY.size
    except (struct.error, UnicodeDecodeError, ValueError) as e:
        raise TemplateFileError(f"{path}: a truncated or malformed index ({e})") from None
    return head, entries, at


def _inflate(blob, data, key, offset, length, inflated, path):
    try:
        text = zlib.decompress(blob[data + offset:data + offset + length])
    except zlib.error as e:
        raise TemplateFileError(f"{path}: the template {key} does not inflate ({e})") from None
    if len(text) != inflated:
        raise TemplateFileError(f"{path}: the template {key} inflates to {len(text)} bytes, "
                                f"its index says {inflated}")
    return json.loads(text)


def read(path):
    """The whole file: its header's fields and `templates`, a dict by key."""
    with open(path, "rb") as f:
        blob = f.read()
    if blob[:len(MAGIC)] != MAGIC:
        try:
            data = json.loads(blob)
        except ValueError as e:
            raise TemplateFileError(f"{path}: neither a template file nor JSON ({e})") from None
        if not isinstance(data, dict) or not isinstance(data.get("templates"), dict):
            raise TemplateFileError(f"{path}: JSON without a `templates` object")
        return data
    head, entries, data = _index(blob, path)
    templates = {key: _inflate(blob, data, key, *rest, path) for key, *rest in entries}
    return {**head, "templates": templates}


def keys(path):
    """The file's keys, sorted, read from the index alone where the file is packed."""
    with open(path, "rb") as f:
        blob = f.read()
    if blob[:len(MAGIC)] == MAGIC:
        return [key for key, *_ in _index(blob, path)[1]]
    return sorted(read(path)["templates"])


def template(path, key):
    """One template, inflating only it where the file is packed; None where the file has no
    such key."""
    with open(path, "rb") as f:
        blob = f.read()
    if blob[:len(MAGIC)] != MAGIC:
        return read(path)["templates"].get(key)
    _, entries, data = _index(blob, path)
    for k, *rest in entries:
        if k == key:
            return _inflate(blob, data, k, *rest, path)
    return None


def bundled(pattern="hf*.tpl"):
    """Every template the repository ships under `data/programs` whose file name matches
    `pattern`, but the keys whose recording failed: (file name, key, template), the files in name
    order. The tests that hold every bundled template to a rule read them so."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data", "programs")
    for path in sorted(glob.glob(os.path.join(root, pattern))):
        for key, t in read(path)["templates"].items():
            if "error" not in t:
                yield os.path.basename(path), key, t


def pack(data):
    """The `.tpl` bytes of `data` (a header's fields and `templates`)."""
    head = _text({k: v for k, v in data.items() if k != "templates"}).encode("utf-8")
    index, streams, offset = [], [], 0
    for key in sorted(data["templates"]):
        text = _text(data["templates"][key]).encode("utf-8")
        stream = zlib.compress(text, LEVEL)
        name = key.encode("utf-8")
        index.append(_KEY_LEN.pack(len(name)) + name + _ENTRY.pack(offset, len(stream), len(text)))
        streams.append(stream)
        offset += len(stream)
    if offset >= 1 << 32:
        raise TemplateFileError("the templates deflate to 4 GiB or more: split the file")
    return b"".join([MAGIC, _VERSION_HEAD.pack(VERSION, len(head)), head, _COUNT.pack(len(index)),
                     *index, *streams])


def dumps(data):
    """The recorders' text of `data`: the header, then one template a line by key."""
    head = _text({k: v for k, v in data.items() if k != "templates"})
    lines = ",\n".join(f"{json.dumps(k)}:{_text(v)}" for k, v in sorted(data["templates"].items()))
    return head[:-1] + (',"templates":{\n' if head != "{}" else '"templates":{\n') + lines + "}}\n"


def write(path, data, packed=None):
    """Writes `data` (a header's fields and `templates`) to `path`: packed where `packed`, or
    where it is None and `path` ends in `.tpl`; the recorders' text otherwise."""
    if packed is None:
        packed = path.endswith(".tpl")
    blob = pack(data) if packed else dumps(data).encode("utf-8")
    with open(path, "wb") as f:
        f.write(blob)


def merge(base, ours, theirs):
    """The three-way merge of three files' data, by header field and by template key; raises
    TemplateFileError naming every key both sides changed differently."""
    missing = object()

    def three(b, o, t, what):
        """The merged value, `missing` for one deleted, or a conflict's description."""
        tb, to, tt = (None if x is missing else _text(x) for x in (b, o, t))
        if to == tt:
            return o, None
        if to == tb:
            return t, None
        if tt == tb:
            return o, None
        def state(x):
            return "deleted" if x is None else "changed" if tb is not None else "added"

        return None, f"{what}: {state(to)} on ours and {state(tt)} on theirs, differently"

    conflicts = []
    out = {}
    heads = [{k: v for k, v in d.items() if k != "templates"} for d in (base, ours, theirs)]
    for field in sorted(set().union(*heads)):
        v, c = three(*(h.get(field, missing) for h in heads), f"header field {field}")
        if c:
            conflicts.append(c)
        elif v is not missing:
            out[field] = v
    templates = {}
    sides = [d["templates"] for d in (base, ours, theirs)]
    for key in sorted(set().union(*sides)):
        v, c = three(*(s.get(key, missing) for s in sides), key)
        if c:
            conflicts.append(c)
        elif v is not missing:
            templates[key] = v
    if conflicts:
        raise TemplateFileError("conflicting templates:\n  " + "\n  ".join(conflicts))
    out["templates"] = templates
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("cat", help="print the file as the recorders' JSON, or one template's JSON")
    c.add_argument("file")
    c.add_argument("key", nargs="?")
    sub.add_parser("keys", help="print the file's keys, one a line").add_argument("file")
    for name, what in (("pack", "write IN (either form) as a .tpl file"),
                       ("unpack", "write IN (either form) as the recorders' JSON")):
        p = sub.add_parser(name, help=what)
        p.add_argument("input")
        p.add_argument("output")
    m = sub.add_parser("merge", help="three-way merge by key into OUT, in OURS's form")
    for name in ("out", "base", "ours", "theirs"):
        m.add_argument(name)
    args = ap.parse_args(argv)
    try:
        if args.command == "cat" and args.key is not None:
            t = template(args.file, args.key)
            if t is None:
                raise TemplateFileError(f"{args.file}: no template {args.key}")
            sys.stdout.write(_text(t) + "\n")
        elif args.command == "cat":
            sys.stdout.write(dumps(read(args.file)))
        elif args.command == "keys":
            sys.stdout.writelines(k + "\n" for k in keys(args.file))
        elif args.command in ("pack", "unpack"):
            write(args.output, read(args.input), packed=args.command == "pack")
        else:
            packed = is_packed(args.ours)
            # git hands an empty ancestor where both sides added the file.
            base = read(args.base) if os.path.getsize(args.base) else {"templates": {}}
            merged = merge(base, read(args.ours), read(args.theirs))
            write(args.out, merged, packed=packed)
    except (TemplateFileError, OSError) as e:
        print(f"template_file: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""PyTorch's own memory_summary() text for the statistics headroom wrote.

For each data/validation/memory_summary/<case>.stats.json (the 122-key dict of
torch.cuda.memory_stats(), written by `HEADROOM_REGENERATE=1 cargo test -p headroom-alloc
--test memory_summary`), runs torch.cuda.memory.memory_summary() on those statistics and
writes <case>.full.txt and <case>.abbreviated.txt beside it. The test then holds headroom's
text to these files character for character. Needs PyTorch (any build; no GPU: the
statistics are handed to PyTorch's formatting code in place of the device's). Usage:

    python3 scripts/validate/memory_summary.py [DIR]
"""

import glob
import json
import os
import sys

import torch
import torch.cuda.memory as memory

here = os.path.dirname(os.path.abspath(__file__))
directory = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "../../data/validation/memory_summary")
cases = sorted(glob.glob(os.path.join(directory, "*.stats.json")))
if not cases:
    sys.exit(f"no *.stats.json in {directory}")
for path in cases:
    with open(path) as f:
        stats = json.load(f)
    # memory_summary reads the device's statistics through memory_stats(); give it these.
    memory.memory_stats = lambda device=None, stats=stats: stats
    base = path[: -len(".stats.json")]
    for abbreviated, suffix in ((False, "full"), (True, "abbreviated")):
        with open(f"{base}.{suffix}.txt", "w") as f:
            f.write(memory.memory_summary(device=0, abbreviated=abbreviated))
    print(f"{os.path.basename(base)}: PyTorch {torch.__version__}")

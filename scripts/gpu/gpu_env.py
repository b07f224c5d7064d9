"""What the GPU scripts that compare a real run with `headroom plan` need before they
start: torch and transformers importable, a CUDA GPU, and the built headroom binary.
Each missing piece is a message and exit status 2."""

import os
import sys


def fail(tool, msg):
    print(f"{tool}: {msg}", file=sys.stderr)
    sys.exit(2)


def require(tool, headroom, why):
    """(torch, transformers), or exit 2 saying what is missing; `why` says what the GPU is for."""
    try:
        import torch
        import transformers
    except ImportError as e:
        fail(tool, f"needs torch and transformers ({e})")
    if not torch.cuda.is_available():
        fail(tool, f"no CUDA GPU here; this script {why} and needs one")
    if not os.path.exists(headroom):
        fail(tool, f"{headroom} not found: cargo build --release -p headroom-cli")
    return torch, transformers

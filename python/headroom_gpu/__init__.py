"""headroom from Python: record a PyTorch memory snapshot, explain it, plan a run.

    import headroom_gpu

    with headroom_gpu.record("run.pickle"):      # memory history, dumped even on an OOM
        train_one_step()
    report = headroom_gpu.inspect("run.pickle")  # `headroom inspect --json`, as a dict
    fit = headroom_gpu.plan(model="llama-3-8b", gpu="h100-sxm", precision="bf16", batch=1, seq=4096)

`inspect` and `plan` run the `headroom` command this package installs and need
nothing else; `record` needs PyTorch and a CUDA device, and imports torch only
when called. `headroom_gpu.torch_allocator` loads headroom's allocator into
PyTorch (the headroom-torch shared library). `headroom_gpu.recorder` records a training step
without a GPU, under fake tensors, as a step program `headroom plan --program` replays
(`python -m headroom_gpu record`; docs/RECORDING.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from typing import Any, Iterator

__all__ = ["HeadroomError", "binary", "inspect", "plan", "record"]


class HeadroomError(RuntimeError):
    """`headroom` refused the input (exit status 2), or a step could not run."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def binary() -> str:
    """The `headroom` executable: $HEADROOM_BIN, else the one installed beside this package, else PATH."""
    override = os.environ.get("HEADROOM_BIN")
    if override:
        return override
    name = "headroom.exe" if sys.platform == "win32" else "headroom"
    # Where pip put it: this environment's scripts directory, or the user's (`pip install --user`).
    directories = [sysconfig.get_path("scripts")]
    if hasattr(sysconfig, "get_preferred_scheme"):  # Python 3.10+
        user_scheme = sysconfig.get_preferred_scheme("user")
    else:
        user_scheme = "nt_user" if os.name == "nt" else "posix_user"
    try:
        directories.append(sysconfig.get_path("scripts", user_scheme))
    except KeyError:
        pass
    for directory in directories:
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate):
            return candidate
    found = shutil.which(name)
    if found:
        return found
    raise HeadroomError(
        "the headroom command was not found: reinstall the wheel (pip install headroom-gpu), "
        "or set HEADROOM_BIN to its path"
    )


def _run_json(args: list[str]) -> dict[str, Any]:
    """Runs `headroom ARGS --json`; exit statuses 0 and 1 are answers, 2 is refused input."""
    proc = subprocess.run([binary(), *args, "--json"], capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        message = proc.stderr.strip() or f"headroom exited with status {proc.returncode}"
        raise HeadroomError(message.removeprefix("error: "), proc.returncode)
    return json.loads(proc.stdout)


def _flags(options: dict[str, Any]) -> list[str]:
    """Keyword arguments as the command's flags: `max_batch=True` is `--max-batch`."""
    out: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
        else:
            out.extend([flag, str(value)])
    return out


def plan(model: str, gpu: str, **options: Any) -> dict[str, Any]:
    """`headroom plan --json`: will `model` fit on `gpu`, term by term.

    Keyword arguments are the command's flags (`batch=8, seq=4096, checkpoint="full",
    infer=True, max_batch=True`); see `headroom plan --help`. Returns the JSON object of
    docs/JSON.md; `result["fits"]` is the answer.
    """
    return _run_json(["plan", "--model", str(model), "--gpu", str(gpu), *_flags(options)])


def inspect(*snapshots: str | os.PathLike[str], **options: Any) -> dict[str, Any]:
    """`headroom inspect --json`: the peak by call site, fragmentation, leak suspects, the OOM.

    Keyword arguments are the command's flags (`device=0, top=20, cpp=True`).
    """
    if not snapshots:
        raise HeadroomError("inspect needs at least one snapshot")
    return _run_json(["inspect", *map(os.fspath, snapshots), *_flags(options)])


@contextlib.contextmanager
def record(
    path: str | os.PathLike[str],
    max_entries: int = 100_000,
    stacks: str = "python",
) -> Iterator[None]:
    """Records the CUDA caching allocator's history while the block runs and dumps the
    snapshot to `path` when it ends — also when it raises (an out-of-memory error
    included), after which the exception goes on.

    `stacks="all"` adds C++ frames (`headroom inspect --cpp` names the ATen operator);
    `max_entries` bounds the history PyTorch keeps.
    """
    try:
        import torch
    except ImportError as e:
        raise HeadroomError("record needs PyTorch (pip install torch)") from e
    if not torch.cuda.is_available():
        raise HeadroomError(
            "record needs a CUDA device, and torch.cuda.is_available() is False here; "
            "record on the GPU machine and inspect the snapshot anywhere"
        )
    memory = torch.cuda.memory
    memory._record_memory_history(enabled="all", stacks=stacks, max_entries=max_entries)
    try:
        yield
    finally:
        try:
            memory._dump_snapshot(os.fspath(path))
        finally:
            memory._record_memory_history(enabled=None)

"""Build DeepSpeed's JIT ops before any trial needs them.

On a fresh machine the first trial compiles DeepSpeed ops (on CPU: shm comm at process-group init,
fused Adam, CPU Adam for offload; on GPU: fused Adam, CPU Adam): minutes of ninja that a trial
timeout must not absorb. Worse, a trial killed mid-build leaves torch's build lock behind and every
later trial waits on it. Built ops are cached in ~/.cache/torch_extensions (TORCH_EXTENSIONS_DIR).

    python -m autotune.trial.ops --device cpu      # prints seconds per op
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from autotune.environment import select_accelerator

# The DeepSpeed op builders a trial loads, per accelerator.
TRIAL_OPS = {
    "cpu": ("ShareMemCommBuilder", "FusedAdamBuilder", "CPUAdamBuilder"),
    "cuda": ("FusedAdamBuilder", "CPUAdamBuilder"),
}


# The directory names the built extensions get under torch's extensions cache.
BUILT_NAMES = {"cpu": ("deepspeed_shm_comm", "fused_adam", "cpu_adam"), "cuda": ("fused_adam", "cpu_adam")}


def ops_built(device: str) -> bool:
    """Whether every op a trial loads is already compiled, judged from torch's extensions cache; cheap."""
    base = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")
    kind = "cpu" if device == "cpu" else "cu"
    return all(
        any(base.glob(f"py*_{kind}*/{name}/{name}.so")) or any(base.glob(f"{name}/{name}.so"))
        for name in BUILT_NAMES[device]
    )


def build_ops(device: str) -> dict[str, float]:
    """In this process: load (building if needed) each op; seconds per op."""
    select_accelerator(device)
    from deepspeed.accelerator import get_accelerator

    seconds = {}
    for name in TRIAL_OPS[device]:
        started = time.perf_counter()
        get_accelerator().create_op_builder(name).load()
        seconds[name] = round(time.perf_counter() - started, 2)
    return seconds


def prebuild_ops(device: str = "cpu", python: str = sys.executable, timeout_s: float = 3600.0) -> dict[str, float]:
    """In a child process, so the caller never imports torch; seconds per op (a few each once cached)."""
    completed = subprocess.run(
        [python, "-m", "autotune.trial.ops", "--device", device],
        env={**os.environ, "DS_ACCELERATOR": device},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    lines = completed.stdout.strip().splitlines()
    if completed.returncode != 0 or not lines:
        tail = (completed.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"building DeepSpeed ops for {device} failed: {tail}")
    return json.loads(lines[-1])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m autotune.trial.ops", description=__doc__)
    parser.add_argument("--device", choices=sorted(TRIAL_OPS), default="cpu")
    print(json.dumps(build_ops(parser.parse_args().device)))

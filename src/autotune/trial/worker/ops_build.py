"""Load (building if needed) DeepSpeed's JIT ops in this process: the child trial/launch/ops.py starts per op,
so the tuner never imports DeepSpeed.

    python -m autotune.trial.worker.ops_build --device cpu      # prints seconds per op
"""

from __future__ import annotations

import argparse
import json
import time

from autotune.infra.environment import select_accelerator
from autotune.trial.launch.ops import TRIAL_OPS


def build_ops(device: str, names: tuple[str, ...] = ()) -> dict[str, float]:
    """In this process: load (building if needed) each op (`names`, default all a trial loads); seconds per op."""
    select_accelerator(device)
    from deepspeed.accelerator import get_accelerator

    seconds = {}
    for name in names or TRIAL_OPS[device]:
        started = time.perf_counter()
        get_accelerator().create_op_builder(name).load()
        seconds[name] = round(time.perf_counter() - started, 2)
    return seconds


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m autotune.trial.worker.ops_build", description=__doc__)
    parser.add_argument("--device", choices=sorted(TRIAL_OPS), default="cpu")
    parser.add_argument("--op", action="append", default=[], help="one op builder (repeatable; default: all)")
    arguments = parser.parse_args()
    print(json.dumps(build_ops(arguments.device, tuple(arguments.op))))

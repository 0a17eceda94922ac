"""Test seam: make a real worker hang, die or raise at a chosen point, through its environment.

A launcher's kill, orphan and classification paths can only be proven end to end with a real worker
that misbehaves; the environment is the one input every launcher (direct, torchrun, srun, warm pool)
passes through unchanged. Unset in production, where this module does nothing.
"""

from __future__ import annotations

import os
import signal
import time

FAULT_ENV = "AUTOTUNE_TRIAL_FAULT"  # "<action>@<point>" or "<action>@<point>:<rank>"
ACTIONS = ("hang", "sigkill", "raise", "memory_error", "oom_gpu", "leak", "vanish")
POINTS = ("entry", "start", "step")  # before imports; after imports; after the first training step
LEAK_BYTES = 96 * 2**20  # "leak": what each time keeps for the life of the process (a warm worker's leftovers)
_LEAKED: list[bytearray] = []  # the test seam's own: held on purpose, so a warm pool must notice the growth


def fault_value(action: str, point: str, rank: int | None = None) -> str:
    if action not in ACTIONS or point not in POINTS:
        raise ValueError(f"unknown fault {action}@{point}")
    return f"{action}@{point}" + ("" if rank is None else f":{rank}")


def maybe_inject_fault(point: str, rank: int) -> None:
    value = os.environ.get(FAULT_ENV)
    if not value:
        return
    action, _, where = value.partition("@")
    where_point, _, where_rank = where.partition(":")
    if where_point != point or (where_rank and int(where_rank) != rank):
        return
    if action == "hang":
        while True:
            time.sleep(1)
    if action == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "vanish":  # exit 1 having written neither report nor error line: a rank whose disk filled
        os._exit(1)
    if action == "memory_error":
        raise MemoryError("injected host allocation failure")
    if action == "leak":
        _LEAKED.append(bytearray(b"\x01" * LEAK_BYTES))  # written, so every page is resident
        return
    if action == "oom_gpu":
        import torch

        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
    raise RuntimeError(f"injected failure at {point}")

"""SIGTERM as clusters send it: a request to stop within a grace period, not a reason to vanish.

SLURM sends SIGTERM on scancel, at the time limit and on preemption, then SIGKILL after `KillWait`
(30 s by default, slurm.conf(5)); torchrun's agent and Kubernetes do the same. Python's default
action for SIGTERM ends the process without unwinding, so trial processes, temporary directories
and a half-finished tuning's best result were all lost. Inside `sigterm_raises()` the first SIGTERM
raises `Terminated` in the main thread instead: the trial launcher's `finally` stops the trial's
processes (SIGTERM, then SIGKILL after its own shorter grace), temporary directories are removed,
the best verified config (if any) is written and published, and the CLI exits with TERMINATED_EXIT.
Later SIGTERMs during that cleanup are ignored, so the cleanup is not itself interrupted.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

TERMINATED_EXIT = 143  # 128 + SIGTERM: what a shell and SLURM report for a process ended by SIGTERM


class Terminated(BaseException):
    """Raised by SIGTERM inside sigterm_raises(); a BaseException so `except Exception` does not swallow it."""

    exit_code = TERMINATED_EXIT

    def __init__(self, message: str = "terminated by SIGTERM") -> None:
        super().__init__(message)


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, the first SIGTERM raises Terminated; the previous handler is restored after.

    Only the main thread can install handlers; elsewhere this does nothing (the caller's process keeps
    its own behaviour)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised: list[int] = []

    def handler(signum: int, frame: object) -> None:
        if raised:
            return  # already stopping: let the cleanup finish before SIGKILL
        raised.append(signum)
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

"""SIGTERM as clusters send it: a request to stop within a grace period, not a reason to vanish.

SLURM sends SIGTERM on scancel, at the time limit and on preemption, then SIGKILL after `KillWait`
(30 s by default, slurm.conf(5)); torchrun's agent and Kubernetes do the same. Python's default
action for SIGTERM ends the process without unwinding, so trial processes, temporary directories
and a half-finished tuning's best result were all lost. Inside `sigterm_raises()` the first SIGTERM
raises `Terminated` in the main thread instead: the trial launcher's `finally` stops the trial's
processes (SIGTERM, then SIGKILL after its own shorter grace), temporary directories are removed,
the best verified config (if any) is written and published, and the CLI exits with TERMINATED_EXIT.
Later SIGTERMs during that cleanup are ignored, so the cleanup is not itself interrupted.

SIGINT (Ctrl-C) is handled the same way (issue 46: it exited 130 saying nothing, where SIGTERM said what it
wrote); only its exit status differs, 130 as a shell reports it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

TERMINATED_EXIT = 143  # 128 + SIGTERM: what a shell and SLURM report for a process ended by SIGTERM
INTERRUPTED_EXIT = 130  # 128 + SIGINT
SIGNAL_WORDS = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT (Ctrl-C)"}


class Terminated(BaseException):
    """Raised by SIGTERM inside sigterm_raises(); a BaseException so `except Exception` does not swallow it."""

    def __init__(self, message: str | None = None, *, signum: int = signal.SIGTERM) -> None:
        self.signum = signum
        self.exit_code = INTERRUPTED_EXIT if signum == signal.SIGINT else TERMINATED_EXIT
        # whether finished trials are in a results cache a rerun reads (set by the tuner on the way out)
        self.resumable: bool | None = None
        # whether the tuner wrote the files of the best config verified so far (its message says which)
        self.files_written = False
        super().__init__(message or f"{self.stopped_by}; nothing written")

    @property
    def stopped_by(self) -> str:
        """'terminated by SIGTERM' or 'interrupted by SIGINT (Ctrl-C)', the start of the line the user sees."""
        verb = "interrupted" if self.signum == signal.SIGINT else "terminated"
        return f"{verb} by {SIGNAL_WORDS.get(signal.Signals(self.signum), str(self.signum))}"


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, the first SIGTERM or SIGINT raises Terminated; the previous handlers are restored after.

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
        raise Terminated(signum=signum)

    previous = {signum: signal.signal(signum, handler) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, before in previous.items():
            signal.signal(signum, before)

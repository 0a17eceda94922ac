"""What a waiting rank says while another process tunes: the tuner's progress, read from its note.

The tuner writes its progress (which trial of how many, since when) into its `K.leader.json` note at every
trial start (coordinate.py `note_progress`); a waiting process prints one timestamped line when it starts
waiting and one a minute, so a SLURM log shows every rank alive and what it waits for.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from autotune.core.units import format_duration
from autotune.hook.coordinate import SharedSlot, note_progress, read_leader_note
from autotune.hook.env import JobEnv

if TYPE_CHECKING:
    from autotune.search.records import SearchEvent


class ProgressNote:
    """Search observer of the tuning process: forwards every event, and notes each trial start for the waiters."""

    def __init__(self, slot: SharedSlot, budget: int | None, forward: Callable[[SearchEvent], None]) -> None:
        self.slot = slot
        self.budget = budget
        self.forward = forward
        self.trials = 0

    def __call__(self, event: SearchEvent) -> None:
        self.forward(event)
        if event.trial_budget is not None:  # --max-trials not given: the tuner's derived budget
            self.budget = event.trial_budget
        if event.kind == "trial_start" and event.candidate is not None:
            self.trials += 1
            progress = {"trial": self.trials, "budget": self.budget, "candidate": event.candidate.describe()}
            with contextlib.suppress(OSError):  # informational: a full or read-only disk must not stop the tuning
                note_progress(self.slot, {**progress, "since": time.time()})


def waiting_line(slot: SharedSlot, job: JobEnv, waited_s: float, now: float | None = None) -> str:
    """'rank 3 waiting for the tuner on node1 (pid 4242): trial 4 of at most 12 running (ZeRO-0, micro-batch
    32, for 1m05s), waited 3m12s'."""
    now = time.time() if now is None else now
    note = read_leader_note(slot)
    who = f"on {note['host']} (pid {note['pid']})" if note.get("host") else "(not started yet)"
    progress = note.get("progress") if isinstance(note.get("progress"), dict) else None
    try:
        doing = (
            f"trial {int(progress['trial'])} of at most {int(progress['budget'])} running ({progress['candidate']},"
            f" for {format_duration(now - float(progress['since']))})"
            if progress
            else "preparing (model, probe, DeepSpeed ops)"
        )
    except (KeyError, TypeError, ValueError):
        doing = "progress unknown"
    return f"rank {job.rank} waiting for the tuner {who}: {doing}, waited {format_duration(waited_s)}"

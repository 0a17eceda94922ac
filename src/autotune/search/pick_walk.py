"""The search's pick: among everything measured, faster only beyond the measured spread, else the simpler config
(autotune.search.close_call); the pick's boundary confirmed by a trial one micro-batch up; and, where the trials ran
in warm workers no fresh process has been compared with (GPUs), the pick confirmed in a process of its own.

`PickWalk` is a mixin of `autotune.search.walk.Search`, as `ModeWalk` is: it reads the walk's trials and launches
through it; what it uses is declared below for the type checker.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from autotune.core.ladder import Candidate
from autotune.core.measurement import Speed, pooled
from autotune.modes.search_view import is_ratio_mode
from autotune.search.close_call import settle
from autotune.search.records import LaunchPurpose, RunTrial, SearchEvent, SearchOutcome, TrialRecord
from autotune.search.relations import holds_at_least_the_memory_of, same_group

if TYPE_CHECKING:
    from autotune.core.ladder import Mode, Rung
    from autotune.core.stop import StopReason


class PickWalk:
    """The pick's part of one search (see the module docstring)."""

    if TYPE_CHECKING:  # provided by Search (autotune.search.walk)
        micro_batches: list[int]
        outcome: SearchOutcome
        observe: Callable[[SearchEvent], None]
        confirm_fresh: RunTrial | None

        def _budget_spent(self) -> tuple[StopReason, str] | None: ...
        def _stop_if_spent(self) -> str: ...
        def _trial(self, candidate: Candidate, purpose: str = ..., run: RunTrial | None = ...) -> TrialRecord: ...
        def _search_group(
            self,
            rung: Rung,
            ckpt: bool,
            seed: int,
            mode: Mode = ...,
            ok: int | None = ...,
            bad: int | None = ...,
            purpose: str = ...,
        ) -> None: ...

    def _fitted(self, candidate: Candidate, since: int = 0) -> list[TrialRecord]:
        return [
            t
            for t in self.outcome.trials[since:]
            if t.candidate == candidate and t.within_headroom and t.result.samples_per_s
        ]

    def _speed(self, candidate: Candidate, since: int = 0) -> Speed | None:
        return pooled([(t.result.step_times_s, t.result.samples_per_s) for t in self._fitted(candidate, since)])

    def _remeasure(self, candidates: Sequence[Candidate], rounds: int) -> dict[Candidate, Speed] | None:
        """Interleaved rounds (A, B, A, B); each candidate's speed from these trials alone, None when the budget
        ran out or a trial did not fit."""
        since = len(self.outcome.trials)
        self.outcome.remeasured = True
        for _ in range(rounds):
            for candidate in candidates:
                if self._budget_spent() or not self._trial(candidate, LaunchPurpose.CLOSE_CALL).within_headroom:
                    return None
        speeds = {c: self._speed(c, since) for c in candidates}
        return {c: s for c, s in speeds.items() if s is not None}

    def _confirm_boundary(self) -> None:
        """The pick ends on the largest micro-batch of its group that ran; the memory model only predicted that the
        next one does not fit. Unless a trial already showed it (an OOM or over the headroom there or below), one
        trial at the next eligible micro-batch confirms the boundary, and a fit there walks the group on upward
        (its calibrated line now has two measured points). Repeated while the pick moves; offload ratios confirm
        their own setting (`_confirm_ratio`)."""
        confirmed: set[Candidate] = set()
        while (best := self.outcome.best) is not None and best.candidate not in confirmed:
            pick = best.candidate
            confirmed.add(pick)
            above = [m for m in self.micro_batches if m > pick.micro_batch]
            if not above or is_ratio_mode(pick.mode) or self._stop_if_spent():
                return
            group = [
                t
                for t in self.outcome.trials
                if same_group(t.candidate, pick) and t.candidate.micro_batch > pick.micro_batch
            ]
            if any(t.within_headroom for t in group):
                return  # a larger one ran and was slower: the boundary is not what limits the pick
            failed = [t.candidate.micro_batch for t in group if not t.within_headroom]
            if failed and min(failed) <= above[0]:
                return
            self._search_group(
                pick.rung,
                pick.grad_checkpointing,
                above[0],
                pick.mode,
                ok=pick.micro_batch,
                bad=min(failed, default=None),
                purpose=LaunchPurpose.CONFIRM,
            )

    def _settle_close_call(self) -> None:
        """The pick among everything measured: faster only beyond the measured spread; a tie is re-measured
        interleaved and then goes to the simpler, safer config. Verdict, margin and spread go in the outcome."""
        # in trial order (not a set's hash order), so an exact tie resolves the same way in every process
        fitted = dict.fromkeys(
            t.candidate
            for t in self.outcome.trials
            if t.within_headroom and t.result.samples_per_s and not self._failed_fresh(t.candidate)
        )
        speeds = {c: s for c in fitted if (s := self._speed(c)) is not None}
        verdict = settle(speeds, self._remeasure)
        if verdict is None:
            return
        self.outcome.verdict = verdict
        self.outcome.best = max(self._fitted(verdict.pick), key=lambda t: t.result.samples_per_s or 0.0)
        self.outcome.margin, self.outcome.noise = verdict.margin, verdict.spread

    def _confirm_fresh(self) -> None:
        """The pick's memory, measured once more in a process of its own, as the user's job will start; only where
        the other trials ran in warm workers that no fresh process has been compared with (`confirm_fresh`). A warm
        worker starts each trial from the memory the last one gave back (trial/launch/warm.py replaces one whose memory
        grew), which a fresh process may not match exactly; the recommendation is what the job runs, so its peak is
        a fresh one. A pick that does not fit there is dropped, with everything that needs at least its memory, and
        the next pick among the measured is confirmed the same way. The trial budget does not skip it: a
        recommendation never goes out unconfirmed for want of one trial."""
        if self.confirm_fresh is None:
            return
        while (best := self.outcome.best) is not None:
            pick = best.candidate.key
            why = "its peak is the one reported; a trial outside the budget"
            self.observe(SearchEvent("prepare", best.candidate, f"pick {pick}: once more in a fresh process ({why})"))
            record = self._trial(best.candidate, LaunchPurpose.FRESH, run=self.confirm_fresh)
            if record.within_headroom:
                self.outcome.fresh_confirmation = record
                return
            self.observe(
                SearchEvent(
                    "prepare",
                    best.candidate,
                    f"{best.candidate.key} fitted in a warm worker but not in a fresh process; picking again",
                )
            )
            self.outcome.best, self.outcome.verdict, self.outcome.margin, self.outcome.noise = None, None, None, None
            self._settle_close_call()

    def _failed_fresh(self, candidate: Candidate) -> bool:
        """Whether a fresh-process confirmation did not fit with no more memory than `candidate` needs."""
        return any(
            t.purpose == LaunchPurpose.FRESH
            and not t.within_headroom
            and holds_at_least_the_memory_of(candidate, t.candidate)
            for t in self.outcome.trials
        )

"""The pick, decided in one place: among everything measured, faster only beyond the measured spread, else the
simpler, safer config; the pick's boundary confirmed by a trial one micro-batch up; and, where the trials ran in warm
workers no fresh process has been compared with (GPUs), the pick confirmed in a process of its own. The verdict is a
plain value of the outcome (`records.Verdict`); autotune.report.pick renders it.

A candidate wins only when its speed interval lies wholly above every other's (measurement.Speed.beats).
Otherwise the candidates whose intervals reach the fastest one's are a tie within noise, and the pick is the
simplest of them: no host offload first (it needs host RAM and pinned memory the job may not have), then the
earlier rung of the ladder (fewer moving parts), then no gradient checkpointing, then the classic rung over a
mode. A tie is first re-measured interleaved, the simplest and the fastest one after the other, ROUNDS times,
so that the machine's drift (other jobs starting, thermal, page cache) hits both alike; the decision then rests
on those interleaved trials alone. So is a clear win of the less simple config: two trials minutes apart also
measure the machine in between (on the shared 2-core machine ZeRO-0 measured 2.3 and 18.5 samples/s in two runs
of the README demo back to back, and the first run picked ZeRO-2 on it: runs 3-4 of
benchmarks/results/pick_stability_cpu_load-none_before_side_by_side.json), so a config that asks more of the job
is recommended only when it also wins side by side. A clear win of the simpler config stands:
re-measuring could only confirm it or call a tie, and a tie picks it too.

`Pick` holds the search's one state (`state.py`) and the ladder walk (`ladder_walk.py`), which continues the pick's
group upward; the rule itself (`decide`, `settle`) is pure: trials arrive through an injected callable.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autotune.core.ladder import Candidate
from autotune.core.measurement import Speed, pooled
from autotune.modes.search_view import is_ratio_mode
from autotune.search.ladder_walk import LadderWalk
from autotune.search.records import LaunchPurpose, SearchEvent, TrialRecord, Verdict
from autotune.search.relations import holds_at_least_the_memory_of, same_group, simplicity
from autotune.search.state import SearchState

ROUNDS = 2  # interleaved rounds of a close call: A, B, A, B


def decide(speeds: dict[Candidate, Speed]) -> Verdict | None:
    """The pick from one speed per candidate (dict order breaks exact ties: pass candidates in trial order)."""
    if not speeds:
        return None
    ranked = sorted(speeds, key=lambda c: speeds[c].median, reverse=True)
    fastest = ranked[0]
    close = [c for c in ranked if c == fastest or not speeds[fastest].beats(speeds[c])]
    if len(close) == 1:
        runner_up = ranked[1] if len(ranked) > 1 else None
        return Verdict(fastest, speeds[fastest], runner_up, speeds[runner_up] if runner_up else None)
    pick = min(close, key=simplicity)
    other = next(c for c in close if c != pick)  # the fastest other than the pick
    return Verdict(pick, speeds[pick], other, speeds[other], tie=True)


def settle(
    speeds: dict[Candidate, Speed],
    remeasure: Callable[[Sequence[Candidate], int], dict[Candidate, Speed] | None],
) -> Verdict | None:
    """decide(), and when that is a tie or the less simple config's win, re-measure the two interleaved and decide
    again on those trials.

    `remeasure(candidates, rounds)` runs the rounds (A, B, A, B) and returns each candidate's pooled speed
    from them, or None when it could not (budget spent, a trial failed): the first verdict stands then.
    """
    verdict = decide(speeds)
    if verdict is None or verdict.runner_up is None or verdict.spread == 0:
        return verdict  # nothing to compare with, or steps without spread: measuring again would not move it
    if not verdict.tie and simplicity(verdict.pick) <= simplicity(verdict.runner_up):
        return verdict  # the simpler config's clear win: a re-measure could only confirm it or tie, picking it too
    again = remeasure((verdict.pick, verdict.runner_up), ROUNDS)
    if not again or len(again) < 2:
        return verdict
    final = decide(again)
    if final is None:
        return verdict
    return Verdict(final.pick, final.speed, final.runner_up, final.runner_up_speed, tie=final.tie, remeasured=True)


@dataclass
class Pick:
    """The pick's steps over one search's state, after the walks (see the module docstring)."""

    state: SearchState
    ladder: LadderWalk

    def confirm_boundary(self) -> None:
        """The pick ends on the largest micro-batch of its group that ran; the memory model only predicted that the
        next one does not fit. Unless a trial already showed it (an OOM or over the headroom there or below), one
        trial at the next eligible micro-batch confirms the boundary, and a fit there walks the group on upward
        (its calibrated line now has two measured points). Repeated while the pick moves; offload ratios confirm
        their own setting (`ModeWalk.confirm_ratio`)."""
        state = self.state
        confirmed: set[Candidate] = set()
        while (best := state.outcome.best) is not None and best.candidate not in confirmed:
            pick = best.candidate
            confirmed.add(pick)
            above = [m for m in state.micro_batches if m > pick.micro_batch]
            if not above or is_ratio_mode(pick.mode) or state.stop_if_spent():
                return
            group = [
                t
                for t in state.outcome.trials
                if same_group(t.candidate, pick) and t.candidate.micro_batch > pick.micro_batch
            ]
            if any(t.within_headroom for t in group):
                return  # a larger one ran and was slower: the boundary is not what limits the pick
            failed = [t.candidate.micro_batch for t in group if not t.within_headroom]
            if failed and min(failed) <= above[0]:
                return
            self.ladder.search_group(
                pick.rung,
                pick.grad_checkpointing,
                above[0],
                pick.mode,
                ok=pick.micro_batch,
                bad=min(failed, default=None),
                purpose=LaunchPurpose.CONFIRM,
            )

    def settle_close_call(self) -> None:
        """The pick among everything measured: faster only beyond the measured spread; a tie is re-measured
        interleaved and then goes to the simpler, safer config. Verdict, margin and spread go in the outcome."""
        # in trial order (not a set's hash order), so an exact tie resolves the same way in every process
        fitted = dict.fromkeys(
            t.candidate
            for t in self.state.outcome.trials
            if t.within_headroom and t.result.samples_per_s and not self._failed_fresh(t.candidate)
        )
        speeds = {c: s for c in fitted if (s := self._speed(c)) is not None}
        verdict = settle(speeds, self._remeasure)
        if verdict is None:
            return
        best = max(self._fitted(verdict.pick), key=lambda t: t.result.samples_per_s or 0.0)
        self.state.set_pick(best, verdict)

    def confirm_fresh(self) -> None:
        """The pick's memory, measured once more in a process of its own, as the user's job will start; only where
        the other trials ran in warm workers that no fresh process has been compared with (`confirm_fresh`). A warm
        worker starts each trial from the memory the last one gave back (trial/launch/warm.py replaces one whose
        memory grew), which a fresh process may not match exactly; the recommendation is what the job runs, so its
        peak is a fresh one. A pick that does not fit there is dropped, with everything that needs at least its
        memory, and the next pick among the measured is confirmed the same way. The trial budget does not skip it:
        a recommendation never goes out unconfirmed for want of one trial. A pick whose own trial was the first its
        processes ran (the first of a launch, after a failure replaced the workers, say) was measured from a fresh
        process's state already: that trial is its confirmation, and nothing is launched again."""
        state = self.state
        if state.confirm_fresh is None:
            return
        while (best := state.outcome.best) is not None:
            pick = best.candidate.key
            if (first := self._first_in_process(best.candidate)) is not None:
                why = f"its trial ({first.purpose}) was the first its processes ran, so its peak is a fresh process's"
                state.observe(SearchEvent("prepare", best.candidate, f"pick {pick}: no launch to confirm it: {why}"))
                state.outcome.fresh_confirmation = first
                return
            why = "its peak is the one reported; a trial outside the budget"
            state.observe(SearchEvent("prepare", best.candidate, f"pick {pick}: once more in a fresh process ({why})"))
            record = state.trial(best.candidate, LaunchPurpose.FRESH, run=state.confirm_fresh)
            if record.within_headroom:
                state.outcome.fresh_confirmation = record
                return
            again = f"{pick} fitted in a warm worker but not in a fresh process; picking again"
            state.observe(SearchEvent("prepare", best.candidate, again))
            state.set_pick(None)
            self.settle_close_call()

    def _first_in_process(self, candidate: Candidate) -> TrialRecord | None:
        """`candidate`'s latest trial of this run that fitted in processes that had run no trial before it
        (TrialResult.first_in_process: a fresh launch, or a warm launch's first trial, which starts from the state
        a fresh process has at its first step, trial/worker/train_steps.py settle); None when there is none."""
        first = [t for t in self._fitted(candidate) if t.result.first_in_process and not t.from_cache]
        return first[-1] if first else None

    def _fitted(self, candidate: Candidate, since: int = 0) -> list[TrialRecord]:
        """The trials of `candidate` from trial `since` on that fitted and measured a speed."""
        return [
            t
            for t in self.state.outcome.trials[since:]
            if t.candidate == candidate and t.within_headroom and t.result.samples_per_s
        ]

    def _speed(self, candidate: Candidate, since: int = 0) -> Speed | None:
        """`candidate`'s speed pooled over its fitted trials from trial `since` on."""
        return pooled([(t.result.step_times_s, t.result.samples_per_s) for t in self._fitted(candidate, since)])

    def _remeasure(self, candidates: Sequence[Candidate], rounds: int) -> dict[Candidate, Speed] | None:
        """Interleaved rounds (A, B, A, B); each candidate's speed from these trials alone, None when the budget
        ran out or a trial did not fit."""
        state = self.state
        since = len(state.outcome.trials)
        state.outcome.remeasured = True
        for _ in range(rounds):
            for candidate in candidates:
                if state.budget_spent() or not state.trial(candidate, LaunchPurpose.CLOSE_CALL).within_headroom:
                    return None
        speeds = {c: self._speed(c, since) for c in candidates}
        return {c: s for c, s in speeds.items() if s is not None}

    def _failed_fresh(self, candidate: Candidate) -> bool:
        """Whether a fresh-process confirmation did not fit with no more memory than `candidate` needs."""
        return any(
            t.purpose == LaunchPurpose.FRESH
            and not t.within_headroom
            and holds_at_least_the_memory_of(candidate, t.candidate)
            for t in self.state.outcome.trials
        )

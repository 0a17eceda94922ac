"""The ladder walk: each (rung, checkpointing) group ruled out, bounded, or searched for its largest micro-batch
that runs, with real trials seeded by the memory model and steered by what each trial measured.

`LadderWalk` holds the search's one state (`state.py`) and acts on it through its public methods; the mode walk
(`mode_walk.py`) walks a mode's rung with it, and the pick (`pick_decision.py`) continues a group with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.core.ladder import Candidate, Mode, Rung
from autotune.core.units import format_bytes
from autotune.estimate import check_fit
from autotune.estimate.peak import memlock_problem
from autotune.search.records import RULED_OUT_MARGIN, TRY_MARGIN, LaunchPurpose, SearchEvent
from autotune.search.relations import same_group
from autotune.search.state import SearchState, largest_where


@dataclass
class LadderWalk:
    """The classic ladder's groups over one search's state (see the module docstring)."""

    state: SearchState

    def walk(self, groups: list[tuple[Rung, bool]]) -> None:
        """Every group in order, fastest-first; once a budget is spent, the rest are recorded as not tried."""
        for index, (rung, ckpt) in enumerate(groups):
            if reason := self.state.stop_if_spent():
                for rest_rung, rest_ckpt in groups[index:]:
                    self.state.skip(rest_rung, rest_ckpt, f"not tried: {reason}")
                return
            self.rung_group(rung, ckpt)

    def rung_group(self, rung: Rung, ckpt: bool, mode: Mode = Mode()) -> None:
        """One (rung, checkpointing) group: ruled out, bounded, or searched. A mode other than the classic one is
        an alternative on its rung, bounded only by measurements of the same mode (no speed order between a mode
        and the classic rungs is assumed: GroupMeasurements are per mode)."""
        state = self.state
        smallest = state.estimate(Candidate(rung, state.micro_batches[0], ckpt, mode))
        if locked := memlock_problem(smallest, state.target):  # a hard limit: the rank would abort, not OOM
            state.skip(rung, ckpt, f"ruled out: {locked}", mode)
            return
        if smallest.gpu_peak_bytes > state.limit_bytes * (1 + RULED_OUT_MARGIN):
            verdict = check_fit(smallest, state.target, state.limits.headroom)
            state.skip(rung, ckpt, f"ruled out by the memory model: {verdict.reason}", mode)
            return
        reachable = state.predicted_max(rung, ckpt, TRY_MARGIN, mode) or state.micro_batches[0]
        if why := state.bounded(Candidate(rung, reachable, ckpt, mode)):
            state.skip(rung, ckpt, why, mode)
            return
        seed = state.predicted_max(rung, ckpt, 0.0, mode) or state.micro_batches[0]
        self.search_group(rung, ckpt, seed, mode)

    def search_group(
        self,
        rung: Rung,
        ckpt: bool,
        seed: int,
        mode: Mode = Mode(),
        *,
        ok: int | None = None,
        bad: int | None = None,
        purpose: str = LaunchPurpose.FIRST,
    ) -> None:
        """Largest micro-batch that runs for one (rung, checkpointing) group, seeded by the prediction; `ok` and
        `bad` carry what an earlier walk of the group found (the pick's confirmation continues one).

        A timeout before anything in the group ran is retried once at a smaller micro-batch (shorter
        steps) before the group is abandoned; a timeout bounds the group from above like an OOM. The walk
        stops early once the next micro-batch cannot beat the best measured (its own line, A3, bounds it).
        """
        state = self.state
        mb: int | None = seed
        guided = True
        retried_timeout = False
        while mb is not None:
            if state.stop_if_spent():
                return
            if ok is not None and (why := state.bounded(Candidate(rung, mb, ckpt, mode))):
                state.observe(SearchEvent("skip", Candidate(rung, mb, ckpt, mode), why))
                return
            record = state.trial(Candidate(rung, mb, ckpt, mode), purpose)
            purpose = LaunchPurpose.BOUNDARY
            if record.over_host_headroom:  # host buffers barely depend on the micro-batch: the rung is out
                peak, limit = format_bytes(record.host_peak_bytes or 0), format_bytes(state.host_limit_bytes or 0)
                headroom = f"{state.limits.headroom:.0%} of RAM"
                state.skip(rung, ckpt, f"host RAM peak {peak} per node > {limit} ({headroom})", mode)
                return
            if record.within_headroom:
                ok = mb
                state.consider_best(record)
            elif record.memory_failure:
                bad = mb
                guided = ok is None and guided  # a wrong guess above a success falls back to bisection
            elif record.result.status == "timeout" and (ok is not None or not retried_timeout):
                smaller = [m for m in state.micro_batches if m < mb and (ok is None or m > ok)]
                bad = mb
                if ok is None:
                    retried_timeout = True
                    if not smaller:
                        why = f"trial timed out at the smallest micro-batch: {record.result.error}"
                        state.skip(rung, ckpt, why, mode)
                        return
                    mb = smaller[len(smaller) // 2]
                    continue
            else:
                if ok is None:
                    why = f"trial failed: {record.result.status}: {record.result.error or ''}".strip()
                    state.skip(rung, ckpt, why, mode)
                return
            mb = self.next_micro_batch(rung, ckpt, ok, bad, guided=guided, mode=mode)

    def next_micro_batch(
        self, rung: Rung, ckpt: bool, ok: int | None, bad: int | None, *, guided: bool, mode: Mode = Mode()
    ) -> int | None:
        """Next micro-batch strictly between the largest that ran and the smallest that did not.

        Guided: the largest the memory model, calibrated on this run's measured peaks, puts within the limit (a
        trial is never spent on a predicted non-fit; the calibration fits its activation slope and offset on the
        measured points, so two peaks of a group draw that group's line). Once a guess above a fit failed, the
        midpoint of the predicted fits (bisection). None when the model says nothing between them fits: the
        largest that ran is the boundary, unless the pick's confirmation (`Pick.confirm_boundary`) finds otherwise."""
        state = self.state
        between = [
            m
            for m in state.micro_batches
            if (ok is None or m > ok)
            and (bad is None or m < bad)
            and not state.measured_over(Candidate(rung, m, ckpt, mode))
        ]
        if not between:
            return None
        if ok is None and bad is not None:
            return self.after_first_failure(rung, ckpt, bad, between, mode=mode)
        line = state.peak_line(Candidate(rung, between[0], ckpt, mode))
        if line is not None:  # the group's own measured peaks: memory is linear in the micro-batch
            top = largest_where(between, lambda m: line.seconds(m) <= state.limit_bytes)
        else:
            top = largest_where(between, lambda m: state.fits_with(Candidate(rung, m, ckpt, mode), state.calibration))
        if top is None:
            return None if ok is not None else between[0]
        predicted = [m for m in between if m <= top]
        return predicted[-1] if guided else predicted[len(predicted) // 2]

    def after_first_failure(self, rung: Rung, ckpt: bool, bad: int, below: list[int], mode: Mode = Mode()) -> int:
        """Nothing of this group ran yet and `bad` did not fit: jump by the memory model, not one grid step.

        The failed trial shows the true peak at `bad` is above the free memory (or the measured peak, if
        it was reported). Calibrating on that lower bound gives a model that is at least as pessimistic
        as the truth there; the largest micro-batch it says fits is the next try. If it says none, the
        middle of what is left (the bound may be pessimistic for small micro-batches; bisection, not a walk up
        from the smallest, on a dense integer grid).
        """
        state = self.state
        failed_candidate = Candidate(rung, bad, ckpt, mode)
        failed = next((t for t in reversed(state.outcome.trials) if t.candidate == failed_candidate), None)
        # a run over the headroom measured its true peak (already in the calibration), also where it stopped after
        # warm-up (SearchState.measured_true_peak); an OOM, or a CPU trial stopped at its cap, only says "more"
        peak = failed.result.peak_memory_bytes if failed and state.measured_true_peak(failed.result) else None
        at_least = peak or max(state.target.free_memory_bytes, (failed and failed.result.peak_memory_bytes) or 0)
        pessimistic = state.memory.calibrate(
            state.calibration,
            state.model,
            state.target,
            failed_candidate,
            settings=state.settings,
            measured_peak_bytes=at_least,
        )
        # within the limit itself: the calibrated model has this group's evidence; a margin over it would step
        # down one integer micro-batch per trial
        fitting = largest_where(below, lambda m: state.fits_with(Candidate(rung, m, ckpt, mode), pessimistic, 0.0))
        guess = fitting or below[len(below) // 2]
        blind = sum(
            same_group(t.candidate, failed_candidate) and t.memory_failure and not t.result.peak_memory_bytes
            for t in state.outcome.trials
        )
        # two OOMs without a measured peak in this group (the model misses memory it does not know of): halve the
        # interval too, so a dense integer grid costs log2 of its length in OOMs at worst, not one per step the
        # model moves; a peak measured over the headroom is the truth and its guess is kept
        return min(guess, below[len(below) // 2]) if blind >= 2 and not peak else guess

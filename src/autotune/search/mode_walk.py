"""The search's mode half: the modern memory modes (beyond the classic ladder) walked after it, from the same
trial budget. Partial optimizer offload searches its smallest fitting `offload_optimizer.ratio` by bisection on
the memory model anchored on this run's measured peaks, confirmed by trials; other modes walk their rung like a
classic group. A mode wins only by measured speed, and one this backend cannot run is predicted, never picked.

`ModeWalk` holds the search's one state (`state.py`) and the ladder walk (`ladder_walk.py`), through which a mode
other than the offload ratio walks its rung; it acts on the state only through its public methods.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from autotune.core.ladder import Candidate, Mode, Rung
from autotune.estimate import check_fit
from autotune.modes.search_view import ModeChoice, ModeRecord, is_ratio_mode, smallest_fitting_ratio
from autotune.search.ladder_walk import LadderWalk
from autotune.search.records import TRY_MARGIN, LaunchPurpose, TrialRecord
from autotune.search.state import SearchState

# Offload-ratio knob (a modern memory mode), a budget choice, not a claim about speed: at most this many micro-batches
# per (rung, checkpointing), each with at most this many trials (the predicted smallest fitting ratio; after a miss, the
# next ratio up that the OOM-calibrated model, or two measured peaks, say fits; after a fit, one step down when the
# calibrated model allows it). Worst case 2 x 3 = 6 extra trials per checkpointing setting; usually 1-2
# (benchmarks/README.md, search quality).
RATIO_MICRO_BATCHES = 2
RATIO_TRIES = 3


ModeOptions = dict[Rung, list[tuple[ModeChoice, ModeRecord]]]  # per rung, each applicable mode and its record


@dataclass
class ModeWalk:
    """The modern modes' part of one search (see the module docstring)."""

    state: SearchState
    ladder: LadderWalk

    def plan_modes(self) -> list[ModeRecord]:
        """Plan-only (no trials on this machine): every mode considered on every rung, each applicable one
        predicted as a not-trial-verified mode would be in a search; nothing is launched."""
        for rung, options in self.consider_modes().items():
            for ckpt in (False, True):
                for choice, record in options:
                    record.trial_verifiable = False
                    self._plan_mode(rung, ckpt, choice.mode, record, why="plan only: no trials on this machine")
        return self.state.outcome.modes

    def consider_modes(self) -> ModeOptions:
        """Ask, once per rung, which modes apply; every one considered gets a record in the outcome."""
        options: ModeOptions = {}
        for rung in self.state.rungs:
            for choice in self.state.modes(rung):
                record = ModeRecord(
                    rung, choice.mode, choice.applies, choice.reason, trial_verifiable=choice.trial_verifiable
                )
                self.state.outcome.modes.append(record)
                if choice.applies:
                    record.status = "not tried"
                    options.setdefault(rung, []).append((choice, record))
        return options

    def walk(self, groups: list[tuple[Rung, bool]], options: ModeOptions) -> None:
        """After the classic ladder, each applicable mode on its rung, for each checkpointing setting in turn."""
        for rung, ckpt in groups:
            for choice, record in options.get(rung, []):
                self.mode_group(rung, ckpt, choice, record)

    def mode_group(self, rung: Rung, ckpt: bool, choice: ModeChoice, record: ModeRecord) -> None:
        """One applicable mode on one (rung, checkpointing): planned when no trial can run it, else searched."""
        if not choice.trial_verifiable:
            self._plan_mode(rung, ckpt, choice.mode, record)
            return
        if reason := self.state.stop_if_spent():
            record.detail = record.detail or f"not tried: {reason}"
            return
        launched = self.state.launched
        if is_ratio_mode(choice.mode):
            self.search_ratio(rung, ckpt, record)
        else:
            self.ladder.rung_group(rung, ckpt, choice.mode)
        record.trials += self.state.launched - launched

    def _plan_mode(self, rung: Rung, ckpt: bool, mode: Mode, record: ModeRecord, why: str = "") -> None:
        """Predicted only: the largest micro-batch the memory model says fits with the mode (for the offload
        ratio, the smallest ratio that fits there). Never a trial, never the pick."""
        if record.status == "planned" and record.grad_checkpointing is False:
            return  # without checkpointing it already fits: that is the plan
        if is_ratio_mode(mode):
            ratios = self._ratio_settings(mode)
            # GPU memory falls as the ratio rises but host RAM grows: where the largest ratio is over a host
            # limit, a smaller one may still fit both (the host need falls with it), so walk down to it
            top = next(
                (
                    mb
                    for r in reversed(ratios)
                    if (mb := self.state.predicted_max(rung, ckpt, 0.0, Mode(offload_ratio=r)))
                ),
                None,
            )
            ratio = self._planned_ratio(rung, ckpt, top, ratios) if top else None
            mode = Mode(offload_ratio=ratio) if ratio else mode
        else:
            top = self.state.predicted_max(rung, ckpt, 0.0, mode)
        if top is None:
            record.status = record.status if record.status == "planned" else "no fit"
            record.detail = record.detail or "the memory model says nothing of it fits"
            return
        record.status, record.mode, record.micro_batch, record.grad_checkpointing = "planned", mode, top, ckpt
        record.predicted_peak_bytes = self.state.estimate(Candidate(rung, top, ckpt, mode)).gpu_peak_bytes
        record.detail = why or "this backend cannot run it: predicted only"

    def _planned_ratio(self, rung: Rung, ckpt: bool, micro_batch: int, ratios: list[float]) -> float | None:
        """The smallest offload ratio that fits at `micro_batch` for a plan, None when none does. No trial will
        confirm a plan: the ratio must fit with the model's margin (as a classic plan row must), not on the point
        prediction a search's trials then confirm. Bisect on the GPU alone (monotone in the ratio); the host need
        grows with the ratio, so the smallest GPU fit is the best for the host."""
        ratio = smallest_fitting_ratio(ratios, lambda r: self._fits_with_margin(rung, micro_batch, ckpt, r))
        if ratio and not check_fit(self.state.estimate(Candidate(rung, micro_batch, ckpt, Mode(offload_ratio=ratio))),
                                   self.state.target, self.state.limits.headroom).fits:  # fmt: skip
            return None
        return ratio

    def _ratio_settings(self, mode: Mode) -> list[float]:
        """The offload ratio's real settings strictly between 0 (ZeRO-3's neighbour) and 1 (full offload)."""
        ratios = sorted({r for r in self.state.offload_ratios if 0.0 < r < 1.0})
        return ratios or [mode.offload_ratio]

    def _fits(self, candidate: Candidate) -> bool:
        """The calibrated point prediction within the limit: a trial confirms it (an OOM moves the ratio up), so
        the spread a plan-only answer must allow for (check_fit's margin) would only buy a slower ratio."""
        if self.state.measured_over(candidate):
            return False
        return self.anchored_peak(candidate) <= self.state.limit_bytes

    def anchored_peak(self, candidate: Candidate) -> int:
        """The candidate's peak from measured peaks of its rung and checkpointing among the classic and partial-offload
        settings, where there are any. Two measured at its micro-batch: the line through them
        (`_on_measured_ratio_line`). Else the nearest measured setting's peak plus the model's difference between the
        two: the model's error in what they share (weights, buffers, activations) cancels, only what differs stays
        predicted; where that setting's own memory line is measured (`SearchState.peak_line`), its peak is read off
        the line at this micro-batch, so the model's difference is the ratio's alone, not its activation slope.
        Nothing measured: the point prediction."""
        predicted = self.state.estimate(candidate).gpu_peak_bytes
        anchors = [
            t
            for t in self.state.outcome.trials
            if t.candidate.rung is candidate.rung
            and t.candidate.grad_checkpointing == candidate.grad_checkpointing
            and (t.candidate.mode.is_classic or is_ratio_mode(t.candidate.mode))
            and t.result.ok
            and t.result.peak_memory_bytes
            and not t.from_cache
        ]
        ratio = candidate.mode.offload_ratio
        same = [t for t in anchors if t.candidate.micro_batch == candidate.micro_batch]
        if (on_line := _on_measured_ratio_line(same, ratio)) is not None:
            return on_line
        if not anchors:
            return predicted
        nearest = min(
            anchors,
            key=lambda t: (
                abs(t.candidate.micro_batch - candidate.micro_batch),
                abs(t.candidate.mode.offload_ratio - ratio),
            ),
        )
        at_micro_batch = replace(nearest.candidate, micro_batch=candidate.micro_batch)
        line = self.state.peak_line(at_micro_batch)
        if line is not None:  # the nearest setting's own measured memory line, read at this micro-batch
            difference = predicted - self.state.estimate(at_micro_batch).gpu_peak_bytes
            return int(line.seconds(candidate.micro_batch)) + difference
        difference = predicted - self.state.estimate(nearest.candidate).gpu_peak_bytes
        return (nearest.result.peak_memory_bytes or 0) + difference

    def _within_try_margin(self, candidate: Candidate) -> bool:
        """Whether the peak anchored on this run's measurements (`anchored_peak`) is within TRY_MARGIN of the limit:
        the model alone put it there, but a measured peak of the rung may already say it is further over."""
        if self.state.measured_over(candidate):
            return False
        return self.anchored_peak(candidate) <= self.state.limit_bytes * (1 + TRY_MARGIN)

    def _fits_with_margin(self, rung: Rung, mb: int, ckpt: bool, ratio: float) -> bool:
        """GPU peak plus the model's margin within the limit at `ratio` (check_fit's GPU test, without host)."""
        predicted = self.state.estimate(Candidate(rung, mb, ckpt, Mode(offload_ratio=ratio)))
        return predicted.gpu_peak_bytes + predicted.gpu_margin_bytes <= self.state.limit_bytes

    def _ratio_fits(self, rung: Rung, mb: int, ckpt: bool) -> Callable[[float], bool]:
        """Whether the calibrated memory model says partial offload at ratio r fits (for the bisection)."""
        return lambda r: self._fits(Candidate(rung, mb, ckpt, Mode(offload_ratio=r)))

    def search_ratio(self, rung: Rung, ckpt: bool, record: ModeRecord) -> None:
        """Partial optimizer offload: at the largest micro-batches some ratio below 1 reaches, the smallest ratio
        the memory model says fits (bisection), confirmed by trials; compared with everything else by measured
        speed only. Walks down the micro-batches while each step lowers the ratio and the speed has not fallen:
        the same ratio at a smaller micro-batch is no faster (A3 in autotune.search.speed), a lower one may be."""
        ratios = self._ratio_settings(record.mode)
        top = self.state.predicted_max(rung, ckpt, TRY_MARGIN, Mode(offload_ratio=ratios[-1]))
        if top is None:
            self.state.skip(rung, ckpt, "ruled out by the memory model at every offload ratio", record.mode)
            return
        previous_ratio: float | None = None
        previous_speed: float | None = None
        points = 0
        for mb in reversed([m for m in self.state.micro_batches if m <= top]):
            if points >= RATIO_MICRO_BATCHES or self.state.stop_if_spent():
                return
            ratio = smallest_fitting_ratio(ratios, self._ratio_fits(rung, mb, ckpt))
            largest = Candidate(rung, mb, ckpt, Mode(offload_ratio=ratios[-1]))
            if ratio is None and mb == top and self._within_try_margin(largest):
                ratio = ratios[-1]  # within TRY_MARGIN of fitting at the largest ratio: worth one trial
            if ratio is None or (previous_ratio is not None and ratio >= previous_ratio):
                continue
            if why := self.state.bounded(Candidate(rung, mb, ckpt, Mode(offload_ratio=ratio))):
                self.state.skip(rung, ckpt, why, Mode(offload_ratio=ratio))
                return
            points += 1
            fitted, speed = self.confirm_ratio(rung, ckpt, mb, ratio, ratios=ratios)
            if fitted is None or speed is None:
                continue
            if previous_speed is not None and speed < previous_speed:
                return
            previous_ratio, previous_speed = fitted, speed

    def confirm_ratio(
        self, rung: Rung, ckpt: bool, mb: int, ratio: float, ratios: list[float]
    ) -> tuple[float | None, float | None]:
        """Up to RATIO_TRIES trials at one micro-batch: an OOM at ratio r moves the next try up (the smallest
        larger ratio the OOM-calibrated model says fits, or, once two trials here reported peaks, the one the line
        through those peaks says fits: GPU memory is linear in the offloaded share); a fit lets the calibrated
        model try one smaller ratio. Returns the smallest ratio that ran within the headroom and its speed."""
        fitted: float | None = None
        failed: float | None = None
        speed: float | None = None
        current: float | None = ratio
        peaks: dict[float, int] = {}  # ratio -> measured peak at this micro-batch
        for _ in range(RATIO_TRIES):
            if current is None or self.state.stop_if_spent():
                break
            record = self.state.trial(Candidate(rung, mb, ckpt, Mode(offload_ratio=current)), LaunchPurpose.RATIO)
            if record.result.peak_memory_bytes:
                peaks[current] = record.result.peak_memory_bytes
            if record.within_headroom:
                self.state.consider_best(record)
                fitted, speed = current, record.result.samples_per_s
                lower = [r for r in ratios if r < current and (failed is None or r > failed)]
                current = smallest_fitting_ratio(lower, self._ratio_fits(rung, mb, ckpt))
            elif record.memory_failure and not record.over_host_headroom:
                failed = current
                higher = [r for r in ratios if r > current and (fitted is None or r < fitted)]
                if (needed := self._ratio_from_peaks(peaks)) is not None:
                    higher = [r for r in higher if r >= needed] or higher[-1:]
                current = smallest_fitting_ratio(higher, self._ratio_fits(rung, mb, ckpt)) or (
                    higher[0] if needed is not None and higher else None
                )
            else:
                break
        return fitted, speed

    def _ratio_from_peaks(self, peaks: dict[float, int]) -> float | None:
        """The ratio at which the line through the two latest measured peaks meets the limit; None with fewer
        than two points or a line that does not fall as the ratio rises (noise)."""
        if len(peaks) < 2:
            return None
        (r1, p1), (r2, p2) = list(peaks.items())[-2:]
        if r1 == r2 or (p2 - p1) / (r2 - r1) >= 0:
            return None
        slope = (p2 - p1) / (r2 - r1)
        return r2 + (self.state.limit_bytes - p2) / slope

    def finish_records(self) -> None:
        """Each verifiable mode's record takes its best measured trial (or says why nothing of it fitted)."""
        for record in self.state.outcome.modes:
            if not (record.applies and record.trial_verifiable):
                continue
            ratio = is_ratio_mode(record.mode)
            ran = [
                t
                for t in self.state.outcome.trials
                if t.candidate.rung is record.rung
                and (is_ratio_mode(t.candidate.mode) if ratio else t.candidate.mode == record.mode)
            ]
            fitted = [t for t in ran if t.within_headroom and t.result.samples_per_s]
            if fitted:
                best = max(fitted, key=lambda t: t.result.samples_per_s or 0.0)
                record.status, record.mode = "measured", best.candidate.mode
                record.micro_batch, record.grad_checkpointing = (
                    best.candidate.micro_batch,
                    best.candidate.grad_checkpointing,
                )
                record.samples_per_s, record.predicted_peak_bytes = best.result.samples_per_s, best.predicted_peak_bytes
                record.detail = f"{len(ran)} trial(s); fastest: {best.candidate.describe()}"
            elif ran:
                record.status = "no fit"
                record.detail = "tried: " + ", ".join(f"{t.candidate.key} {t.result.status}" for t in ran)
            else:
                skips = [
                    s.reason for s in self.state.outcome.skipped if s.rung is record.rung and s.mode == record.mode
                ]
                skips += [
                    s.reason
                    for s in self.state.outcome.skipped
                    if s.rung is record.rung and ratio and is_ratio_mode(s.mode)
                ]
                record.detail = record.detail or "; ".join(dict.fromkeys(skips)) or "not reached"


def _on_measured_ratio_line(same_micro_batch: list[TrialRecord], ratio: float) -> int | None:
    """The peak at `ratio` on the line through two peaks measured at its micro-batch (GPU memory is linear in the
    offloaded share: each ratio step moves whole optimizer sub-groups, runtime/zero/stage3.py:1103-1108): the two
    on either side of it where there are such, else the two nearest on one side (a trial confirms the guess: an
    OOM moves the ratio up). None with fewer than two measured ratios there."""
    by_ratio = {t.candidate.mode.offload_ratio: t.result.peak_memory_bytes or 0 for t in same_micro_batch}
    less = sorted(r for r in by_ratio if r < ratio)
    more = sorted(r for r in by_ratio if r > ratio)
    if less and more:
        r1, r2 = less[-1], more[0]
    elif len(more) >= 2:
        r1, r2 = more[0], more[1]
    elif len(less) >= 2:
        r1, r2 = less[-2], less[-1]
    else:
        return None
    p1, p2 = by_ratio[r1], by_ratio[r2]
    beyond = not (less and more)
    if beyond and p2 >= p1:  # no fall as the ratio rises: noise, not a line to extend beyond its points
        return None
    return int(p1 + (p2 - p1) * (ratio - r1) / (r2 - r1))

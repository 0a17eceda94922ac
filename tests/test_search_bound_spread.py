"""The margin a speed bound must clear is the spread measured, and the tie rule's order: a candidate is dropped
unmeasured only when the pick rule (pick_decision.decide) could not give it the pick.

Line of the measured group here: 1 s per sample, nothing fixed (points (4, 4.0) and (2, 2.0)), so it bounds the same
group's micro-batch 4 at exactly 1 sample/s per rank.
"""

from __future__ import annotations

from tests.fakes.machines import GIB, LinearMachine, LinearMemory
from tests.fakes.searches import mode_search

from autotune.core.ladder import Candidate, Rung
from autotune.search.records import TrialRecord
from autotune.search.speed import BoundContext, GroupMeasurements, could_beat
from autotune.trial.trial_types import TrialResult

CONTEXT = BoundContext(checkpointing_cost=1.3, optimizer_saving_s=None)
LINE = ((4, 4.0), (2, 2.0))
OTHER = Candidate(Rung.Z3, 4, False)


def test_a_bound_the_best_s_interval_reaches_drops_only_what_would_lose_the_tie() -> None:
    group = GroupMeasurements(Rung.Z3, False, LINE)
    best = (0.98, 1.02)  # the best's interval per rank straddles the bound (1.0)
    assert not could_beat(best, [group], OTHER, CONTEXT, loses_ties=True)[0]  # it could only tie, and lose it
    assert could_beat(best, [group], OTHER, CONTEXT, loses_ties=False)[0]  # a tie would give it the pick
    assert not could_beat((1.01, 1.02), [group], OTHER, CONTEXT, loses_ties=False)[0]  # below the low end


def test_the_group_s_own_spread_widens_its_bound() -> None:
    """The same medians with steps that could be 5% faster bound nothing the best's low end (1.02) clears."""
    quiet = GroupMeasurements(Rung.Z3, False, LINE)
    noisy = GroupMeasurements(Rung.Z3, False, LINE, fast_end=1.05)
    best = (1.02, 1.03)
    beatable, why = could_beat(best, [quiet], OTHER, CONTEXT, loses_ties=False)
    assert not beatable and "1.00 samples/s per rank (their spread included)" in why
    assert could_beat(best, [noisy], OTHER, CONTEXT, loses_ties=False)[0]


def _fitted(candidate: Candidate, step_times_s: list[float]) -> TrialRecord:
    samples = candidate.micro_batch  # one rank: samples per step = micro-batch
    steps = sorted(step_times_s)[len(step_times_s) // 2]
    return TrialRecord(
        candidate, TrialResult(status="ok", samples_per_s=samples / steps, step_times_s=step_times_s), 0, 16 * GIB
    )


def test_the_state_reads_both_spreads_from_the_trials_steps() -> None:
    """A group whose steps spread 10% is taken at its fast end; the best's interval comes from its own steps."""
    state = mode_search(LinearMachine(memory_bytes=16 * GIB), LinearMemory(), {}, [Rung.Z3, Rung.Z3_OFFLOAD_OPT]).state
    assert state.target.world_size == 1
    quiet = [4.0] * 5
    noisy = [3.6, 3.8, 4.0, 4.2, 4.4]  # median 4.0; the median's 5-step interval is [min, max]
    best = _fitted(Candidate(Rung.Z3, 4, False), quiet)
    state.outcome.trials.append(best)
    state.set_pick(best)
    group = state.measured_groups()
    assert len(group) == 1 and group[0].fast_end == 1.0
    offload = Candidate(Rung.Z3_OFFLOAD_OPT, 4, False)  # ZeRO-3 bounds it (A1) at the best's own speed
    assert "cannot beat" in state.bounded(offload)  # no faster, and less simple: it could only lose a tie
    state.outcome.trials[0] = noisy_best = _fitted(Candidate(Rung.Z3, 4, False), noisy)
    state.set_pick(noisy_best)
    assert state.measured_groups()[0].fast_end == 4.0 / 3.6
    why = state.bounded(offload)  # the bound at the group's fast end, 4 / 3.6, against the best's high end, 4 / 3.6
    assert "bound it at 1.11 samples/s per rank (their spread included) <= 1.11, the best's high end" in why

"""The pick among measured candidates: the median's interval, the step-count rule and the tie rule."""

from __future__ import annotations

import pytest

from autotune.close_call import decide, settle, simplicity
from autotune.ladder import Candidate, Mode, Rung
from autotune.measurement import MIN_STEPS, StepStats, enough_steps, median_rank_bound, speed_of

Z0 = Candidate(Rung.Z0, 8, False)
Z2 = Candidate(Rung.Z2, 8, False)
Z2_OFFLOAD = Candidate(Rung.Z2_OFFLOAD_OPT, 8, False)
ZENFLOW = Candidate(Rung.Z2_OFFLOAD_OPT, 8, False, Mode(zenflow=True))


def _speed(step_s: float, spread: float, n: int = 9):
    """n steps spread evenly over step_s * (1 +- spread), 8 samples per step."""
    times = [step_s * (1 - spread + 2 * spread * i / (n - 1)) for i in range(n)]
    return speed_of(times, 8 / step_s)


def test_median_interval_ranks_match_the_binomial_table() -> None:
    # Conover table A3 / the binomial sums: n=5 -> [x1, x5] (93.75%), n=10 -> [x2, x9], n=20 -> [x6, x15]
    assert [median_rank_bound(n) for n in (5, 6, 10, 20)] == [1, 1, 2, 6]
    stats = StepStats.of([1.0, 1.2, 0.9, 1.1, 1.05, 0.95, 1.0, 1.3, 0.8, 1.0])
    assert stats.steps == 10 and stats.median_s == pytest.approx(1.0)
    assert (stats.low_s, stats.high_s) == (0.9, 1.2)


def test_step_count_follows_the_measured_variance() -> None:
    quiet = [1.0, 1.01, 0.99, 1.0, 1.005]
    loaded = [1.0, 1.4, 0.8, 1.2, 0.9, 1.3]
    assert not enough_steps(quiet[: MIN_STEPS - 1])
    assert enough_steps(quiet)  # +-1%: five steps suffice
    assert not enough_steps(loaded)  # +-30%: keep measuring
    assert enough_steps(loaded * 4, max_steps=20)  # up to the cap
    assert enough_steps(loaded, max_seconds=5.0)  # or the time cap


def test_a_win_needs_a_margin_beyond_the_spread() -> None:
    clear = decide({Z2_OFFLOAD: _speed(1.0, 0.02), Z0: _speed(1.2, 0.02)})
    assert clear.pick == Z2_OFFLOAD and not clear.tie and clear.margin == pytest.approx(0.2)
    close = decide({ZENFLOW: _speed(1.0, 0.2), Z2_OFFLOAD: _speed(1.05, 0.2), Z0: _speed(1.1, 0.2)})
    assert close.tie and close.pick == Z0 and close.runner_up == ZENFLOW  # simplest vs fastest
    assert "tie within noise" in close.describe(lambda c: c.key)


def test_simplicity_prefers_no_host_offload_then_earlier_rungs_then_no_mode() -> None:
    ordered = sorted([ZENFLOW, Z2_OFFLOAD, Z2, Z0], key=simplicity)
    assert ordered == [Z0, Z2, Z2_OFFLOAD, ZENFLOW]


def test_a_tie_is_remeasured_and_decided_on_the_interleaved_trials_only() -> None:
    asked = []

    def remeasure(candidates, rounds):
        asked.append((tuple(candidates), rounds))
        return {Z0: _speed(1.5, 0.02), Z2_OFFLOAD: _speed(1.0, 0.02)}  # offload clearly faster when measured alike

    verdict = settle({Z0: _speed(1.0, 0.2), Z2_OFFLOAD: _speed(0.98, 0.2)}, remeasure)
    assert asked == [((Z0, Z2_OFFLOAD), 2)]
    assert verdict.pick == Z2_OFFLOAD and verdict.remeasured and not verdict.tie
    unchanged = settle({Z0: _speed(1.0, 0.2), Z2_OFFLOAD: _speed(0.98, 0.2)}, lambda c, r: None)
    assert unchanged.tie and unchanged.pick == Z0 and not unchanged.remeasured

"""The pick confirmed in a process of its own (Search.confirm_fresh): where the search's trials ran in warm workers
that no fresh process has been compared with (GPUs, `--trial-workers auto`), the pick runs once more fresh before it
is recommended, and a pick that does not fit there gives way to the next one that does.

The machine is tests/fakes/machines.py's SimulatedMachine (its own physics); a fresh process here needs `extra`
bytes more than a warm worker measured (what a warm worker might miss: memory a fresh process allocates once, which
a warm one already held before its peak was reset), a figure each test sets, not one autotune believes.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.fakes.machines import SimulatedMachine
from tests.fakes.searches import search_setup

from autotune.core.ladder import Candidate, Rung
from autotune.search.records import LaunchPurpose, SearchEvent, SearchLimits
from autotune.search.relations import holds_at_least_the_memory_of
from autotune.search.walk import Search
from autotune.trial.trial_types import TrialResult

GIB = 2**30
GRID = list(range(1, 65))
RUNGS = [Rung.Z0, Rung.Z1, Rung.Z2, Rung.Z3]


class FreshNeedsMore:
    """Runs warm trials on `machine` as measured there, and fresh ones with `extra` bytes more."""

    def __init__(self, machine: SimulatedMachine, extra: int) -> None:
        self.machine, self.extra = machine, extra
        self.fresh: list[Candidate] = []

    def run_fresh(self, candidate: Candidate) -> tuple[TrialResult, bool]:
        self.fresh.append(candidate)
        self.machine.launched.append(candidate)
        peak = self.machine.true_peak(candidate) + self.extra
        if peak > self.machine.target.free_memory_bytes:
            return TrialResult(status="oom_gpu", error="torch.OutOfMemoryError: CUDA out of memory"), False
        warm = self.machine.result(candidate)
        return replace(warm, ranks=[replace(warm.ranks[0], device_used_bytes=peak)]), False


def mode_search(extra: int, confirm: bool = True, max_trials: int = 40, observe=lambda event: None):
    model, target, settings = search_setup("gpt2-medium", 16, 4, 1024)
    machine = SimulatedMachine(model, target, settings, headroom=0.9)
    runner = FreshNeedsMore(machine, extra)
    search = Search(
        model,
        target,
        settings,
        machine.run,
        rungs=RUNGS,
        micro_batches=GRID,
        limits=SearchLimits(max_trials=max_trials),
        observe=observe,
        confirm_fresh=runner.run_fresh if confirm else None,
    )
    return search.run_search(), machine, runner


def test_without_a_fresh_confirmer_no_trial_is_repeated_fresh() -> None:
    outcome, _, runner = mode_search(extra=0, confirm=False)
    assert outcome.best is not None and outcome.fresh_confirmation is None
    assert not runner.fresh and all(t.purpose != LaunchPurpose.FRESH for t in outcome.trials)


def test_a_pick_that_fits_fresh_costs_one_trial_and_stays_the_pick() -> None:
    unconfirmed, _, _ = mode_search(extra=0, confirm=False)
    outcome, machine, runner = mode_search(extra=0)
    assert outcome.best is not None and unconfirmed.best is not None
    assert outcome.best.candidate == unconfirmed.best.candidate
    assert runner.fresh == [outcome.best.candidate]  # one fresh trial, of the pick, last
    assert machine.launched[-1] == outcome.best.candidate
    assert outcome.fresh_confirmation is outcome.trials[-1]
    assert outcome.fresh_confirmation.purpose == LaunchPurpose.FRESH and outcome.fresh_confirmation.within_headroom
    assert outcome.to_dict()["fresh_confirmation"]["candidate"] == outcome.best.candidate.to_dict()


def test_the_confirmation_runs_even_when_the_trial_budget_is_spent() -> None:
    outcome, machine, runner = mode_search(extra=0, max_trials=1)
    assert outcome.best is not None and runner.fresh == [outcome.best.candidate]
    assert len(machine.launched) == 2


def test_a_pick_that_does_not_fit_fresh_gives_way_to_one_that_does() -> None:
    """A fresh process that needs a little more than the warm worker measured: the warm pick sits at its group's
    boundary, so it does not fit fresh; the recommendation is one that fits in a fresh process, and nothing that
    needs at least the failed one's memory is picked."""
    unconfirmed, machine0, _ = mode_search(extra=0, confirm=False)
    assert unconfirmed.best is not None
    warm_pick = unconfirmed.best.candidate
    limit = int(0.9 * machine0.target.free_memory_bytes)
    extra = limit - machine0.true_peak(warm_pick) + 1  # just over the headroom, fresh, at the warm pick
    outcome, machine, runner = mode_search(extra=extra)
    assert outcome.best is not None and outcome.fresh_confirmation is not None
    assert runner.fresh[0] == warm_pick and len(runner.fresh) >= 2
    pick = outcome.best.candidate
    assert pick != warm_pick and not holds_at_least_the_memory_of(pick, warm_pick)
    assert outcome.fresh_confirmation.candidate == pick and outcome.fresh_confirmation.within_headroom
    assert machine.true_peak(pick) + extra <= limit
    failed = [t for t in outcome.trials if t.purpose == LaunchPurpose.FRESH and not t.within_headroom]
    assert [t.candidate for t in failed] == runner.fresh[:-1]
    # the pick is the fastest of what was measured and fits fresh (the search's tie rule aside: speeds here are exact)
    fits_fresh = {
        t.candidate
        for t in outcome.trials
        if t.within_headroom and not any(holds_at_least_the_memory_of(t.candidate, f.candidate) for f in failed)
    }
    assert pick in fits_fresh
    assert machine.result(pick).samples_per_s == pytest.approx(
        max(machine.result(c).samples_per_s or 0.0 for c in fits_fresh)
    )


def test_nothing_fits_fresh_leaves_no_pick() -> None:
    outcome, _, runner = mode_search(extra=64 * GIB)
    assert outcome.best is None and outcome.fresh_confirmation is None and runner.fresh


def test_progress_says_the_confirmation_runs_and_why_a_pick_gave_way() -> None:
    unconfirmed, machine0, _ = mode_search(extra=0, confirm=False)
    assert unconfirmed.best is not None
    extra = int(0.9 * machine0.target.free_memory_bytes) - machine0.true_peak(unconfirmed.best.candidate) + 1
    events: list[SearchEvent] = []
    mode_search(extra=extra, observe=events.append)
    lines = [e.message for e in events if e.kind == "prepare"]
    first = unconfirmed.best.candidate.key
    assert f"pick {first}: once more in a fresh process (its peak is the one reported" in lines[-3]
    assert lines[-2] == f"{first} fitted in a warm worker but not in a fresh process; picking again"
    assert "once more in a fresh process" in lines[-1]

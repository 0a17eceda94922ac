"""A first tune of a sensible length: `autotune tune` has a stated default time budget that bounds the whole tune
(no trial starts after it, one running at it is stopped), says what it expects before the first trial, and ends
with the best verified config and what it did not try."""

from __future__ import annotations

import inspect
import time

import pytest
from tests.fakes.launchers import SlowLauncher

from autotune import tune
from autotune.cli.tune import _print_summary, tune_command
from autotune.core.ladder import Rung
from autotune.core.stop import StopReason
from autotune.errors import TrialsFailedError
from autotune.request.tune_request import CPU_TUNE_TIME_BUDGET_S, with_tune_time_budget
from autotune.search.records import SearchEvent
from autotune.trial.trial_types import TrialSpec
from autotune.tuner import TuneRequest
from autotune.tuning.trials import budgeted_spec


def test_tune_has_a_stated_default_time_budget_on_the_cpu_backend_and_none_on_gpus() -> None:
    assert inspect.signature(tune_command).parameters["time_budget"].default is None  # resolved by device
    assert with_tune_time_budget(TuneRequest.of(model="x", device="cpu")).search.time_budget_s == 600.0
    assert CPU_TUNE_TIME_BUDGET_S == 600.0
    assert with_tune_time_budget(TuneRequest.of(model="x")).search.time_budget_s is None  # GPUs: none
    given = TuneRequest.of(model="x", device="cpu", time_budget_s=30.0)
    assert with_tune_time_budget(given).search.time_budget_s == 30.0
    assert TuneRequest.of(model="x").search.time_budget_s is None  # the API and the hook keep none unless given


def test_the_trial_budget_is_derived_from_the_search_unless_given() -> None:
    """Two trials per (rung, checkpointing) group, 1 boundary confirmation, 4 close-call trials: 33 for 7 rungs."""
    from autotune.search.trial_budget import SearchShape, derived_max_trials

    assert TuneRequest.of(model="x").search.max_trials is None
    assert derived_max_trials(SearchShape(rungs=7, mode_groups=0, ratio_modes=0)) == 33
    assert derived_max_trials(SearchShape(rungs=7, mode_groups=2, ratio_modes=0)) == 41  # hpZ on 2 rungs
    assert derived_max_trials(SearchShape(rungs=2, mode_groups=0, ratio_modes=0)) == 13


def test_the_budget_bounds_the_whole_tune_and_the_summary_says_what_was_not_tried(tmp_path, capsys) -> None:
    """Trials of 4 s under a 9 s budget (counted from the first op load; here, the search's start): no trial runs past
    the budget (a trial's timeout is at most the time left, floored at 1 s), and the tune writes the best verified
    config, naming the budget and the groups it did not try; the line before the first trial says what to expect."""
    events: list[tuple[float, SearchEvent]] = []
    launcher = SlowLauncher(wall_s=4.0)
    started = time.monotonic()
    result = tune(_request(tmp_path, 9.0), launcher=launcher, observe=lambda e: events.append((time.monotonic(), e)))
    assert result.verified and result.candidate is not None and result.config_path.exists()
    assert result.stop_reason is StopReason.TIME_BUDGET
    last_end = max(at for at, e in events if e.kind == "trial_end")
    assert last_end - started <= 9.0 + 1.0 + 0.5 + 5.0  # budget, 1 s floor, slack, the context's build
    first = next(e.message for _, e in events if e.kind == "prepare")
    expected = "expect at most 17 trials (--max-trials: 17, two per group and 5 for the pick) over 3 rung(s), with and"
    assert first.startswith(expected) and "micro-batches 1-4" in first and "time budget" in first
    _print_summary(result)
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "Stopped early" in line)
    assert "time budget spent" in line and "not tried:" in line and "--time-budget" in line


def test_a_trial_running_at_the_budget_is_stopped_and_said_so(tmp_path) -> None:
    launcher = SlowLauncher(wall_s=30.0)
    started = time.monotonic()
    with pytest.raises(TrialsFailedError, match=r"time budget ran out before a trial verified a config"):
        tune(_request(tmp_path, 2.0), launcher=launcher)
    assert time.monotonic() - started < 30.0 and launcher.specs[0].timeout_s <= 2.0


def test_a_trial_timeout_is_cut_only_by_a_nearer_deadline() -> None:
    spec = TrialSpec(model_config={}, architecture="x", family="decoder-only", ds_config={}, seq_len=8, timeout_s=900.0)
    assert budgeted_spec(spec, None) == (spec, False)
    assert budgeted_spec(spec, time.monotonic() + 5000) == (spec, False)
    cut, shortened = budgeted_spec(spec, time.monotonic() + 60)
    assert shortened and 55 < cut.timeout_s <= 60
    assert budgeted_spec(spec, time.monotonic() - 5)[0].timeout_s == 1.0  # spent: the floor


def _request(tmp_path, budget: float) -> TuneRequest:
    return TuneRequest.of(
        model="tiny-gpt2",
        device="cpu",
        memory_budget="2GiB",
        seq_len=64,
        rungs=(Rung.Z0, Rung.Z1, Rung.Z3),
        micro_batches=(1, 2, 4),
        time_budget_s=budget,
        out=str(tmp_path / "ds_config.json"),
        use_cache=False,
    )


def test_a_budget_spent_before_any_trial_says_so_not_nothing_fits(tmp_path) -> None:
    """Op builds can spend a short budget before the first trial: that is not "nothing fits"."""
    with pytest.raises(TrialsFailedError, match=r"time budget ran out before any trial ran .*raise --time-budget"):
        tune(_request(tmp_path, 1e-9), launcher=SlowLauncher(wall_s=0.0))


def test_a_budget_spent_without_a_verified_trial_is_not_nothing_fits(tmp_path) -> None:
    """Measured: the default tune at load ~40 had one trial OOM-killed by other tenants' memory and the next cut at
    the budget; the search had not tried the rest, so "nothing fits" (exit 3) would be false."""
    verified_none = r"ran out before a trial verified a config .*tried z0/mb4/nockpt timeout"
    with pytest.raises(TrialsFailedError, match=verified_none):
        tune(_request(tmp_path, 3.0), launcher=SlowLauncher(wall_s=30.0))


def test_the_progress_says_when_the_budget_ends_the_search_before_the_trials_left_would(capsys) -> None:
    """Trials of ~1 s under a 1.5 s budget: after the first, the estimate of the 11 left (~11 s) comes with the
    budget's end, which stops the search sooner; without a budget, the estimate alone."""
    import io

    from rich.console import Console

    from autotune.cli.tune import TrialProgress
    from autotune.core.ladder import Candidate
    from autotune.search.records import TrialRecord
    from autotune.trial.trial_types import TrialResult

    first = Candidate(Rung.Z0, 8, False)
    record = TrialRecord(first, TrialResult(status="ok", samples_per_s=10.0), 1, 2, from_cache=False)

    def two_trials(progress: TrialProgress) -> str:
        progress(SearchEvent("trial_start", first))
        time.sleep(1.0)
        progress(SearchEvent("trial_end", first, "ok", record))
        progress(SearchEvent("trial_start", Candidate(Rung.Z1, 8, False)))
        return capsys.readouterr().err.splitlines()[-1]

    console = Console(file=io.StringIO(), stderr=True)
    budgeted = two_trials(TrialProgress(console, max_trials=12, enabled=True, time_budget_s=1.5))
    assert "at most 10 more after it (~" in budgeted and "the time budget stops the search in ~" in budgeted
    unbudgeted = two_trials(TrialProgress(console, max_trials=12, enabled=True))
    assert "at most 10 more after it (~" in unbudgeted and "time budget" not in unbudgeted

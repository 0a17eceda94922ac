"""benchmarks/pick_stability.py's tally: a run counts as consistent when it picked the arm's most common config,
or declared a tie naming it; other picks and failed runs do not."""

from __future__ import annotations

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _run(pick: str | None, tie: bool = False, runner_up: str | None = None, loaded: bool = False) -> dict:
    return {"pick": pick, "tie": tie, "runner_up": runner_up, "loaded": loaded}


def test_consistency_counts_same_picks_and_ties_naming_the_modal_pick(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    sys.modules.pop("pick_stability", None)
    from pick_stability import agreement, consistency

    runs = [_run("z0"), _run("z0"), _run("z2", tie=True, runner_up="z0"), _run("z2"), _run(None)]
    tally = consistency(runs)
    assert tally["modal_pick"] == "z0" and tally["same"] == 2 and tally["tie_naming_it"] == 1
    assert tally["consistent"] == 3 and tally["runs"] == 5
    assert [agreement(run, "z0") for run in runs] == ["same", "same", "tie naming it", "other", "failed"]


def test_the_benchmark_runs_the_readme_demo_with_its_own_output_and_no_cache(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    sys.modules.pop("pick_stability", None)
    from pick_stability import demo_argv

    argv = demo_argv(BENCHMARKS.parent / "README.md")
    assert argv[:2] == ["--model", "gpt2-small-demo"] and argv[-1] == "--no-cache" and "--out" not in argv
    assert "--rungs" in argv and "--micro-batches" in argv  # the README's narrowed demo, not the whole ladder

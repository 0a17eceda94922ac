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
    from pick_stability import consistency, summarize

    runs = [_run("z0"), _run("z0"), _run("z2", tie=True, runner_up="z0"), _run("z2"), _run(None)]
    tally = consistency(runs)
    assert tally["modal_pick"] == "z0" and tally["same"] == 2 and tally["tie_naming_it"] == 1
    assert tally["consistent"] == 3 and tally["runs"] == 5
    arms = summarize([*runs, _run("z3", loaded=True)])
    assert arms["loaded"]["consistent"] == 1 and arms["quiet"]["consistent"] == 3

"""search/ as one state and its collaborators: the walks act on one `SearchState` through its declared members, the
outcome's pick changes in one method, and one module decides the pick."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.fakes.machines import GIB, LinearMachine, LinearMemory
from tests.fakes.searches import mode_search

from autotune.core.ladder import Candidate, Rung
from autotune.core.measurement import speed_of
from autotune.core.stop import StopReason
from autotune.search.pick_decision import decide
from autotune.search.records import SearchLimits, TrialRecord
from autotune.trial.trial_types import TrialResult

SRC = Path(__file__).resolve().parents[1] / "src" / "autotune"
SEARCH = SRC / "search"
PICK_FIELDS = {"best", "verdict", "margin", "noise"}


def _trees(folder: Path) -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text()) for path in sorted(folder.rglob("*.py"))}


def test_no_module_under_search_declares_members_for_the_type_checker() -> None:
    """A `TYPE_CHECKING` block re-declaring another class's members hides a rename from mypy: none is left."""
    found = [
        f"{path.name}:{node.lineno}"
        for path, tree in _trees(SEARCH).items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Name) and node.id == "TYPE_CHECKING"
    ]
    assert not found, found


def test_collaborators_use_no_private_member_of_another_object() -> None:
    """The walks reach the state through its public, documented methods only: `x._name` only on `self`."""
    found = [
        f"{path.name}:{node.lineno} {node.attr}"
        for path, tree in _trees(SEARCH).items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and not (isinstance(node.value, ast.Name) and node.value.id == "self")
    ]
    assert not found, found


def _pick_writes(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, enclosing function) of each assignment to `<something>.best/.verdict/.margin/.noise`."""
    writes: list[tuple[int, str]] = []
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef):
            continue
        for node in ast.walk(function):
            targets = node.targets if isinstance(node, ast.Assign) else []
            flat = [t for target in targets for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
            writes += [
                (t.lineno, function.name) for t in flat if isinstance(t, ast.Attribute) and t.attr in PICK_FIELDS
            ]
    return writes


def test_only_set_pick_changes_the_outcomes_pick() -> None:
    writes = {
        f"{path.relative_to(SRC)}:{line} {name}"
        for path, tree in _trees(SRC).items()
        for line, name in _pick_writes(tree)
    }
    assert writes and all(w.startswith("search/state.py:") and w.endswith(" set_pick") for w in writes), writes


def test_the_check_sees_a_pick_written_elsewhere() -> None:
    tree = ast.parse("def confirm(self):\n    self.state.outcome.best, self.state.outcome.noise = None, None\n")
    assert _pick_writes(tree) == [(2, "confirm"), (2, "confirm")]


def test_one_module_decides_the_pick() -> None:
    """`decide`, `settle` and `simplicity` are defined once among the search, the tuning around it and the report
    (the report renders the verdict, autotune.report.pick; a rank's `settle` in trial/worker is another matter)."""
    trees = {**_trees(SEARCH), **_trees(SRC / "tuning"), **_trees(SRC / "report")}
    defined = sorted(
        f"{path.relative_to(SRC)} {node.name}"
        for path, tree in trees.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name in {"decide", "settle", "simplicity"}
    )
    assert defined == [
        "search/pick_decision.py decide",
        "search/pick_decision.py settle",
        "search/relations.py simplicity",
    ]


def _search():
    machine = LinearMachine(memory_bytes=16 * GIB)
    return mode_search(machine, LinearMemory(), {}, [Rung.Z3])


def test_the_collaborators_share_the_searchs_one_state() -> None:
    search = _search()
    assert search.ladder.state is search.state
    assert search.mode_walk.state is search.state and search.mode_walk.ladder is search.ladder
    assert search.pick.state is search.state and search.pick.ladder is search.ladder
    assert search.outcome is search.state.outcome and search.limit_bytes == search.state.limit_bytes


def test_a_field_set_before_the_walk_starts_is_the_one_it_uses() -> None:
    """The state is built at first use: a test that swaps a field after construction (as test_search_modes does
    with `modes` and `memory`) walks with the new one."""
    search = _search()
    search.limits = SearchLimits(max_trials=0)
    outcome = search.run_search()
    assert not outcome.trials and outcome.stop_reason is StopReason.TRIAL_BUDGET


def _record(candidate: Candidate, step_s: float) -> TrialRecord:
    result = TrialResult(status="ok", samples_per_s=8 / step_s, step_times_s=[step_s * (1 + i / 100) for i in range(9)])
    return TrialRecord(candidate, result, 0, 16 * GIB)


def test_set_pick_keeps_the_verdicts_margin_and_spread_and_a_drop_clears_them() -> None:
    state = _search().state
    fast, slow = _record(Candidate(Rung.Z3, 4, False), 1.0), _record(Candidate(Rung.Z3, 2, False), 2.0)
    speeds = {r.candidate: speed_of(r.result.step_times_s, r.result.samples_per_s) for r in (fast, slow)}
    verdict = decide({c: s for c, s in speeds.items() if s is not None})
    assert verdict is not None and verdict.pick == fast.candidate
    state.set_pick(fast, verdict)
    outcome = state.outcome
    assert (outcome.best, outcome.verdict, outcome.margin, outcome.noise) == (
        fast,
        verdict,
        verdict.margin,
        verdict.spread,
    )
    assert outcome.margin is not None and outcome.margin > 0.9
    state.set_pick(None)
    assert (outcome.best, outcome.verdict, outcome.margin, outcome.noise) == (None, None, None, None)


def test_consider_best_keeps_the_fastest_fit_and_no_verdict() -> None:
    state = _search().state
    slow, fast = _record(Candidate(Rung.Z3, 2, False), 2.0), _record(Candidate(Rung.Z3, 4, False), 1.0)
    for record in (slow, fast, slow):
        state.consider_best(record)
    assert state.outcome.best is fast and state.outcome.verdict is None

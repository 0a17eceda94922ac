"""A search run against the clock the simulator advances: the default time budget (issue 45) on simulated walls.

`autotune tune` bounds its search with `--time-budget` (by default only on the CPU since commit 1abdede:
request/tune_request.py with_tune_time_budget, CPU_TUNE_TIME_BUDGET_S; a GPU tune has one only when given): it counts
from the first op load (tuner.py: the deadline is set before the launchers start), the search launches no trial once the
budget is spent (search/walk.py `_budget_spent`, against the `clock` the Search is given), and a trial still running at
the deadline is stopped there: its timeout is at most the time left (tuning/trials.py budgeted_spec, at least 1 s), and
it ends as a timeout marked TIME_BUDGET_CUT. The pick's fresh confirmation is outside the budget (tuning/trials.py:
`launch(confirm, ..., budgeted=False)`), so a tune ends at most one confirmation after the deadline. The hook keeps no
budget unless given one (cli/hook.py: TuneRequest's default None).

`ClockedTrials` runs the search's trials on a `SimulatedCluster` as a launcher would and advances a `SimClock` by
each trial's simulated wall (gpu_sim/scale.py launch_costs: start-up, a fresh or warm build, the steps), so the
Search's own budget check and the trials' cut see the same time. The machine's op builds happen before the budget
counts, so none are charged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autotune.core.ladder import Candidate
from autotune.search.records import TIME_BUDGET_CUT
from autotune.trial.trial_types import TrialResult
from gpu_sim.machine import Launcher, SimulatedCluster
from gpu_sim.scale import LaunchCosts, launch_costs

BUDGETED_TRIAL_MIN_S = 1.0  # tuning/trials.py budgeted_spec: `left = max(1.0, deadline - time.monotonic())`


@dataclass
class SimClock:
    """Seconds since the budget started counting; the Search's `clock`."""

    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class TrialEvent:
    """One trial as the clock saw it: whether it started a process (a launch), ran fresh (the confirmation), was
    stopped at the deadline, and the seconds it took (start-up and build included where it paid them)."""

    candidate: Candidate
    new_process: bool
    fresh: bool
    cut: bool
    seconds: float
    steps_s: float
    confirmation: bool = False


@dataclass
class ClockedTrials:
    """`run` (the search's trials under `launcher`) and `run_fresh` (the pick's confirmation, never cut) for a
    Search, on `machine`, advancing `clock`. A warm worker runs trial after trial until one fails or is cut (then a
    new process starts), and a fresh confirmation stops the pool (trial/launch/warm.py FreshAfterWarm): as
    `SimulatedCluster.launches` groups them. `deadline_s`: the time budget, None for none."""

    machine: SimulatedCluster
    launcher: Launcher
    clock: SimClock
    deadline_s: float | None = None
    events: list[TrialEvent] = field(default_factory=list)
    _process_up: bool = False

    @property
    def costs(self) -> LaunchCosts:
        return launch_costs(self.machine)

    def run(self, candidate: Candidate) -> tuple[TrialResult, bool]:
        warm = self.launcher is not Launcher.FRESH
        return self._trial(candidate, fresh=not warm, budgeted=True), False

    def run_fresh(self, candidate: Candidate) -> tuple[TrialResult, bool]:
        return self._trial(candidate, fresh=True, budgeted=False), False

    def _trial(self, candidate: Candidate, *, fresh: bool, budgeted: bool) -> TrialResult:
        new_process = fresh or not self._process_up
        costs = self.costs
        start = costs.fresh_trial_s if new_process else costs.warm_build_s
        confirmation = not budgeted  # the pick's fresh confirmation (TuneContext.confirmation_spec)
        steps = self.machine.steps_seconds(candidate, confirmation=confirmation, first_in_process=new_process)
        seconds = start + steps
        left = None if self.deadline_s is None or not budgeted else self.deadline_s - self.clock.now
        cut = left is not None and seconds > max(BUDGETED_TRIAL_MIN_S, left)
        if cut:
            seconds = max(BUDGETED_TRIAL_MIN_S, left or 0.0)
            steps = max(0.0, seconds - start)
            result = TrialResult(status="timeout", error=f"{TIME_BUDGET_CUT} ({self.deadline_s:.0f} s)")
        else:
            if confirmation:  # a fresh run as SimulatedCluster.run_fresh records and answers it
                self.machine.fresh_runs.add(len(self.machine.launched))
            self.machine.launched.append(candidate)
            result = self.machine.trial_result(candidate, fresh=confirmation, first_in_process=new_process)
        self.clock.now += seconds
        self.events.append(TrialEvent(candidate, new_process, fresh, cut, seconds, steps, confirmation))
        # a trial that stopped itself over the limit after warm-up leaves its worker up (trial/launch/warm.py)
        self._process_up = not fresh and (result.ok or result.status == "over_budget")
        return result

    @property
    def launches(self) -> int:
        """Processes started: every fresh trial, and each warm launch."""
        return sum(event.new_process for event in self.events)

    @property
    def cut(self) -> Candidate | None:
        return next((event.candidate for event in self.events if event.cut), None)

    def figures(self) -> dict:
        """Launches, trials, wall (of it, steps and the confirmation), the trial the deadline stopped."""
        confirmation = sum(
            event.seconds for event in self.events if event.fresh and self.launcher is not Launcher.FRESH
        )
        return {
            "launches": self.launches,
            "trials": len(self.events),
            "simulated_wall_s": round(self.clock.now, 1),
            "steps_s": round(sum(event.steps_s for event in self.events), 1),
            "confirmation_s": round(confirmation, 1),
            "cut_at_deadline": self.cut.key if self.cut else None,
            "first_trial_s": round(self.events[0].seconds, 1) if self.events else None,
            "seconds_by_part": self.breakdown(),
        }

    def breakdown(self) -> dict[str, float]:
        """Where the wall went: start-up and builds, then the steps by part (a cut or failed trial's steps apart; a
        trial stopped over the limit after its warm-up, its warm-up alone)."""
        parts = {"start-up and builds": 0.0, "warmup": 0.0, "measured": 0.0, "parts": 0.0, "cut or failed": 0.0}
        for event in self.events:
            parts["start-up and builds"] += event.seconds - event.steps_s
            if event.cut or not self.machine.result(event.candidate).ok:
                parts["cut or failed"] += event.steps_s
                continue
            spent = self.machine.steps_breakdown(event.candidate, confirmation=event.confirmation)
            if self.machine.stops_over(event.candidate, fresh=event.confirmation or event.new_process):
                spent = {"warmup": spent["warmup"]}
            for name, seconds in spent.items():
                parts[name] += seconds
        return {name: round(seconds, 1) for name, seconds in parts.items()}

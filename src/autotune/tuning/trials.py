"""The search's trials for one tuning context: which launcher runs them (the caller's, the user's own command,
warm workers or a fresh process each), DeepSpeed's ops loaded before the first trial that needs them, an
inconclusive trial run once more, a verdict seen only in a warm worker run once fresh before it is used or cached,
and cached trials believed only where the hardware could have produced them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace

from autotune.core.choices import Device
from autotune.core.ladder import Candidate
from autotune.core.stop import StopReason
from autotune.core.units import format_bytes
from autotune.errors import UserError
from autotune.infra.terminate import Terminated
from autotune.request.context import TuneContext
from autotune.request.tune_request import TuneRequest
from autotune.search.cache import ResultsCache
from autotune.search.records import TIME_BUDGET_CUT, SearchEvent, SearchOutcome, TrialRecord
from autotune.trial.launch.chooser import JobFacts, TrialLaunchers, open_launchers
from autotune.trial.plausible import Bounds
from autotune.trial.trial_types import DETERMINISTIC_STATUSES, TrialLauncher, TrialResult, TrialSpec
from autotune.tuning.for_context import context_search

log = logging.getLogger(__name__)


class TrialOps:
    """DeepSpeed's JIT ops, loaded before the first trial that needs them, in a child with the trials'
    interpreter and environment (building there if needed), so no trial timeout absorbs a build or a stale
    build lock. CPU Adam waits for the first optimizer-offload trial: a search that never offloads (the README
    demo) never builds it; a build never runs beside a trial, whose speed it would slow."""

    def __init__(self, device: str, observe: Callable[[SearchEvent], None]) -> None:
        self.device = device
        self.observe = observe
        self.ready: set[str] = set()

    def before(self, candidate: Candidate | None = None) -> None:
        from autotune.trial.launch.ops import ensure_ops_ready, extensions_dir, ops_built, ops_for

        offload = candidate is not None and candidate.rung.offload_optimizer is not None
        names = tuple(name for name in ops_for(self.device, offload) if name not in self.ready)
        if not names:
            return
        self.observe(SearchEvent("prepare", message=ops_line(names, ops_built(self.device, names), extensions_dir())))
        try:
            ensure_ops_ready(self.device, report=self._say, names=names)
        except (RuntimeError, OSError) as error:
            raise UserError(str(error)) from None
        self.ready.update(names)

    def pending(self) -> tuple[str, ...]:
        """The ops the first trial loads that are not built here yet (CPU Adam waits for an offload trial)."""
        from autotune.trial.launch.ops import ops_built, ops_for

        return tuple(name for name in ops_for(self.device, False) if not ops_built(self.device, (name,)))

    def _say(self, message: str) -> None:
        self.observe(SearchEvent("prepare", message=message))


def ops_line(names: tuple[str, ...], built: bool, where: object) -> str:
    """The line said before every op load, since any may compile: built files are not enough, torch rebuilds an op
    whose sources, flags or torch version differ from its build's (trial/launch/ops.py), which takes minutes."""
    what = ", ".join(names)
    if not built:
        return f"building DeepSpeed ops once, in parallel: {what} (minutes; cached in {where})"
    return (
        f"loading DeepSpeed ops {what} from {where} (seconds; minutes if torch rebuilds them because their sources,"
        " flags or torch version changed)"
    )


@contextlib.contextmanager
def launcher_for(
    request: TuneRequest,
    given: TrialLauncher | TrialLaunchers | JobFacts | None,
    observe: Callable[[SearchEvent], None] | None = None,
    environ: Mapping[str, str] | None = None,
    which: Callable[[str], str | None] = shutil.which,
) -> Iterator[TrialLaunchers]:
    """The caller's launcher (with its fresh-process confirmer, if it brings one), else the one chooser's
    (trial/launch/chooser.py) from the job's facts: the hook's when it gives them, else this request's and this
    process's
    environment."""
    if isinstance(given, TrialLaunchers):
        yield given
        return
    if given is not None and not isinstance(given, JobFacts):
        yield TrialLaunchers(given)
        return
    facts = given or request_facts(request, os.environ if environ is None else environ)
    with open_launchers(facts, which=which, on_replace=_replaced_note(observe)) as chosen:
        yield chosen


def request_facts(request: TuneRequest, environ: Mapping[str, str]) -> JobFacts:
    """The job facts `autotune tune` knows: its request, and SLURM, torchrun and MASTER_PORT from its environment."""
    return JobFacts.of_process(
        environ,
        nodes=request.hardware.nodes,
        device=request.hardware.device,
        trial_workers=request.search.trial_workers,
        command=request.training.command,
        consumer=request.training.consumer,
    )


def _replaced_note(observe: Callable[[SearchEvent], None] | None) -> Callable[[int, str], None] | None:
    """The progress line for warm workers the pool replaced because their memory grew (trial/launch/warm.py)."""
    if observe is None:
        return None

    def note(grown: int, what: str) -> None:
        if what.startswith("ZeRO++"):  # a count, not bytes (trial/launch/warm.py _WATCHED)
            why = f"the last ones still held {grown} {what} of their trial, which DeepSpeed's next hpZ build refuses"
        else:
            why = f"the last ones' {what} grew {format_bytes(grown)} since their first trial, which the next trial"
            why += " would have measured on top of its own"
        observe(SearchEvent("prepare", message=f"new trial workers: {why}"))

    return note


def search_with_trials(
    ctx: TuneContext,
    cache: ResultsCache | None,
    launchers: TrialLaunchers,
    observe: Callable[[SearchEvent], None],
    ops: TrialOps | None = None,
    deadline: float | None = None,
) -> SearchOutcome:
    """The search with real trials: cached ones believed where plausible, the rest run by `launchers.trials`; the
    pick's fresh-process confirmation (where there is one) always runs, and replaces the cached trial.

    `deadline` (time.monotonic()): where --time-budget ends. The search launches no trial after it, and a trial
    still running there is stopped (its timeout is at most the time left), so the tune ends within its budget."""
    key = ctx.key
    bounds = run_bounds(ctx)
    cached = believed_trials(cache, key, bounds, ctx.limit_bytes) if cache else {}

    def launch(
        launcher: TrialLauncher, candidate: Candidate, budgeted: bool = True, confirmation: bool = False
    ) -> tuple[TrialResult, bool]:
        if ops is not None:
            ops.before(candidate)
        full = ctx.confirmation_spec(candidate) if confirmation else ctx.spec(candidate)
        spec, cut = budgeted_spec(full, deadline if budgeted else None)
        result = retried_trial(launcher, spec, observe, candidate, bounds=bounds)
        fresh = launchers.confirm if launcher is launchers.trials else None
        if fresh is not None and (why := warm_only_doubt(ctx, candidate, result)):
            note = f"{why} in a warm worker: running it once in a fresh process before believing it"
            observe(SearchEvent("prepare", candidate, message=note))
            result = retried_trial(fresh, spec, observe, candidate, bounds=bounds)
        if cut and result.status == "timeout":  # not the candidate's: never cached (timeouts are not)
            result = replace(result, error=f"{TIME_BUDGET_CUT} ({ctx.request.search.time_budget_s:.0f} s)")
        if cache and result.status in DETERMINISTIC_STATUSES:  # what a rerun would give again, nothing else
            cache.put_trial(key, candidate, result)
        return result, False

    def run(candidate: Candidate) -> tuple[TrialResult, bool]:
        if candidate in cached:
            return cached[candidate], True
        return launch(launchers.trials, candidate)

    confirm = launchers.confirm
    # the pick's fresh confirmation is outside the budget (Pick.confirm_fresh): not cut by it either, and it times
    # no second point (TuneContext.confirmation_spec)
    confirm_fresh = (
        None if confirm is None else (lambda candidate: launch(confirm, candidate, budgeted=False, confirmation=True))
    )
    left = None if deadline is None else max(0.0, deadline - time.monotonic())
    search = context_search(ctx, run, observe, confirm_fresh, time_left_s=left)
    try:
        return search.run_search()
    except Terminated as stopped:
        raise SearchTerminated(search.outcome, signum=stopped.signum) from None


class SearchTerminated(Terminated):
    """SIGTERM mid-search, carrying what the search had measured by then: the tuner writes every file a finished
    tune writes from its best verified trial, marked as stopped (tuner.py), before the process exits."""

    def __init__(self, outcome: SearchOutcome, *, signum: int = signal.SIGTERM) -> None:
        super().__init__(signum=signum)
        outcome.stop_reason = StopReason.TERMINATED
        outcome.stop_message = f"{self.stopped_by}: the best config verified so far, not the search's end"
        self.outcome = outcome


def budgeted_spec(spec: TrialSpec, deadline: float | None) -> tuple[TrialSpec, bool]:
    """The trial's spec with its timeout no later than the deadline, and whether the deadline shortened it."""
    if deadline is None:
        return spec, False
    left = max(1.0, deadline - time.monotonic())
    if left >= spec.timeout_s:
        return spec, False
    return replace(spec, timeout_s=left), True


def expected_line(ctx: TuneContext, ops: TrialOps | None, budget_trials: int) -> str:
    """Before the first trial, the expected total: how many trials at most and the time budget that bounds them, the
    op builds ahead of them, and what each trial is made of. No trial's time is predicted here: nothing in this
    machine's step time is known before one runs (the memory model predicts bytes, not seconds); the progress line
    gives the measured estimate from the first trial on (cli/tune.py TrialProgress.eta). `budget_trials`: the
    search's trial budget, resolved once by the tuner (tuning/for_context.py trial_budget)."""
    from autotune.core.measurement import MAX_MEASURE_S, MAX_STEPS, MIN_STEPS

    request = ctx.request
    trials = min(budget_trials, len(ctx.rungs) * 2 * len(ctx.grid))
    given = request.search.max_trials is not None
    said = (
        f"--max-trials {budget_trials}" if given else f"--max-trials: {budget_trials}, two per group and 5 for the pick"
    )
    space = (
        f"{len(ctx.rungs)} rung(s), with and without checkpointing, micro-batches {ctx.grid[0]}-{ctx.grid[-1]}"
        if ctx.grid
        else f"{len(ctx.rungs)} rung(s)"
    )
    pending = ops.pending() if ops is not None else ()
    builds = (
        f"; before them DeepSpeed's one-time op builds {', '.join(pending)} (minutes, once per machine; outside the"
        " budget)"
        if pending
        else ""
    )
    budget = request.search.time_budget_s
    bound = (
        f"in at most {budget / 60:.0f} min (the time budget, --time-budget: no trial starts after it and one still"
        " running then is stopped)"
        if budget is not None
        else "with no time budget (--time-budget): each trial's start line gives the expected time of the rest"
    )
    return (
        f"expect at most {trials} trials ({said}) over {space}, {bound}{builds}; each"
        f" trial a process start, warm-up steps and {MIN_STEPS}-{MAX_STEPS} measured steps (at most"
        f" {MAX_MEASURE_S:.0f} s of them)"
    )


# Verdicts a warm worker may owe to an earlier trial's leftovers (pinned host blocks, a cached segment, a kernel
# module): each would drop a candidate, or host-side a whole rung (search/ladder_walk.py), and be cached, so where
# a fresh process is at hand (the GPU default) it has the last word. A GPU out-of-memory is not among them: the
# pick's fresh confirmation already catches a fit a warm worker got wrong the other way, and leftovers only add.
WARM_DOUBTED_STATUSES = ("error", "oom_host")


def warm_only_doubt(ctx: TuneContext, candidate: Candidate, result: TrialResult) -> str | None:
    """Why a warm trial's verdict needs a fresh process before it is used: an error, a host OOM, or a host peak over
    the host headroom (the walk's own test, search/records.py TrialRecord.over_host_headroom); None: believed."""
    if result.status in WARM_DOUBTED_STATUSES:
        return f"{result.status} ({result.error})"
    host_ram = ctx.target.host_ram_bytes
    if not result.ok or ctx.request.hardware.device == "cpu" or not host_ram:
        return None
    host_limit = int(ctx.request.search.headroom * host_ram)
    record = TrialRecord(
        candidate, result, 0, 0, from_cache=False, host_limit_bytes=host_limit, gpus_per_node=ctx.target.gpus_per_node
    )
    if record.over_host_headroom:
        return f"host RAM peak {format_bytes(record.host_peak_bytes or 0)} over {format_bytes(host_limit)}"
    return None


def run_bounds(ctx: TuneContext) -> Bounds:
    """What this run's hardware and model allow a trial to measure (trial/plausible.py)."""
    device: Device = "cpu" if ctx.request.hardware.device == "cpu" else "cuda"
    peak_tflops = ctx.target.gpu.peak_tflops(ctx.precision)
    tokens_per_sample = (
        1 if ctx.request.training.command is not None else ctx.seq_len
    )  # the user's command: its own data
    return Bounds.for_run(
        ctx.model.total_params, ctx.target.world_size, device, peak_tflops, tokens_per_sample=tokens_per_sample
    )


def believed_trials(cache: ResultsCache, key: str, bounds: Bounds, limit_bytes: int) -> dict[Candidate, TrialResult]:
    """The cached trials of this run whose figures the hardware could have produced, and whose verdict holds at this
    run's limit; the others are deleted. A run key covers a bucket of limits (request/context.py limit_bucket), and a
    trial stopped over its run's limit (over_budget) with a peak within this one's says nothing here."""
    kept = {}
    for candidate, result in cache.trials(key).items():
        if why := bounds.why_implausible(candidate, result):
            log.warning("autotune: dropped cached trial %s as corrupt: %s; measuring it again", candidate.key, why)
            cache.forget_trial(key, candidate)
        elif result.status == "over_budget" and (result.peak_memory_bytes or 0) <= limit_bytes:
            cache.forget_trial(key, candidate)  # stopped at another run's lower limit: measured again at this one
        else:
            kept[candidate] = result
    return kept


def retried_trial(
    launcher: TrialLauncher,
    spec: TrialSpec,
    observe: Callable[[SearchEvent], None],
    candidate: Candidate,
    bounds: Bounds | None = None,
) -> TrialResult:
    """One trial; an inconclusive failure (a signal from outside, a crash, the network or the file system: nothing
    about the candidate), or a figure the hardware cannot produce, is run once more, and if it fails the same way
    again it stays inconclusive (never cached, never a memory fact)."""
    result = _checked(launcher.run(spec), candidate, bounds)
    if result.status != "inconclusive":
        return result
    why = f"trial {candidate.key} inconclusive ({result.error}); running it once more"
    observe(SearchEvent("prepare", candidate, message=why))
    return _checked(launcher.run(spec), candidate, bounds)


def _checked(result: TrialResult, candidate: Candidate, bounds: Bounds | None) -> TrialResult:
    why = bounds.why_implausible(candidate, result) if bounds else None
    return replace(result, status="inconclusive", error=f"implausible measurement: {why}") if why else result

"""The search's trials for one tuning context: which launcher runs them (the caller's, the user's own command,
warm workers or a fresh process each), DeepSpeed's ops loaded before the first trial that needs them, an
inconclusive trial run once more, and cached trials believed only where the hardware could have produced them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace

from autotune.core.choices import Device
from autotune.core.ladder import Candidate
from autotune.core.units import format_bytes
from autotune.errors import UserError
from autotune.request.context import TuneContext
from autotune.request.tune_request import TuneRequest
from autotune.search.cache import ResultsCache
from autotune.search.for_context import context_search
from autotune.search.records import SearchEvent, SearchOutcome
from autotune.trial.chooser import JobFacts, TrialLaunchers, open_launchers
from autotune.trial.plausible import Bounds
from autotune.trial.types import DETERMINISTIC_STATUSES, TrialLauncher, TrialResult, TrialSpec

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
        from autotune.trial.ops import ensure_ops_ready, extensions_dir, ops_built, ops_for

        offload = candidate is not None and candidate.rung.offload_optimizer is not None
        names = tuple(name for name in ops_for(self.device, offload) if name not in self.ready)
        if not names:
            return
        if not ops_built(self.device, names):
            where = f"cached in {extensions_dir()}, TORCH_EXTENSIONS_DIR"
            what = ", ".join(names)
            self.observe(SearchEvent("prepare", message=f"building DeepSpeed ops once, in parallel: {what} ({where})"))
        try:
            ensure_ops_ready(self.device, report=self._say, names=names)
        except (RuntimeError, OSError) as error:
            raise UserError(str(error)) from None
        self.ready.update(names)

    def _say(self, message: str) -> None:
        self.observe(SearchEvent("prepare", message=message))


@contextlib.contextmanager
def launcher_for(
    request: TuneRequest,
    given: TrialLauncher | TrialLaunchers | JobFacts | None,
    observe: Callable[[SearchEvent], None] | None = None,
    environ: Mapping[str, str] | None = None,
    which: Callable[[str], str | None] = shutil.which,
) -> Iterator[TrialLaunchers]:
    """The caller's launcher (with its fresh-process confirmer, if it brings one), else the one chooser's
    (trial/chooser.py) from the job's facts: the hook's when it gives them, else this request's and this process's
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
        nodes=request.nodes,
        device=request.device,
        trial_workers=request.trial_workers,
        command=request.command,
    )


def _replaced_note(observe: Callable[[SearchEvent], None] | None) -> Callable[[int, str], None] | None:
    """The progress line for warm workers the pool replaced because their memory grew (trial/warm.py)."""
    if observe is None:
        return None

    def note(grown: int, what: str) -> None:
        observe(
            SearchEvent(
                "prepare",
                message=f"new trial workers: the last ones' {what} grew {format_bytes(grown)} since their first trial,"
                " which the next trial would have measured on top of its own",
            )
        )

    return note


def search_with_trials(
    ctx: TuneContext,
    cache: ResultsCache | None,
    launchers: TrialLaunchers,
    observe: Callable[[SearchEvent], None],
    ops: TrialOps | None = None,
) -> SearchOutcome:
    """The search with real trials: cached ones believed where plausible, the rest run by `launchers.trials`; the
    pick's fresh-process confirmation (where there is one) always runs, and replaces the cached trial."""
    key = ctx.key
    bounds = run_bounds(ctx)
    cached = believed_trials(cache, key, bounds) if cache else {}

    def launch(launcher: TrialLauncher, candidate: Candidate) -> tuple[TrialResult, bool]:
        if ops is not None:
            ops.before(candidate)
        result = retried_trial(launcher, ctx.spec(candidate), observe, candidate, bounds=bounds)
        if cache and result.status in DETERMINISTIC_STATUSES:  # what a rerun would give again, nothing else
            cache.put_trial(key, candidate, result)
        return result, False

    def run(candidate: Candidate) -> tuple[TrialResult, bool]:
        if candidate in cached:
            return cached[candidate], True
        return launch(launchers.trials, candidate)

    confirm = launchers.confirm
    confirm_fresh = None if confirm is None else (lambda candidate: launch(confirm, candidate))
    return context_search(ctx, run, observe, confirm_fresh).run_search()


def run_bounds(ctx: TuneContext) -> Bounds:
    """What this run's hardware and model allow a trial to measure (trial/plausible.py)."""
    device: Device = "cpu" if ctx.request.device == "cpu" else "cuda"
    peak_tflops = ctx.target.gpu.peak_tflops(ctx.precision)
    return Bounds.for_run(ctx.model.total_params, ctx.target.world_size, device, peak_tflops)


def believed_trials(cache: ResultsCache, key: str, bounds: Bounds) -> dict[Candidate, TrialResult]:
    """The cached trials of this run whose figures the hardware could have produced; the others are deleted."""
    kept = {}
    for candidate, result in cache.trials(key).items():
        if why := bounds.why_implausible(candidate, result):
            log.warning("autotune: dropped cached trial %s as corrupt: %s; measuring it again", candidate.key, why)
            cache.forget_trial(key, candidate)
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

"""The search's trials for one tuning context: which launcher runs them (the caller's, the user's own command,
warm workers or a fresh process each), DeepSpeed's ops loaded before the first trial that needs them, an
inconclusive trial run once more, and cached trials believed only where the hardware could have produced them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from autotune.core.choices import Device
from autotune.core.ladder import Candidate
from autotune.core.units import format_bytes
from autotune.errors import UserError
from autotune.request.context import TuneContext
from autotune.request.tune_request import TuneRequest, confirms_pick_in_fresh_process, uses_warm_workers
from autotune.search.cache import ResultsCache
from autotune.search.for_context import context_search
from autotune.search.records import SearchEvent, SearchOutcome
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


@dataclass(frozen=True)
class TrialLaunchers:
    """Where the search's trials run, and where those are warm workers no fresh process has been compared with
    (GPUs), the launcher that confirms the pick in a process of its own (Search.confirm_fresh)."""

    trials: TrialLauncher
    confirm: TrialLauncher | None = None

    @property
    def process_starts(self) -> int | None:
        """Processes started for the trials where warm workers ran several in one; None: one per trial."""
        starts = getattr(self.trials, "restarts", None)
        if starts is None:
            return None
        return starts + getattr(self.confirm, "launches", 0)


@contextlib.contextmanager
def launcher_for(
    request: TuneRequest,
    given: TrialLauncher | TrialLaunchers | None,
    observe: Callable[[SearchEvent], None] | None = None,
) -> Iterator[TrialLaunchers]:
    """The caller's launcher (with its fresh-process confirmer, if it brings one), else warm workers (start-up paid
    once; on GPUs with the pick confirmed in a fresh process, request.confirms_pick_in_fresh_process) or a fresh
    process per trial (`--trial-workers fresh`). Several nodes: srun inside a SLURM allocation, else one launcher
    per node with a chosen master port."""
    device, nodes = request.device, request.nodes
    if given is not None:
        yield given if isinstance(given, TrialLaunchers) else TrialLaunchers(given)
        return
    from autotune.trial import FreshAfterWarm, LocalLauncher, WarmWorkerPool

    if nodes > 1:
        from autotune.trial.nodes import LocalNodesLauncher, in_slurm_allocation

        if in_slurm_allocation():
            from autotune.trial import SlurmLauncher

            yield TrialLaunchers(SlurmLauncher())
        else:
            yield TrialLaunchers(
                LocalNodesLauncher(env={"MALLOC_MMAP_THRESHOLD_": "65536"} if device == "cpu" else None)
            )
        return

    # glibc keeps freed arenas; returning large frees to the OS makes peak RSS the working set the memory
    # model predicts (about 20% lower than default glibc on CPU trials; benchmarks/results/estimate.md).
    env = {"MALLOC_MMAP_THRESHOLD_": "65536"} if device == "cpu" else None
    if not uses_warm_workers(request):
        yield TrialLaunchers(LocalLauncher(env=env))
        return
    with WarmWorkerPool(env=env, on_replace=_replaced_note(observe)) as pool:
        confirm = FreshAfterWarm(pool, LocalLauncher(env=env)) if confirms_pick_in_fresh_process(request) else None
        yield TrialLaunchers(pool, confirm)


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


def script_launcher(request: TuneRequest) -> TrialLauncher | None:
    """Own-command mode: every trial runs the user's launch command (trial/script.py)."""
    if request.command is None:
        return None
    from autotune.trial.script import ScriptLauncher
    from autotune.trial.script_command import parse_command

    return ScriptLauncher(parse_command(request.command, consumer=request.consumer))


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
        result = run_trial(launcher, ctx.spec(candidate), observe, candidate, bounds)
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


def run_trial(
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

"""`run_hook()`: the pre-launch hook. Read the job, agree on one tuner, and give every rank the same config.

Every process of a job may call this at once (once per node, or once per rank). All derive the same
run key from the model, the job's shape and the tuning options; one of them tunes (see
coordinate.py) and the rest copy its published config, checked against its sha256, to their own
--out. A later job with the same key on the same hardware reads the published result and is done.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from autotune.core.versions import library_versions
from autotune.errors import NothingFitsError, UserError
from autotune.hook.coordinate import (
    Coordinated,
    HookError,
    HookRecord,
    LockUnavailable,
    Role,
    SharedSlot,
    coordinate,
)
from autotune.hook.env import JobEnv, JobOverrides, detect_job_env
from autotune.hook.leader import LeaderJob, TuneFn, real_tune, tune_and_record
from autotune.hook.outputs import write_outputs
from autotune.hook.progress import ProgressNote, waiting_line
from autotune.hook.trial_facts import choose_launcher
from autotune.hook.verdicts import KnownValid, default_verdicts_path, verdict_key
from autotune.infra.atomic import atomic_write_text
from autotune.infra.paths import cache_dir
from autotune.infra.terminate import Terminated
from autotune.request.cache_keys import run_key
from autotune.request.tune_request import section_flat_names

if TYPE_CHECKING:
    from autotune.hardware.machine_probe import GpuInfo
    from autotune.request.tune_request import TuneRequest
    from autotune.search.records import SearchEvent
    from autotune.trial.launch.chooser import JobFacts
    from autotune.trial.trial_types import TrialLauncher

# the job, the tuning, the shared dir, the environment -> the job's facts for tune's one chooser (or a test's launcher)
LauncherChooser = Callable[[JobEnv, "TuneRequest", Path, Mapping[str, str]], "TrialLauncher | JobFacts | None"]
GpuProber = Callable[[], "list[GpuInfo]"]
# TuneRequest fields (flat names) that describe the job or where output goes, not what is tuned: left out of the key.
# The whole output section (request/asks.py), the model (its content is hashed instead), the job's own shape, and the
# script its own launch line runs.
_NOT_IN_KEY = (*section_flat_names("output"), "model", "gpus", "nodes", "script")


@dataclass(frozen=True)
class HookRequest:
    tuning: TuneRequest  # model and tuning options; ranks, nodes and cache are filled in from the job
    shared_dir: str | None = None  # shared by every node; default: the autotune cache dir
    overrides: JobOverrides = field(default_factory=JobOverrides)
    wait_timeout_s: float | None = None  # default: an hour, or twice the time budget plus 10 minutes
    strict: bool = False  # a fallback config (tuning failed or cut short) fails the hook instead
    poll_interval_s: float = 0.2

    @property
    def wait_timeout(self) -> float:
        if self.wait_timeout_s is not None:
            return self.wait_timeout_s
        budget = self.tuning.search.time_budget_s
        return max(3600.0, 2 * budget + 600) if budget else 3600.0


@dataclass(frozen=True)
class HookResult:
    role: Role  # "leader" tuned; "follower" waited for it; "hit" found a published result at once
    config_path: Path
    record: HookRecord
    job: JobEnv
    key: str
    waited_s: float
    elapsed_s: float
    ignored: str | None = None  # why a record found in the shared dir was not trusted
    report_path: Path | None = None  # autotune-report.md, when the tuning left one

    @property
    def fallback(self) -> bool:
        return self.record.status == "fallback"

    def to_dict(self) -> dict:
        record = self.record
        return {
            "role": self.role,
            "config_path": str(self.config_path),
            "sha256": record.config_sha256,
            "status": record.status,
            "source": record.source,
            "verified": record.verified,
            "warning": record.warning,
            "tuned_by": record.leader,
            "key": self.key,
            "job": self.job.to_dict(),
            "waited_s": round(self.waited_s, 3),
            "elapsed_s": round(self.elapsed_s, 3),
            "ignored_record": self.ignored,
            "report_path": str(self.report_path) if self.report_path else None,
            "details": {k: v for k, v in record.details.items() if k != "outputs"},  # outputs: the files written
        }


def _default_gpus() -> list[GpuInfo]:
    from autotune.hardware.machine_probe import probe_gpus

    return probe_gpus()[0]


def hardware_fingerprint(tuning: TuneRequest, gpus: list[GpuInfo]) -> str:
    """What a published config was tuned on; a later job on other hardware re-tunes instead of reusing it."""
    if tuning.hardware.device == "cpu":
        return f"cpu {platform.machine()} budget {tuning.hardware.memory_budget or 'all'}"
    return "; ".join(sorted(f"{g.name} {g.total_bytes}" for g in gpus)) or "no gpu"


def job_key(tuning: TuneRequest, job: JobEnv) -> str:
    """Same on every rank of a job: the model's content, the job's shape, the tuning options, the versions."""
    from autotune.models import resolve_model

    source = resolve_model(tuning.model.name, tuning.model.trust_remote_code)
    model = json.dumps({"config": source.config, "architecture": source.architecture}, sort_keys=True)
    options = {k: v for k, v in tuning.flat_values().items() if k not in _NOT_IN_KEY}
    return run_key(
        {
            "hook": 1,
            "model": hashlib.sha256(model.encode()).hexdigest(),
            "nodes": job.nodes,
            "ranks_per_node": job.gpus_per_node,
            "options": options,
            "versions": library_versions(),
        }
    )


def _acceptable(record: HookRecord, job: JobEnv, hardware: str, started_wall: float) -> bool:
    """A finished tuning serves any job on the same hardware; a fallback or failure only the job it ran
    for (same job id, or published after this process started), so the next job tries again."""
    same_job = job.job_id is not None and record.job_id == job.job_id
    if record.details.get("terminated"):  # a SIGTERMed tuning: a requeued job (same id) resumes tuning instead
        return record.created >= started_wall
    if record.status == "complete":
        return same_job or record.hardware == hardware
    return same_job or record.created >= started_wall


def _raise_failure(record: HookRecord, role: Role) -> NoReturn:
    prefix = "" if role == "leader" else f"the tuning process ({record.leader}) failed: "
    message = f"{prefix}{record.error}"
    if record.error_kind == "user":
        raise UserError(message)
    if record.error_kind == "nothing_fits":
        raise NothingFitsError(message)
    raise HookError(message)


def config_vetter(world_size: int, known: KnownValid) -> Callable[[HookRecord], str | None]:
    """DeepSpeed's parser at the job's world size, once per distinct config, for every record read back;
    a config this user already saw DeepSpeed accept (`known`, verdicts.py) is not parsed again."""
    verdicts: dict[str | None, str | None] = {}

    def vet(record: HookRecord) -> str | None:
        digest = record.config_sha256
        if digest not in verdicts:
            text = record.config_text or ""
            key = verdict_key(text, world_size)
            verdicts[digest] = None if key in known else _deepspeed_verdict(text, world_size)
            if verdicts[digest] is None:
                known.add(key)
        return verdicts[digest]

    return vet


def _deepspeed_verdict(config_text: str, world_size: int) -> str | None:
    from autotune.dsconfig.base_config import runnable
    from autotune.dsconfig.build_config import ConfigRejected, validate_with_deepspeed

    try:
        config = json.loads(config_text)
        if not isinstance(config, dict):
            return "its config is not a JSON object"
        validate_with_deepspeed(runnable(config, world_size), world_size)  # "auto" kept from a base: as HF fills it
    except UserError as error:
        return str(error)
    except ValueError as error:
        return f"its config is not JSON ({error})"
    except ConfigRejected as error:
        return f"DeepSpeed rejects its config at world size {world_size}: {error}"
    return None


def run_hook(
    request: HookRequest,
    *,
    environ: Mapping[str, str] | None = None,
    tune_fn: TuneFn = real_tune,
    launcher_chooser: LauncherChooser = choose_launcher,
    gpu_prober: GpuProber = _default_gpus,
    observe: Callable[[SearchEvent], None] = lambda event: None,
    say: Callable[[str], None] = lambda line: None,
    verdicts_path: Path | None = None,
) -> HookResult:
    """Give this process the job's config, and the files `tune` writes beside it, at `request.tuning.output.out`;
    raises UserError, NothingFitsError, HookError. `say` gets the waiting lines (a waiting process prints
    nothing else for as long as the tuning takes); `verdicts_path` defaults to verdicts.py's file."""
    started, started_wall = time.monotonic(), time.time()
    tuning = request.tuning
    gpus = gpu_prober() if tuning.hardware.device == "cuda" else []
    environ = os.environ if environ is None else environ
    job = detect_job_env(
        environ,
        request.overrides,
        device=tuning.hardware.device,
        visible_gpus=lambda: len(gpus),
    )
    shared = Path(request.shared_dir) if request.shared_dir else cache_dir()
    tuning = tuning.updated(
        gpus=job.gpus_per_node,
        nodes=job.nodes,
        cache_dir=str(shared),  # the results cache is results.sqlite in it, as for `autotune --cache-dir`
        report_dir=tuning.output.report_dir or str(Path(tuning.output.out).resolve().parent),
        trial_timeout_s=min(
            tuning.search.trial_timeout_s, tuning.search.time_budget_s or tuning.search.trial_timeout_s
        ),
    )
    key = job_key(tuning, job)
    hardware = hardware_fingerprint(tuning, gpus)
    slot = SharedSlot(shared / "hook", key)
    known = KnownValid(default_verdicts_path() if verdicts_path is None else verdicts_path)

    def produce() -> HookRecord:
        # Own-command mode too: the chooser's facts carry the command, and tune() runs it (trial/own_command/script.py).
        choose = lambda: launcher_chooser(job, tuning, shared, environ)  # noqa: E731
        publishing = ProgressNote(slot, tuning.search.max_trials, observe)
        leader = LeaderJob(key, job, hardware, tuning, launcher_factory=choose, observe=publishing, tune_fn=tune_fn)
        record = tune_and_record(leader, slot.directory / "staging")
        if record.config_text is not None and not record.details.get("terminated"):  # tune() validated it
            known.add(verdict_key(record.config_text, job.world_size))
        return record

    def produce_locally(why: LockUnavailable) -> Coordinated:
        """The shared directory cannot be coordinated in because of someone else: tune here, publish nothing and
        use no shared cache (as `tune` does with an untrusted cache), so the job still gets its config."""
        say(f"autotune hook: {why}; tuning locally, without the shared directory (nothing is published)")
        private = Path(tempfile.mkdtemp(prefix="autotune-hook-local-"))
        try:
            alone = tuning.updated(use_cache=False)
            leader = LeaderJob(
                key, job, hardware, alone, launcher_factory=lambda: None, observe=observe, tune_fn=tune_fn
            )
            return Coordinated(tune_and_record(leader, private), "leader", 0.0)
        finally:
            shutil.rmtree(private, ignore_errors=True)

    try:
        outcome = coordinate(
            slot,
            accept=lambda record: _acceptable(record, job, hardware, started_wall),
            produce=produce,
            wait_timeout_s=request.wait_timeout,
            poll_interval_s=request.poll_interval_s,
            vet=config_vetter(job.world_size, known),
            waiting=lambda waited_s: say(waiting_line(slot, job, waited_s)),
        )
    except LockUnavailable as unavailable:
        outcome = produce_locally(unavailable)
    record = outcome.record
    if record.status == "failed" or record.config_text is None:
        _raise_failure(record, outcome.role)
    if record.status == "fallback" and request.strict:
        raise HookError(f"--strict: no config written, because {record.warning}")
    try:
        path = atomic_write_text(request.tuning.output.out, record.config_text or "")
        report = write_outputs(
            record, tuning, job, path.resolve(), report_dir=Path(tuning.output.report_dir or path.parent)
        )
    except OSError as error:
        why = error.strerror or error
        raise UserError(f"cannot write {request.tuning.output.out} or the files beside it: {why}") from None
    if outcome.role == "leader" and record.details.get("terminated"):
        raise Terminated(f"{record.warning}, to {path} and the shared directory")
    return HookResult(
        outcome.role,
        path.resolve(),
        record,
        job,
        key=key,
        waited_s=outcome.waited_s,
        elapsed_s=time.monotonic() - started,
        ignored=outcome.ignored,
        report_path=report.resolve() if report else None,
    )

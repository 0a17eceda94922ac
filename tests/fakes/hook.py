"""A stand-in for `autotune.tune` as the hook calls it (`run_hook(..., tune_fn=...)`), so the hook's roles, shared
files, fallbacks and failures are tested in seconds; tests/test_hook_e2e.py runs the same paths with real trials."""

from __future__ import annotations

import json
import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path

from tests.fakes.reports import golden_report

from autotune.core.ladder import Candidate
from autotune.core.stop import StopReason
from autotune.hook import HookRequest
from autotune.hook.env import JobEnv
from autotune.hook.trial_facts import choose_launcher
from autotune.infra.atomic import atomic_write_json
from autotune.report.assumptions import write_assumptions
from autotune.search.records import SearchEvent, TrialRecord
from autotune.trial.launch.chooser import JobFacts
from autotune.trial.trial_types import RankMetrics, TrialLauncher, TrialResult
from autotune.tuner import TuneRequest, TuneResult

# Valid at any world size: every config read back from the shared dir is re-validated by DeepSpeed.
TUNED = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 2}}
PLANNED = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 3}}


class FakeTune:
    """Stands in for tune(): reports `trials` as verified (one `trial_end` event each), waits `delay_s`, then
    raises `error` or writes `config` (TUNED) with its assumptions file beside it, as tune() does. A request with
    `gpu_memory` set (the hook's plan-only fallback) gets PLANNED, unverified. Records every request and launcher.

    Not modelled: the search, the cache, real measurements; the report is the golden one with this request's model,
    sequence length, stop message and verification."""

    def __init__(
        self,
        config: dict | None = None,
        *,
        trials: tuple[Candidate, ...] = (),
        delay_s: float = 0.0,
        error: Exception | None = None,
        stop_reason: StopReason = StopReason.NO_BETTER,
    ) -> None:
        self.config = config or TUNED
        self.trials = trials
        self.delay_s = delay_s
        self.error = error
        self.stop_reason = stop_reason
        self.requests: list[TuneRequest] = []
        self.launchers: list[TrialLauncher | JobFacts | None] = []  # JobFacts: the hook's, for the one chooser

    def __call__(self, request: TuneRequest, launcher=None, observe=lambda event: None) -> TuneResult:
        self.requests.append(request)
        self.launchers.append(launcher)
        if request.hardware.gpu_memory is not None:  # the hook's plan-only fallback
            return self._finish(request, PLANNED, verified=False)
        for candidate in self.trials:
            result = TrialResult("ok", ranks=[RankMetrics(0, host_rss_peak_bytes=2**20)], samples_per_s=10.0)
            observe(SearchEvent("trial_end", candidate, "ok", TrialRecord(candidate, result, 2**20, 2**30)))
        time.sleep(self.delay_s)
        if self.error is not None:
            raise self.error
        return self._finish(request, self.config, verified=True)

    def _finish(self, request: TuneRequest, config: dict, verified: bool) -> TuneResult:
        path = atomic_write_json(request.output.out, config)
        message = "time budget spent (5 s)" if self.stop_reason is StopReason.TIME_BUDGET else "no better candidate"
        real = golden_report()  # a real report, with this fake's request, message and verification
        assert real.choice is not None
        report = replace(
            real,
            stop_message=message,
            choice=replace(real.choice, description="fake choice"),
            assumptions=replace(real.assumptions, model=request.model.name, seq_len=request.model.seq_len),
            verified=verified,
        )
        write_assumptions(path, report)  # as tune() does beside every config it emits
        return TuneResult(
            verified=verified,
            candidate=None,
            ds_config=config,
            config_path=path,
            hf_config_path=None,
            report_path=None,
            report_json_path=None,
            launch=None,
            samples_per_s=10.0,
            trials_launched=len(self.trials),
            from_cache=False,
            elapsed_s=0.0,
            stop_reason=self.stop_reason,
            report=report,
        )


def hook_request(out: Path | str, shared: Path | str, strict: bool = False, **tuning) -> HookRequest:
    options = {"model": "tiny-gpt2", "device": "cpu", "memory_budget": "1GiB", "seq_len": 32, **tuning}
    return HookRequest(TuneRequest.of(out=str(out), **options), str(shared), strict=strict, poll_interval_s=0.05)


def with_slurm_tools(name: str) -> str | None:
    """shutil.which on a machine with SLURM's client tools: these tests' FakeTune never starts a trial, so the
    multi-node launcher the hook picks (an srun step) is built, handed over and never run."""
    return f"/usr/bin/{name}" if name in {"srun", "sbatch", "scontrol"} else shutil.which(name)


def slurm_launcher_chooser(job, tuning, shared: Path, environ) -> JobFacts:
    """The hook's real launcher choice, with srun resolved by with_slurm_tools (the tests run without SLURM)."""
    return choose_launcher(job, tuning, shared, environ, which=with_slurm_tools)


def slurm_env(job_id: str = "777", rank: int = 0) -> dict[str, str]:
    """`srun -N2 --ntasks-per-node=4`: 8 hook processes of one job, 2 nodes x 4 ranks."""
    return {
        "SLURM_JOB_ID": job_id,
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_GPUS_ON_NODE": "4",
        "SLURM_PROCID": str(rank),
        "SLURM_NODEID": str(rank // 4),
        "SLURM_LOCALID": str(rank % 4),
    }


class PartialReadWatcher:
    """Polls config paths while hooks run and parses every read: a torn write would show up as bad JSON."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        self.reads = 0
        self.bad: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self.stop.is_set():
            for path in self.paths:
                try:
                    text = path.read_text()
                except FileNotFoundError:
                    continue
                self.reads += 1
                try:
                    assert isinstance(json.loads(text), dict)
                except (ValueError, AssertionError):
                    self.bad.append(text)
            time.sleep(0.001)  # a busy loop would starve the hooks on a small machine

    def __enter__(self) -> PartialReadWatcher:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


TINY = ["--device", "cpu", "--model", "tiny-gpt2", "--micro-batches", "1", "--rungs", "z0", "--seq-len", "32"]


def one_node_job(job_id: str, rank: int) -> dict[str, str]:
    """8 hook tasks on one node whose training world is one CPU rank (a real trial on 2 cores is slow)."""
    return {**slurm_env(job_id, rank), "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "node1",
            "SLURM_GPUS_ON_NODE": "1", "SLURM_NODEID": "0", "SLURM_LOCALID": str(rank)}  # fmt: skip


def job_env(nodes: int, *, nodelist: tuple[str, ...] = (), scheduler: str = "none", port: int | None = None) -> JobEnv:
    """A job of `nodes` nodes x 4 ranks seen from rank 0 (job id 9), its master the first of `nodelist`."""
    return JobEnv(
        scheduler,  # type: ignore[arg-type]
        "9",
        nodes,
        4,
        rank=0,
        node_rank=0,
        local_rank=0,
        nodelist=nodelist,
        master_addr=nodelist[0] if nodelist else None,
        master_port=port,
    )

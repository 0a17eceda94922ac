"""A stand-in for `autotune.tune` as the hook calls it (`run_hook(..., tune_fn=...)`), so the hook's roles, shared
files, fallbacks and failures are tested in seconds; tests/test_hook_e2e.py runs the same paths with real trials."""

from __future__ import annotations

import time
from dataclasses import replace

from tests.test_report_data import golden_report

from autotune.core.ladder import Candidate
from autotune.core.stop import StopReason
from autotune.infra.atomic import atomic_write_json
from autotune.report.assumptions import write_assumptions
from autotune.search.records import SearchEvent, TrialRecord
from autotune.trial.chooser import JobFacts
from autotune.trial.types import RankMetrics, TrialLauncher, TrialResult
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
        if request.gpu_memory is not None:  # the hook's plan-only fallback
            return self._finish(request, PLANNED, verified=False)
        for candidate in self.trials:
            result = TrialResult("ok", ranks=[RankMetrics(0, host_rss_peak_bytes=2**20)], samples_per_s=10.0)
            observe(SearchEvent("trial_end", candidate, "ok", TrialRecord(candidate, result, 2**20, 2**30)))
        time.sleep(self.delay_s)
        if self.error is not None:
            raise self.error
        return self._finish(request, self.config, verified=True)

    def _finish(self, request: TuneRequest, config: dict, verified: bool) -> TuneResult:
        path = atomic_write_json(request.out, config)
        message = "time budget spent (5 s)" if self.stop_reason is StopReason.TIME_BUDGET else "no better candidate"
        real = golden_report()  # a real report, with this fake's request, message and verification
        assert real.choice is not None
        report = replace(
            real,
            stop_message=message,
            choice=replace(real.choice, description="fake choice"),
            assumptions=replace(real.assumptions, model=request.model, seq_len=request.seq_len),
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

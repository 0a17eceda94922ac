"""Stand-ins for a trial launcher (`autotune.trial.trial_types.TrialLauncher`: `run(spec) -> TrialResult`), the part
that
starts DeepSpeed for one candidate, for tests of the tuner's logic around it (caching, reports, retries, emitted
configs). Each records the specs it was given, in order.

None of them models memory the way a GPU does: the tuner's memory model and the search's decisions are tested
against tests/fakes/machines.py and benchmarks/gpu_sim; these answer with simple laws a test can reason about.
"""

from __future__ import annotations

from autotune.trial.trial_types import RankMetrics, TrialResult, TrialSpec

MIB = 2**20
GIB = 2**30


class RecordingLauncher:
    """Records every spec `run` is given (`specs`, and their DeepSpeed configs as `configs`); `answer` says what the
    trial returns."""

    def __init__(self) -> None:
        self.specs: list[TrialSpec] = []

    @property
    def configs(self) -> list[dict]:
        return [spec.ds_config for spec in self.specs]

    def answer(self, spec: TrialSpec) -> TrialResult:
        raise NotImplementedError

    def run(self, spec: TrialSpec) -> TrialResult:
        self.specs.append(spec)
        return self.answer(spec)


class CountingLauncher(RecordingLauncher):
    """Every trial runs. Host memory grows with the micro-batch (`base_mib` + `mib_per_sample` per sample) and the
    optimizer step takes `fixed_s` + `s_per_sample` per sample of the micro-batches it accumulates, so larger
    micro-batches are faster per sample; with `s_per_sample=0` and `mib_per_sample=0` every candidate is alike.
    `interrupt_after` trials, the next `run` raises KeyboardInterrupt as a user's Ctrl-C would.

    Not modelled: device memory, failures, the cost of offload or checkpointing (rungs differ in nothing)."""

    def __init__(
        self,
        interrupt_after: int | None = None,
        mib_per_sample: int = 1,
        *,
        fixed_s: float = 0.1,
        s_per_sample: float = 0.01,
        base_mib: int = 400,
    ) -> None:
        super().__init__()
        self.interrupt_after = interrupt_after
        self.mib_per_sample = mib_per_sample
        self.fixed_s, self.s_per_sample, self.base_mib = fixed_s, s_per_sample, base_mib

    def run(self, spec: TrialSpec) -> TrialResult:
        if self.interrupt_after is not None and len(self.specs) >= self.interrupt_after:
            raise KeyboardInterrupt
        return super().run(spec)

    def step_s(self, spec: TrialSpec) -> float:
        samples = spec.ds_config["train_micro_batch_size_per_gpu"] * spec.ds_config["gradient_accumulation_steps"]
        return self.fixed_s + self.s_per_sample * samples

    def answer(self, spec: TrialSpec) -> TrialResult:
        mb = spec.ds_config["train_micro_batch_size_per_gpu"]
        step = self.step_s(spec)
        return TrialResult(
            status="ok",
            ranks=[RankMetrics(0, host_rss_peak_bytes=(self.base_mib + mb * self.mib_per_sample) * MIB)],
            step_times_s=[step] * 3,
            samples_per_s=spec.ds_config["train_batch_size"] / step,
        )


class RatioSpeedLauncher(CountingLauncher):
    """Host memory flat (500 MiB); the less of the optimizer offloaded (DeepSpeed's `offload_optimizer.ratio`, 1 for
    classic offload, 0 without), the faster the step: 0.1 s + 0.2 s x ratio. Not modelled: the device memory the
    ratio saves (the partial offload search's memory side is tests/fakes/machines.py's LinearMachine)."""

    def __init__(self) -> None:
        super().__init__(base_mib=500, mib_per_sample=0)

    def step_s(self, spec: TrialSpec) -> float:
        offload = spec.ds_config["zero_optimization"].get("offload_optimizer") or {}
        ratio = offload.get("ratio", 1.0) if offload else 0.0
        return 0.1 + 0.2 * ratio


class OwnCommandLauncher(RecordingLauncher):
    """Stands in for ScriptLauncher (the user's own training command) inside tune(): answers like an own-command
    trial (the command it ran, DeepSpeed Autotuning's metric file as the source of the figure), without running one.
    Speed and host memory as CountingLauncher's defaults at one accumulation step, one step time (the metric file
    holds one figure). Not modelled: the command's output, its failures."""

    def answer(self, spec: TrialSpec) -> TrialResult:
        mb = spec.ds_config["train_micro_batch_size_per_gpu"]
        step = 0.1 + 0.01 * mb
        ranks = [RankMetrics(0, host_rss_peak_bytes=(400 + mb) * MIB)]
        command = ["python", "train.py", f"--mb={mb}"]
        return TrialResult(status="ok", ranks=ranks, step_times_s=[step], samples_per_s=mb / step, command=command,
                           metric_source="deepspeed_autotuning")  # fmt: skip


class FailingLauncher(RecordingLauncher):
    """Every trial ends with `status` (a timeout, an error, ...) and no measurement, as a launcher whose trials never
    complete would. Not modelled: partial measurements, the logs a real failure leaves."""

    def __init__(self, status: str) -> None:
        super().__init__()
        self.status = status

    def answer(self, spec: TrialSpec) -> TrialResult:
        return TrialResult(status=self.status, error=f"trial {self.status}")  # type: ignore[arg-type]


class FaultInjectingLauncher(RecordingLauncher):
    """Real trials (LocalLauncher, real DeepSpeed on this machine) with a fault injected into the worker
    (autotune.trial.worker.faults): by default SIGKILLed at its entry, as `kill -9` from outside would, with no
    allocator
    message, no budget breach and no OOM-killer record. Only the fault is staged; the launch is real."""

    def __init__(self, action: str = "sigkill", point: str = "entry") -> None:
        super().__init__()
        from autotune.trial import LocalLauncher
        from autotune.trial.worker.faults import FAULT_ENV, fault_value

        self.inner = LocalLauncher(env={FAULT_ENV: fault_value(action, point), "OMP_NUM_THREADS": "1"})

    def answer(self, spec: TrialSpec) -> TrialResult:
        return self.inner.run(spec)


class GpuKitTrials:
    """Stands in for benchmarks/gpu/kit.py's `run_trial` (one real trial on the GPU), a plain callable as the kit
    takes one; records the specs. Above `oom_above` a trial is a GPU OOM; else its own device peak is (1 + micro-batch)
    GiB, allocated 1/2 GiB and reserved 1/4 GiB under it, host RSS half of it, and it returns peak sites when the spec
    asks for them. Speed is 10 samples/s per sample of the micro-batch, 1 s a trial. Not modelled: the modes' memory
    effects, other failures, other tenants."""

    def __init__(self, oom_above: int = 1_000) -> None:
        self.oom_above = oom_above
        self.specs: list[TrialSpec] = []

    def __call__(self, spec: TrialSpec) -> TrialResult:
        self.specs.append(spec)
        micro_batch = spec.ds_config["train_micro_batch_size_per_gpu"]
        if micro_batch > self.oom_above:
            return TrialResult(status="oom_gpu", error="CUDA out of memory", wall_s=1.0)
        peak = (1 + micro_batch) * GIB
        sites = {"peak_bytes": peak - GIB // 2, "sites": [{"site": "x.py:1 f", "bytes": 1, "blocks": 1}]}
        sites = sites if spec.record_peak_sites else None
        rank = RankMetrics(
            0,
            peak - GIB // 2,
            peak - GIB // 4,
            peak,
            host_rss_peak_bytes=peak // 2,
            device_used_baseline_bytes=0,
            peak_sites=sites,
        )
        return TrialResult(status="ok", ranks=[rank], samples_per_s=10.0 * micro_batch, wall_s=1.0)


class PhasedSpeedLauncher(CountingLauncher):
    """Whole-step times scripted per ZeRO stage and per call: the n-th trial of a stage gets `steps[stage][n]` (the
    last entry once they run out), so a test can make the first pass and an interleaved re-measurement disagree.
    Host memory as CountingLauncher's. Not modelled: micro-batch, checkpointing or offload effects on speed."""

    def __init__(self, steps: dict[int, list[list[float]]]) -> None:
        super().__init__()
        self.steps = steps
        self.calls: dict[int, int] = {}

    def answer(self, spec: TrialSpec) -> TrialResult:
        stage = spec.ds_config["zero_optimization"]["stage"]
        n = self.calls.get(stage, 0)
        self.calls[stage] = n + 1
        times = self.steps[stage][min(n, len(self.steps[stage]) - 1)]
        mb = spec.ds_config["train_micro_batch_size_per_gpu"]
        median = sorted(times)[len(times) // 2]
        return TrialResult(
            status="ok",
            ranks=[RankMetrics(0, host_rss_peak_bytes=(self.base_mib + mb * self.mib_per_sample) * MIB)],
            step_times_s=list(times),
            samples_per_s=spec.ds_config["train_batch_size"] / median,
        )


class SlowLauncher(CountingLauncher):
    """CountingLauncher's answers, each after `wall_s` seconds of wall clock, or a timeout once the spec's timeout
    is shorter (as a real launcher kills a trial at its timeout). For time-budget tests; nothing else modelled."""

    def __init__(self, wall_s: float) -> None:
        super().__init__()
        self.wall_s = wall_s

    def answer(self, spec: TrialSpec) -> TrialResult:
        import time

        if spec.timeout_s < self.wall_s:
            time.sleep(spec.timeout_s)
            return TrialResult(status="timeout", error=f"trial timed out after {spec.timeout_s:.0f} s")
        time.sleep(self.wall_s)
        return super().answer(spec)


class SigtermLauncher(CountingLauncher):
    """CountingLauncher's answers; its `after`+1-th trial sends this process SIGTERM, as scancel or a SLURM time limit
    would mid-trial (inside `infra.terminate.sigterm_raises()` that raises Terminated there). Nothing else modelled."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.after = after

    def answer(self, spec: TrialSpec) -> TrialResult:
        import os
        import signal
        import time

        if len(self.specs) > self.after:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises before this ends
        return super().answer(spec)

"""Stand-ins for the trials the search runs: `run(candidate) -> (TrialResult, from_cache)`, the callable that
`autotune.search.walk.Search` is given in place of real launches, and a stand-in for its memory model.

Three machines, each for its own purpose (they are not merged because each answers a different question):
- `SimulatedMachine`: many models on a generic GPU, cheap enough for a parametrized sweep. It tests that the search
  learns a calibration from its trials; it shares the shape of the search's memory model and speed priors (see
  its docstring), so it cannot show that the search is right where those are wrong.
- `LinearMachine` with `LinearMemory`: one hand-sized model in whole GiB, where each test says what the search
  believes (`LinearMemory`) and what is true (`LinearMachine`), so a test fails when the search trusts the wrong one.
- `benchmarks/gpu_sim/machine.py` `SimulatedCluster`: published figures (FLOPs, link bandwidths, ZeRO byte counts),
  independent of the search's models; benchmarks/search_quality.py and tests/test_search_robust.py use it.
All three record what they launched through `RecordingMachine`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from autotune.core.ladder import Candidate, Mode
from autotune.estimate import estimate
from autotune.estimate.types import Calibration, EstimateSettings, MemoryEstimate
from autotune.hardware.specs import Target
from autotune.search.speed import PRIOR_CHECKPOINTING_SPEED, PRIOR_RUNG_SPEED
from autotune.search.walk import MemoryModel
from autotune.trial.types import RankMetrics, TrialResult

GIB = 2**30


class RecordingMachine:
    """A trial runner for `Search` (`search.walk.RunTrial`): answers each candidate with `result` and records it
    in `launched`, in order. No answer comes from a cache (`run`'s second value is always False); a machine that
    must fail a trial apart from its `result` overrides `run`."""

    launched: list[Candidate]

    def result(self, candidate: Candidate) -> TrialResult:
        raise NotImplementedError

    def run(self, candidate: Candidate) -> tuple[TrialResult, bool]:
        self.launched.append(candidate)
        return self.result(candidate), False


# The simulated GPU's truth: activations 30% heavier and a fixed overhead the search's memory model does not know.
SIMULATED_TRUTH = Calibration(activation_scale=1.3, overhead_bytes=300 * 2**20)


class SimulatedMachine(RecordingMachine):
    """A GPU whose true peak is autotune's memory model distorted by SIMULATED_TRUTH, and whose step time follows
    the search's per-rung and checkpointing speed priors plus a fixed per-step cost (so larger micro-batches help).

    Deliberately shares the search's beliefs in shape: it tests that the search learns the distortion from its
    trials (calibration) and needs few of them, not that the search is right where its model is wrong (that is
    gpu_sim's SimulatedCluster). With `measures_half_batch`, each trial also reports its half micro-batch's own
    peak, as the real worker's timed steps do (trial/training.py timed_steps), with this machine's peak in those
    steps. Not modelled: host memory, timeouts, failed launches, accumulation."""

    def __init__(
        self,
        model,
        target: Target,
        settings: EstimateSettings,
        headroom: float,
        fixed_s: float = 0.2,
        measures_half_batch: bool = False,
    ) -> None:
        self.model, self.target, self.settings, self.fixed_s = model, target, settings, fixed_s
        self.limit = int(headroom * target.free_memory_bytes)
        self.measures_half_batch = measures_half_batch
        self.launched = []

    def true_peak(self, candidate: Candidate) -> int:
        return estimate(self.model, self.target, candidate, self.settings, SIMULATED_TRUTH).gpu_peak_bytes

    def step_seconds(self, candidate: Candidate) -> float:
        per_sample = 0.05 / PRIOR_RUNG_SPEED[candidate.rung.value]
        if candidate.grad_checkpointing:
            per_sample /= PRIOR_CHECKPOINTING_SPEED
        return self.fixed_s + per_sample * candidate.micro_batch

    def result(self, candidate: Candidate) -> TrialResult:
        peak = self.true_peak(candidate)
        if peak > self.target.free_memory_bytes:
            return TrialResult(status="oom_gpu", error="torch.OutOfMemoryError: CUDA out of memory")
        step = self.step_seconds(candidate)
        samples = candidate.micro_batch * self.target.world_size / step
        result = TrialResult(
            status="ok", ranks=[RankMetrics(0, device_used_bytes=peak)], step_times_s=[step] * 3, samples_per_s=samples
        )
        if not self.measures_half_batch or candidate.micro_batch < 2:
            return result
        smaller = candidate.micro_batch // 2
        rank = replace(
            result.ranks[0],
            micro_peak_bytes=peak,
            smaller_micro_peak_bytes=self.true_peak(replace(candidate, micro_batch=smaller)),
        )
        return replace(result, ranks=[rank], smaller_micro_batch=smaller)

    def exhaustive_best(self, rungs, grid: list[int]) -> Candidate | None:
        """The fastest candidate over `rungs` x checkpointing x `grid` that runs and stays within the headroom."""
        fitting = [
            Candidate(rung, mb, ckpt)
            for rung in rungs
            for ckpt in (False, True)
            for mb in grid
            if self.result(Candidate(rung, mb, ckpt)).ok and self.true_peak(Candidate(rung, mb, ckpt)) <= self.limit
        ]
        return max(fitting, key=lambda c: self.result(c).samples_per_s or 0.0, default=None)


def linear_peak_gib(candidate: Candidate, optimizer_gib: float, activation_gib: float = 1.0) -> float:
    """ZeRO-3 in whole GiB: 4 GiB of weights and gradients + the optimizer states, of which optimizer offload keeps
    (1 - ratio) on the GPU; `activation_gib` of activations per sample."""
    kept = 0.0 if candidate.rung.offload_optimizer else 1.0
    if candidate.rung.offload_optimizer:
        kept = 1.0 - candidate.mode.offload_ratio
    return 4 + optimizer_gib * kept + activation_gib * candidate.micro_batch


@dataclass
class LinearMemory:
    """Stands in for the search's memory model (`MemoryModel`): what the search believes, optimizer states of
    `optimizer_gib` in `linear_peak_gib`'s shape; records the OOM calibrations it is given. Calibration only counts
    samples: it never moves the prediction, so a test sees what the search does with a model that stays wrong."""

    optimizer_gib: float = 12.0
    oom_calibrations: list[Candidate] = field(default_factory=list)

    def estimate(self, model, target, candidate, settings, calibration=None) -> MemoryEstimate:
        peak = int(linear_peak_gib(candidate, self.optimizer_gib) * GIB)
        return MemoryEstimate(candidate, peak, 0, 0)

    def calibrate(self, calibration, model, target, candidate, settings, measured) -> Calibration:
        return Calibration(samples=calibration.samples + 1)

    def calibrate_oom(self, calibration, model, target, candidate, settings, limit) -> Calibration:
        self.oom_calibrations.append(candidate)
        return Calibration(samples=calibration.samples + 1)

    def model(self) -> MemoryModel:
        return MemoryModel(self.estimate, self.calibrate, self.calibrate_oom)


@dataclass
class LinearMachine(RecordingMachine):
    """What is true for `LinearMemory`'s tests: optimizer states of `optimizer_gib` in `linear_peak_gib`'s shape, an
    OOM above `memory_bytes`; step time = compute + the offloaded share's CPU Adam (`cpu_adam_s` for the whole
    optimizer), so less offload is faster; `fast_modes` run twice as fast. Its truth is set by each test, apart
    from the search's priors. Not modelled: host memory, timeouts, accumulation, more than one rank."""

    memory_bytes: int
    optimizer_gib: float = 12.0
    cpu_adam_s: float = 2.0
    fast_modes: tuple[Mode, ...] = ()
    activation_gib: float = 1.0
    launched: list[Candidate] = field(default_factory=list)

    def result(self, candidate: Candidate) -> TrialResult:
        peak = int(linear_peak_gib(candidate, self.optimizer_gib, self.activation_gib) * GIB)
        if peak > self.memory_bytes:
            return TrialResult(status="oom_gpu", error="torch.OutOfMemoryError: CUDA out of memory.")
        offloaded = candidate.mode.offload_ratio if candidate.rung.offload_optimizer else 0.0
        step = 0.2 + 0.1 * candidate.micro_batch + self.cpu_adam_s * offloaded
        if candidate.mode in self.fast_modes:
            step /= 2
        return TrialResult(
            status="ok",
            ranks=[RankMetrics(0, device_used_bytes=peak)],
            step_times_s=[step] * 3,
            samples_per_s=candidate.micro_batch / step,
        )

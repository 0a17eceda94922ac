"""Stand-ins for the trials the search runs: `run(candidate) -> (TrialResult, from_cache)`, the callable that
`autotune.search.walk.Search` is given in place of real launches, and a stand-in for its memory model.

Three machines, each for its own purpose (they are not merged because each answers a different question):
- `SimulatedMachine`: many models on a generic GPU node, cheap enough for a parametrized sweep. Its own physics
  (ZeRO's bytes per parameter, activations per sample, FLOPs, collective volumes, each with its source; see its
  docstring), never autotune's memory model or speed priors: the search must learn it from its trials. Unlike
  SimulatedCluster (below: named nodes, host RAM, timeouts, the modern modes, start-up costs) it takes a GPU of any
  memory size and models the classic ladder alone.
- `LinearMachine` with `LinearMemory`: one hand-sized model in whole GiB, where each test says what the search
  believes (`LinearMemory`) and what is true (`LinearMachine`), so a test fails when the search trusts the wrong one.
- `benchmarks/gpu_sim/machine.py` `SimulatedCluster`: published figures (FLOPs, link bandwidths, ZeRO byte counts),
  independent of the search's models; benchmarks/search_quality.py and tests/test_search_robust.py use it.
All three record what they launched through `RecordingMachine`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from autotune.core.ladder import Candidate, Mode, Rung
from autotune.estimate.estimate_types import Calibration, EstimateSettings, MemoryEstimate
from autotune.hardware.specs import Target
from autotune.models import ModelSummary
from autotune.search.walk import MemoryModel
from autotune.trial.trial_types import RankMetrics, TrialResult

GIB = 2**30


class RecordingMachine:
    """A trial runner for `Search` (`search.records.RunTrial`): answers each candidate with `result` and records it
    in `launched`, in order. No answer comes from a cache (`run`'s second value is always False); a machine that
    must fail a trial apart from its `result` overrides `run`."""

    launched: list[Candidate]

    def result(self, candidate: Candidate) -> TrialResult:
        raise NotImplementedError

    def run(self, candidate: Candidate) -> tuple[TrialResult, bool]:
        self.launched.append(candidate)
        return self.result(candidate), False


# --- SimulatedMachine's physics: its own, from published figures; nothing here is read from autotune's models ------
# Bytes per parameter of mixed-precision Adam (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training
# Trillion Parameter Models", section 3.1 and Figure 1): 2 (16-bit weights) + 2 (16-bit gradients) + K = 12 (fp32
# master weights, momentum, variance). ZeRO's stages partition them over the N ranks (section 5, Figure 1): P_os the
# optimizer states, P_os+g also the gradients, P_os+g+p also the weights.
WEIGHT_BYTES, GRADIENT_BYTES, OPTIMIZER_STATE_BYTES = 2, 2, 12
# Activations kept for backward per transformer layer and sample, in 16-bit: s*h*(34 + 5*a*s/h) bytes (Korthikanti
# et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", section 4.1, equation 1); the 5*a*s/h
# term is the s^2 score matrix that fused attention (sdpa, the tests' setting) does not keep, so 34*s*h. Full
# recomputation keeps each layer's 2*s*h input (the same paper's full-recomputation case) and rebuilds one layer's
# activations at a time in backward.
LAYER_ACTIVATION_BYTES_PER_SH = 34
CHECKPOINTED_LAYER_BYTES_PER_SH = 2
# Logits per token and vocabulary entry: 16-bit logits (2) + their fp32 upcast for the loss (4) + its fp32 gradient (4)
# (transformers' ForCausalLMLoss upcasts the logits: `logits = logits.float()`, transformers loss/loss_utils.py).
LOGIT_BYTES_PER_VOCAB = 10
# ZeRO-1/2 reduce gradients through contiguous buckets of reduce_bucket_size 16-bit elements, two of them with
# overlap_comm (deepspeed runtime/zero/stage_1_and_2.py `backward`: ipg_buffer buf_0, and buf_1 when overlap_comm);
# the configs autotune emits set 2e8 elements and overlap_comm at stages 1-2 (autotune.dsconfig.build_config
# zero_section).
STAGE12_BUCKETS, BUCKET_ELEMENTS = 2, 200_000_000
# ZeRO-3 gathers one module's 16-bit weights while it runs and prefetches the next: two of the largest layer live
# (deepspeed runtime/zero/partitioned_param_coordinator.py fetches ahead of use). A simplification of the prefetch
# bucket and max-live-parameters limits.
STAGE3_LIVE_LAYERS = 2
# Communication volume per optimizer step and rank, in elements of the 16-bit gradients/weights (ZeRO paper,
# section 7): data parallelism's all-reduce = reduce-scatter + all-gather moves 2*P; stages 1 and 2 the same 2*P;
# stage 3 1.5x that, 3*P (an all-gather in forward, one in backward, a reduce-scatter). A ring moves (n-1)/n of it.
COMMUNICATED_ELEMENTS = {0: 2.0, 1: 2.0, 2: 2.0, 3: 3.0}
# A GPU Adam step is memory-bound: it reads the fp32 master weights, gradients, momentum and variance (16 bytes per
# parameter), writes weights, momentum and variance (12) and the 16-bit copy of the weights the next forward uses (2).
GPU_ADAM_BYTES_PER_PARAM = 16 + 12 + 2
# Training FLOPs per token: forward 2*P (one multiply-add per parameter) + attention 4*L*s*h (scores and their
# weighted sum); backward twice the forward (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on
# GPU Clusters Using Megatron-LM", its FLOP count per iteration: 24*b*s*h^2 + 4*b*s^2*h per layer and forward, x3 for
# forward and backward, x4 with activation recomputation). Full checkpointing runs the layers' forward once more; the
# embedding and LM head are not recomputed.
FORWARD_FLOPS_PER_PARAM, ATTENTION_FLOPS_PER_LSH, BACKWARD_OVER_FORWARD = 2, 4, 2


@dataclass(frozen=True)
class SimulatedPhysics:
    """The simulated node's own figures. SIM: a simulation parameter chosen inside a published range (no single
    published value exists); it shapes the scenario and claims nothing about a real machine."""

    # SIM: 163 TFLOP/s per A100 is Megatron-LM's achieved figure at scale (Narayanan et al. 2021, abstract: 52% of
    # the 312 TFLOP/s bf16 peak); the simulated GPU achieves 140, a little below it.
    achieved_flops: float = 140e12
    # SIM: A100 40GB's HBM2 is 1,555 GB/s (NVIDIA A100 datasheet); a memory-bound kernel reaches about 85% of it.
    hbm_bytes_per_s: float = 1.3e12
    # SIM: NCCL bus bandwidth inside an NVLink 3 node, below its 300 GB/s per direction (NVIDIA DGX A100 datasheet;
    # bus bandwidth as nccl-tests' PERFORMANCE.md defines it).
    bus_bytes_per_s: float = 200e9
    # SIM: PCIe Gen4 x16 is 31.5 GB/s per direction (PCI-SIG); pinned copies reach about 2/3 of it.
    pcie_bytes_per_s: float = 20e9
    # SIM: DeepSpeed's CPU Adam per rank. DeepSpeed states a 5x-7x speedup over torch.optim.Adam
    # (deepspeed/ops/adam/cpu_adam.py); torch's ran 5e7-7e7 parameters/s per core on this project's VM
    # (benchmarks/gpu_sim/machine.py CPU_ADAM_PARAMS_PER_CORE_S); 4 cores per rank at 2.5e8 each.
    cpu_adam_params_per_s: float = 1.0e9
    # SIM: CUDA context + NCCL communicator buffers per process; reports range from 0.3 to 1.5 GiB.
    runtime_bytes: int = int(0.9 * 2**30)
    # SIM: the caching allocator's fragmentation on activations (blocks rounded and split, not all reusable).
    fragmentation: float = 1.12
    # Activations per sample (published, see the figures above); a test may set others to make a heavier machine.
    layer_activation_bytes_per_sh: float = LAYER_ACTIVATION_BYTES_PER_SH
    checkpointed_layer_bytes_per_sh: float = CHECKPOINTED_LAYER_BYTES_PER_SH
    logit_bytes_per_vocab: float = LOGIT_BYTES_PER_VOCAB


class SimulatedMachine(RecordingMachine):
    """A GPU node with its own physics, for a parametrized sweep of the search over many models: the search must
    learn this machine's memory from its trials (calibration) and find its fastest candidate with few of them.

    Independent of the code it tests: neither autotune.estimate nor autotune.search.speed is consulted, so the search
    cannot be right here merely because the simulator shares its beliefs. What it models (figures and their sources
    above and in `SimulatedPhysics`):
    - the peak per GPU: the CUDA runtime + model states by the ZeRO paper's bytes per parameter and partitioning per
      stage (optimizer offload keeps the optimizer states and fp32 gradients on the host, ZeRO-Offload; parameter
      offload the weights too) + ZeRO's working buffers (stages 1-2: gradient buckets; stage 3: gathered layers) +
      activations per sample (Korthikanti et al.'s 34*s*h per layer, or the checkpointed layer inputs and one layer
      recomputed) and the loss's logits, times the allocator's fragmentation. An OOM above the free memory.
    - the step time per rank: `fixed_s` (launches, Python, data) + the collectives' volume per stage (ZeRO paper,
      section 7) over the bus bandwidth + the optimizer step (GPU Adam memory-bound over HBM, or CPU Adam plus the
      PCIe copies when offloaded; parameter offload fetches the weights over PCIe in forward and backward) + the
      training FLOPs per sample (Narayanan et al.) over the achieved FLOP/s, times the micro-batch. So a larger
      micro-batch amortises the per-step costs, and the rungs' order comes from their own work, not from a prior.
    With `measures_half_batch`, each trial also reports its half micro-batch's own peak, as the real worker's timed
    steps do (trial/worker/train_steps.py timed_steps), with this machine's peak in those steps.
    Not modelled: overlap of communication with compute (every step pays its collectives in full), the optimizer
    step's own moment as a separate peak (the peak is the sum of everything), encoder-decoder cross-attention (every
    layer is a decoder layer of the same width), host memory and NVMe, timeouts, failed launches, accumulation,
    measurement noise (every step takes the same time), the timing of the half micro-batch."""

    def __init__(
        self,
        model: ModelSummary,
        target: Target,
        settings: EstimateSettings,
        headroom: float,
        fixed_s: float = 0.2,
        measures_half_batch: bool = False,
        physics: SimulatedPhysics = SimulatedPhysics(),
    ) -> None:
        self.model, self.target, self.seq_len, self.fixed_s = model, target, settings.seq_len, fixed_s
        self.physics = physics
        self.limit = int(headroom * target.free_memory_bytes)
        self.measures_half_batch = measures_half_batch
        self.launched = []

    @staticmethod
    def check_modelled(candidate: Candidate) -> None:
        """The classic ladder without NVMe only: anything else would come out silently wrong."""
        if candidate.rung.needs_nvme or not candidate.mode.is_classic:
            raise ValueError(f"SimulatedMachine has no model of {candidate.key} (NVMe offload and the modern modes)")

    # -- memory ----------------------------------------------------------------------------------------------------
    def model_state_bytes(self, rung: Rung) -> float:
        """Weights, gradients and optimizer states this rank keeps on its GPU (ZeRO paper, Figure 1)."""
        p, n = self.model.total_params, self.target.world_size
        weights = WEIGHT_BYTES * p / (n if rung.stage == 3 else 1)
        gradients = GRADIENT_BYTES * p / (n if rung.stage >= 2 else 1)
        optimizer = OPTIMIZER_STATE_BYTES * p / (n if rung.stage >= 1 else 1)
        if rung.offload_optimizer:  # ZeRO-Offload (Ren et al. 2021): optimizer states and fp32 gradients on the host
            optimizer = 0.0  # the 16-bit gradient partition passes through the GPU on its way down
        if rung.offload_param:
            weights = 0.0  # on the host, gathered layer by layer (the stage-3 buffers below)
        return weights + gradients + optimizer

    def buffer_bytes(self, rung: Rung) -> float:
        if rung.stage in (1, 2):
            return STAGE12_BUCKETS * BUCKET_ELEMENTS * GRADIENT_BYTES
        if rung.stage == 3:
            return STAGE3_LIVE_LAYERS * self.model.largest_layer_params * WEIGHT_BYTES
        return 0.0

    def activation_bytes_per_sample(self, checkpointing: bool) -> float:
        """What one sample keeps for backward, and its logits (see the figures above)."""
        m, s, physics = self.model, self.seq_len, self.physics
        sh = s * m.hidden_size
        whole_layer = physics.layer_activation_bytes_per_sh * sh
        if checkpointing:  # every layer's input, and one layer rebuilt at a time
            layers = m.total_layers * physics.checkpointed_layer_bytes_per_sh * sh + whole_layer
        else:
            layers = m.total_layers * whole_layer
        return layers + s * m.vocab_size * physics.logit_bytes_per_vocab

    def true_peak(self, candidate: Candidate) -> int:
        self.check_modelled(candidate)
        activations = self.activation_bytes_per_sample(candidate.grad_checkpointing) * candidate.micro_batch
        fixed = self.physics.runtime_bytes + self.model_state_bytes(candidate.rung) + self.buffer_bytes(candidate.rung)
        return int(fixed + self.physics.fragmentation * activations)

    # -- time ------------------------------------------------------------------------------------------------------
    def flops_per_sample(self, checkpointing: bool) -> float:
        m, s = self.model, self.seq_len
        attention = ATTENTION_FLOPS_PER_LSH * m.total_layers * s * s * m.hidden_size
        forward = FORWARD_FLOPS_PER_PARAM * m.total_params * s + attention
        recomputed = FORWARD_FLOPS_PER_PARAM * (m.total_params - m.embedding_params) * s + attention
        return (1 + BACKWARD_OVER_FORWARD) * forward + (recomputed if checkpointing else 0.0)

    def communication_s(self, rung: Rung) -> float:
        n = self.target.world_size
        if n == 1:
            return 0.0
        moved = COMMUNICATED_ELEMENTS[rung.stage] * self.model.total_params * WEIGHT_BYTES * (n - 1) / n
        return moved / self.physics.bus_bytes_per_s

    def optimizer_s(self, rung: Rung) -> float:
        """The optimizer step on this rank's partition: on the GPU, or on the host with its PCIe copies."""
        physics = self.physics
        partition = self.model.total_params / (self.target.world_size if rung.stage >= 1 else 1)
        if not rung.offload_optimizer:
            return GPU_ADAM_BYTES_PER_PARAM * partition / physics.hbm_bytes_per_s
        copies = (GRADIENT_BYTES + WEIGHT_BYTES) * partition / physics.pcie_bytes_per_s  # gradients down, weights up
        return partition / physics.cpu_adam_params_per_s + copies

    def parameter_fetch_s(self, rung: Rung) -> float:
        """Parameter offload: this rank's 16-bit shard comes over PCIe for forward and again for backward."""
        if not rung.offload_param:
            return 0.0
        return 2 * WEIGHT_BYTES * self.model.total_params / self.target.world_size / self.physics.pcie_bytes_per_s

    def step_seconds(self, candidate: Candidate) -> float:
        self.check_modelled(candidate)
        rung = candidate.rung
        per_step = self.fixed_s + self.communication_s(rung) + self.optimizer_s(rung) + self.parameter_fetch_s(rung)
        per_sample = self.flops_per_sample(candidate.grad_checkpointing) / self.physics.achieved_flops
        return per_step + per_sample * candidate.micro_batch

    # -- a trial ---------------------------------------------------------------------------------------------------
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
        """The fastest candidate over `rungs` x checkpointing x `grid` that runs and stays within the headroom.

        Exactly equal speeds go to the first in ladder order (the earlier rung, then without checkpointing): the
        simpler config, which the search's tie rule also picks between rungs without offload
        (autotune.search.pick_decision). Here ZeRO-1 and ZeRO-2 tie at every micro-batch: they move the same volume and
        step the same partition (ZeRO paper, section 7.2.1)."""
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

    def calibrate(self, calibration, model, target, candidate, settings, measured_peak_bytes) -> Calibration:
        return Calibration(samples=calibration.samples + 1)

    def calibrate_oom(self, calibration, model, target, candidate, settings, limit_bytes) -> Calibration:
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

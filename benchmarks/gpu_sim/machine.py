"""A simulated GPU cluster built from published figures, independent of the search's beliefs.

The search orders and prunes candidates with its own assumptions (`autotune.search.speed`) and predicts memory
with its own model (`autotune.estimate`). This machine uses neither: step time comes from FLOPs, link
bandwidths and CPU Adam throughput; memory from the ZeRO paper's per-parameter byte counts and the
Megatron activation formula. So a search that is right here is right because it measured, not because
the simulator agrees with its priors.

Every figure carries its source. Figures marked SIM are simulation parameters chosen inside published
ranges (no single published value exists); they shape the scenarios but are not claims about a machine.

Launches: the trials a search ran are accounted for under each of autotune's three launchers (`Launcher`), with the
start-up we measured (`StartupCosts`). Here a trial measures the same memory and speed in a warm worker as in a
fresh process: nobody has compared the two on a GPU, so the simulator has no difference to apply. `fresh_extra_bytes`
lets a test set one; no published scenario does.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, fields, replace
from enum import Enum
from pathlib import Path

from tests.fakes.machines import RecordingMachine

from autotune.core.ladder import Candidate, Mode, Rung
from autotune.core.measurement import MIN_STEPS, enough_steps
from autotune.hardware.specs import GpuSpec, resolve_gpu_type
from autotune.models import ModelSummary
from autotune.modes.applies import device_sub_groups
from autotune.trial.trial_types import RankMetrics, TrialResult, TrialSpec
from autotune.trial.worker.train_steps import PART_STEPS

GB = 1e9
GIB = 2**30

# --- published figures -----------------------------------------------------------------------------
# Megatron-LM at scale: 163 TFLOP/s per A100 = 52% of the 312 TFLOP/s bf16 peak (Narayanan et al. 2021,
# "Efficient Large-Scale Language Model Training on GPU Clusters", SC'21, abstract). Used as the ceiling.
MFU_CEILING = 0.52
# SIM: tokens per micro-batch at which a GPU reaches half its ceiling; small micro-batches under-use it
# (the reason larger micro-batches help at all). Chosen so mb 1 x seq 512 runs at ~1/3 of the ceiling.
MFU_HALF_TOKENS = 1024
# Ring collectives (NCCL PERFORMANCE.md, "bus bandwidth"): all-reduce moves 2(n-1)/n x S per rank,
# reduce-scatter and all-gather (n-1)/n x S each; time = bytes moved / bus bandwidth.
# ZeRO communication volume (Rajbhandari et al. 2020, "ZeRO", section 7): stages 1-2 = data parallel (2 x
# params), stage 3 = 1.5x that (an all-gather in forward and in backward plus a reduce-scatter).
# NCCL small-message latency per collective: tens of microseconds (nccl-tests, 8-byte all-reduce).
COLLECTIVE_LATENCY_S = 30e-6
# Bytes per parameter in mixed-precision Adam (ZeRO paper, section 3.1): 2 (bf16 weights) + 2 (bf16
# grads) + 12 (fp32 master weights, momentum, variance).
WEIGHT_BYTES, GRAD_BYTES, OPTIMIZER_BYTES = 2, 2, 12
# Activations per layer and sample with sdpa/flash attention (no s^2 score matrix kept):
# 34 * s * h bytes (Korthikanti et al. 2022, "Reducing Activation Recomputation", Table 2, without the
# 5as/h attention term that flash attention removes). With full checkpointing each layer keeps its 2*s*h
# bf16 input and one layer is recomputed at a time (same paper, section 4.1).
ACTIVATION_BYTES_PER_SH = 34
CHECKPOINT_BYTES_PER_SH = 2
# Logits per token: bf16 logits (2) + fp32 upcast for the loss (4) + its fp32 gradient (4) (HF causal LM
# loss upcasts logits to float: transformers loss_utils.ForCausalLMLoss).
LOGIT_BYTES_PER_VOCAB = 10
# SIM: CUDA context + NCCL communicator buffers per process (reports range 0.3-1.5 GiB, see
# autotune/estimate/constants.py for the cited ones; the simulator takes its own value in that range).
RUNTIME_BYTES = int(1.1 * GIB)
# SIM: caching-allocator fragmentation on activations.
FRAGMENTATION = 1.10
# CPU Adam (DeepSpeedCPUAdam) is memory-bound: it reads fp32 params, grads, momentum, variance and writes
# params, momentum, variance (28 bytes per parameter), per DeepSpeed's csrc/adam/cpu_adam_impl.cpp.
CPU_ADAM_BYTES_PER_PARAM = 28
# SIM: DeepSpeed CPU Adam per core. DeepSpeed "provides between 5x to 7x speedup over torch.optim.adam"
# (deepspeed/ops/adam/cpu_adam.py:30); torch.optim.Adam(foreach=False) ran 5.0e7-7.0e7 params/s on one
# core of this benchmark's 2-core AMD EPYC VM (20M params, 2026-11-23, shared machine), i.e. 2.5e8-4.9e8
# for CPU Adam. The simulator takes 3.5e8; node DRAM bandwidth usually binds first (see step_cost).
CPU_ADAM_PARAMS_PER_CORE_S = 3.5e8
# Trial start-up, from our own measurement (benchmarks/trial_startup.py -> results/trial_startup_cpu.json; 2-core VM,
# CPU backend, tiny GPT-2; the only start-up we have measured, no GPU yet): a launch pays the process start, imports
# and process group once (phases launch + imports + dist_init); each trial pays its model build and DeepSpeed engine
# init (model_build + engine_init), in a fresh process with the op loading, in a warm worker without it.
STARTUP_MEASUREMENT = Path(__file__).resolve().parents[1] / "results" / "trial_startup_cpu.json"
# What a trial's steps are, read from the worker (trial/worker/train_steps.py timed_steps), not restated: its
# warm-up steps (TrialSpec.warmup_steps), each one boundary micro-step; whole optimizer steps until
# autotune.core.measurement.enough_steps says stop (the simulator's steps have no spread, so MIN_STEPS of them, or
# MIN_SLOW_STEPS once MAX_MEASURE_S of them are measured); then the second point at a smaller micro-batch
# (TrialSpec.smaller_micro_batch = micro-batch // 2, request/context.py spec): PART_STEPS whole steps at it where
# neither micro-batch accumulates (no fixed global batch, two warm-up steps or more: timed_steps' whole_smaller),
# else PART_STEPS plain micro-steps at the trial's micro-batch and PART_STEPS at the smaller one (the plain ones at
# its own micro-batch also where it accumulates without a smaller one). A trial whose peak is over
# TrialSpec.stop_over_bytes (the search's limit on GPUs) stops after its warm-up (SimulatedCluster.stops_over).
WARMUP_STEPS = next(f.default for f in fields(TrialSpec) if f.name == "warmup_steps")


@dataclass(frozen=True)
class TrialShape:
    """How many steps a trial runs, by part: the worker's own (above) unless a variant is being measured (a
    proposal for shorter trials at scale: gpu_sim/budget_report.py)."""

    warmup_steps: int = WARMUP_STEPS
    min_steps: int = MIN_STEPS
    part_steps: int = PART_STEPS


WORKER_TRIAL = TrialShape()
# A trial that runs out of memory fails in its first warm-up step, where the peak (a boundary step, optimizer
# included) is first reached: it is charged that one step, not a whole measurement.
FAILED_TRIAL_STEPS = 1


@dataclass(frozen=True)
class StartupCosts:
    """Seconds a launch pays once, and a trial's build in a fresh process and in a warm one (means of the runs)."""

    process_start_s: float
    cold_build_s: float
    warm_build_s: float

    @property
    def fresh_trial_s(self) -> float:
        return self.process_start_s + self.cold_build_s


def measured_startup(path: Path = STARTUP_MEASUREMENT) -> StartupCosts:
    """torchrun launches (multi-GPU trials are torchrun's) for the cold figures; the warm pool's trials after its
    first for the warm build."""
    data = json.loads(path.read_text())

    def phases(run: dict, names: tuple[str, ...]) -> float:
        return sum(run["phases"].get(name, 0.0) for name in names)

    cold = [r for r in data["torchrun_cold"] if r["status"] == "ok"]
    warm = [r for r in data["warm_pool"][1:] if r["status"] == "ok"]
    return StartupCosts(
        process_start_s=statistics.mean(phases(r, ("launch", "imports", "dist_init")) for r in cold),
        cold_build_s=statistics.mean(phases(r, ("model_build", "engine_init")) for r in cold),
        warm_build_s=statistics.mean(phases(r, ("model_build", "engine_init")) for r in warm),
    )


STARTUP = measured_startup()
TRIAL_STARTUP_S = STARTUP.fresh_trial_s  # one trial in its own process (DeepSpeed Autotuning's experiments too)

# --- modern memory modes (beyond the classic ladder), the simulator's own model ---------------------
# Partial optimizer offload (offload_optimizer.ratio, ZeRO-3): DeepSpeed 0.19.8 splits each rank's optimizer
# partition into sub-groups and puts sub-group i on the CPU iff i >= int((1 - ratio) * sub_groups)
# (runtime/zero/stage3.py:1103-1108). GPU sub-groups keep fp32 master weights, momentum and variance on the GPU
# and are stepped there by a torch AdamW "backup optimizer" (stage3.py:313-325, 1252-1255); CPU sub-groups by CPU
# Adam; the step visits the sub-groups one after the other (stage3.py:2910-2922), so the GPU and CPU parts add.
# Sub-groups per rank: the config autotune emits sets sub_group_size to 1/20 of a rank's parameters
# (autotune.modes.applies.RATIO_STEPS, ratio_sub_group_size), so the simulated job has 20; the simulator applies
# DeepSpeed's int() rule to whatever ratio it is given. A device sub-group keeps its fp32 master weights, fp32
# gradient (stage3.py:1337-1342 moves the gradient buffer to the sub-group's device) and the backup AdamW's two
# moments there: 16 bytes per element.
SUB_GROUPS = 20
PARTIAL_OFFLOAD_DEVICE_BYTES = 16
# ZeRO++ (Wang et al. 2023, "ZeRO++: Extremely Efficient Collective Communication for Giant Model Training",
# arXiv:2306.10209, sections 3.1-3.3 and Table 1): qwZ all-gathers forward weights as int8 (half of bf16, plus
# block scales: 1 fp32 scale per 2048-element block, DeepSpeed's default group size); hpZ keeps a secondary bf16
# copy of the weights partitioned inside the node, so the backward all-gather stays on the intra-node links;
# qgZ replaces the gradient reduce-scatter by hierarchical int4 all-to-alls (cross-node volume 1/4 of bf16).
QUANTIZED_WEIGHT_BYTES = 1 + 4 / 2048
QUANTIZED_GRADIENT_FRACTION = 0.25
# SIM: quantize/dequantize kernels cost time on the GPU; the paper measures end-to-end gains net of them. The
# simulator charges one extra memory-bound pass (read bf16 + write int8 + read int8) per quantized collective.
QUANTIZE_BYTES_PER_ELEMENT = 2 + 1 + 1


@dataclass(frozen=True)
class NodeType:
    """One published machine: its GPUs, links and host."""

    name: str
    gpu_key: str  # profiles/hardware key (TFLOP/s, memory from the vendor datasheet cited there)
    gpus_per_node: int
    collective_gbs: float  # achievable NCCL bus bandwidth inside a node, GB/s
    pcie_gbs: float  # host<->GPU per GPU, GB/s
    node_network_gbs: float  # per node, GB/s (bounds multi-node bus bandwidth)
    cpu_cores_per_gpu: int
    host_memory_gbs_per_gpu: float  # host DRAM bandwidth share per GPU, GB/s
    host_ram_bytes: int
    nvme_gbs: float  # per node, read ~ write, GB/s
    source: str

    @property
    def gpu(self) -> GpuSpec:
        return resolve_gpu_type(self.gpu_key)


# NVIDIA DGX A100 datasheet: 8x A100 40GB SXM4, NVLink 3 600 GB/s per GPU (300 GB/s each way), 2x AMD EPYC
# 7742 (128 cores), 1 TB RAM, 8x 200 Gb/s HDR InfiniBand (200 GB/s per node), 15 TB Gen4 NVMe.
# EPYC 7742: 8 channels DDR4-3200 = 204.8 GB/s per socket (AMD product page). PCIe Gen4 x16: 31.5 GB/s
# per direction (PCI-SIG), ~25 GB/s achieved (SIM: 80%). NCCL bus bandwidth: SIM 230 GB/s, below the
# 300 GB/s per direction of NVLink 3. NVMe: SIM 20 GB/s for the node's Gen4 U.2 drives (each ~6 GB/s read).
DGX_A100 = NodeType(
    name="DGX A100 (8x A100 40GB, NVLink, 8x HDR IB)",
    gpu_key="a100-40gb",
    gpus_per_node=8,
    collective_gbs=230,
    pcie_gbs=25,
    node_network_gbs=200,
    cpu_cores_per_gpu=16,
    host_memory_gbs_per_gpu=2 * 204.8 / 8,
    host_ram_bytes=1024 * GIB,
    nvme_gbs=20,
    source="NVIDIA DGX A100 datasheet; AMD EPYC 7742 product page; PCI-SIG Gen4",
)

# AWS g5.12xlarge: 4x A10G 24 GB (no NVLink: collectives over PCIe Gen4 through the host), 48 vCPUs
# (24 cores: 6 per GPU), 192 GiB RAM, 40 Gb/s network (5 GB/s), 3.8 TB NVMe (AWS instance page).
# A10G: 24 GB, ~70 TFLOP/s bf16 dense (profiles/hardware/a10g.json). PCIe bus bandwidth for a 4-GPU
# all-reduce through the host bridge: SIM 12 GB/s (about half a Gen4 x16 link). Host DRAM: AMD EPYC 7R32,
# 8 channels DDR4-3200 = 204.8 GB/s, 1 socket for 4 GPUs. NVMe: SIM 2 GB/s (local instance store).
G5_12XLARGE = NodeType(
    name="AWS g5.12xlarge (4x A10G 24GB, PCIe only, 6 cores/GPU)",
    gpu_key="a10g",
    gpus_per_node=4,
    collective_gbs=12,
    pcie_gbs=12,
    node_network_gbs=5,
    cpu_cores_per_gpu=6,
    host_memory_gbs_per_gpu=204.8 / 4,
    host_ram_bytes=192 * GIB,
    nvme_gbs=2,
    source="AWS EC2 G5 instance page; profiles/hardware/a10g.json",
)

# NVIDIA DGX H100 datasheet: 8x H100 80GB SXM5, NVLink 4 900 GB/s per GPU (450 GB/s each way), 2x Intel Xeon
# Platinum 8480C (112 cores: 14 per GPU), 2 TB RAM, 8x ConnectX-7 400 Gb/s (400 GB/s per node), 8x 3.84 TB NVMe.
# Xeon 8480C: 8 channels DDR5-4800 = 307.2 GB/s per socket (Intel ARK). PCIe Gen5 x16: 63 GB/s per direction
# (PCI-SIG), SIM 80% = 50 GB/s achieved. NCCL bus bandwidth inside the node: SIM 360 GB/s, below NVLink 4's 450 GB/s
# per direction. NVMe: SIM 25 GB/s for the node's eight Gen4 U.2 drives.
DGX_H100 = NodeType(
    name="DGX H100 (8x H100 80GB, NVLink 4, 8x NDR 400G)",
    gpu_key="h100-80gb",
    gpus_per_node=8,
    collective_gbs=360,
    pcie_gbs=50,
    node_network_gbs=400,
    cpu_cores_per_gpu=14,
    host_memory_gbs_per_gpu=2 * 307.2 / 8,
    host_ram_bytes=2048 * GIB,
    nvme_gbs=25,
    source="NVIDIA DGX H100 datasheet; Intel ARK Xeon Platinum 8480C; PCI-SIG Gen5",
)

# A workstation: 2x RTX 4090 24 GB (no NVLink, PCIe Gen4 x8/x8 on a desktop board: ~12 GB/s each way;
# SIM collective 6 GB/s), 16-core desktop CPU (8 per GPU), 2 channels DDR5-5600 = 89.6 GB/s, 128 GiB RAM,
# one Gen4 NVMe (~7 GB/s read, ~5 GB/s write: Samsung 990 Pro datasheet; SIM 5 GB/s).
WORKSTATION_4090 = NodeType(
    name="workstation (2x RTX 4090 24GB, PCIe x8/x8, 8 cores/GPU)",
    gpu_key="rtx-4090",
    gpus_per_node=2,
    collective_gbs=6,
    pcie_gbs=12,
    node_network_gbs=1.25,
    cpu_cores_per_gpu=8,
    host_memory_gbs_per_gpu=89.6 / 2,
    host_ram_bytes=128 * GIB,
    nvme_gbs=5,
    source="profiles/hardware/rtx-4090.json; Samsung 990 Pro datasheet; DDR5-5600 dual channel",
)


class Launcher(str, Enum):
    """autotune's three ways of running a search's trials (autotune.tuning.trials.launcher_for)."""

    FRESH = "fresh"  # a new process per trial: --trial-workers fresh (and several nodes, an own command)
    WARM = "warm"  # warm workers, the pick not confirmed: the CPU default and --trial-workers warm
    WARM_CONFIRMED = "warm + fresh confirmation"  # the GPU default: warm workers, the pick once more in a fresh process


def models_mode(mode: Mode) -> bool:
    """Whether the simulator has a model of `mode`: partial offload and ZeRO++ yes; ZenFlow and SuperOffload no."""
    return not (mode.zenflow or mode.super_offload)


class Launch(list):
    """The trials one process runs, in order (a list of candidates), and whether it is the pick's fresh
    confirmation, whose trial times no smaller micro-batch (request/context.py TuneContext.confirmation_spec)."""

    def __init__(self, trials: list[Candidate] | None = None, *, confirmation: bool = False) -> None:
        super().__init__(trials or [])
        self.confirmation = confirmation


@dataclass(frozen=True)
class StepCost:
    """Seconds of one micro-step and of the once-per-optimizer-step work, per rank."""

    micro_s: float
    optimizer_s: float


class SimulatedCluster(RecordingMachine):
    """`run(candidate)` answers like a real trial would, in whatever process the launcher gives it (`launches` says
    which); `run_fresh(candidate)` is a trial in a process of its own (Search.confirm_fresh); `result(candidate)` is
    the exhaustive grid's view. Both record the candidate in `launched`, in order; `fresh_runs` holds the positions
    there of those run fresh.

    `fresh_extra_bytes`: what a fresh process needs beyond what a warm worker measured at the same config. 0, the
    same peak, unless a test says otherwise: no measurement of warm against fresh GPU peaks exists (the GPU kit's
    warm stage has not run), so the published scenarios carry none."""

    def __init__(
        self,
        model: ModelSummary,
        node: NodeType,
        nodes: int,
        seq_len: int,
        global_batch: int | None = None,
        trial_timeout_s: float = 900.0,
        fresh_extra_bytes: int = 0,
        shape: TrialShape = WORKER_TRIAL,
        stop_over_bytes: int | None = None,
    ) -> None:
        self.model, self.node, self.nodes, self.seq_len = model, node, nodes, seq_len
        self.global_batch, self.trial_timeout_s = global_batch, trial_timeout_s
        self.fresh_extra_bytes = fresh_extra_bytes
        self.shape = shape
        # the trials' TrialSpec.stop_over_bytes (request/context.py: the search's limit on GPUs): a trial whose peak
        # is over it stops after its warm-up as over_budget (trial/worker/train_steps.py timed_steps)
        self.stop_over_bytes = stop_over_bytes
        self.world = node.gpus_per_node * nodes
        self.gpu = node.gpu
        self.launched: list[Candidate] = []
        self.fresh_runs: set[int] = set()
        self._worker_up = False  # `run`: whether a warm worker is up for the next trial

    # -- compute ----------------------------------------------------------------------------------
    def _flops_per_sample(self, checkpointing: bool) -> float:
        """Training FLOPs for one sample: forward 2*P*s + attention 4*L*s^2*h, backward twice that;
        checkpointing recomputes the layers' forward (not the embedding/LM head)."""
        m, s = self.model, self.seq_len
        layer_params = max(0, m.total_params - m.embedding_params)
        forward_layers = 2 * layer_params * s + 4 * m.total_layers * s * s * m.hidden_size
        forward = forward_layers + 2 * m.embedding_params * s
        return 3 * forward + (forward_layers if checkpointing else 0)

    def _compute_s(self, micro_batch: int, checkpointing: bool) -> float:
        tokens = micro_batch * self.seq_len
        efficiency = MFU_CEILING * tokens / (tokens + MFU_HALF_TOKENS)
        peak = (self.gpu.peak_bf16_tflops or 100.0) * 1e12
        return micro_batch * self._flops_per_sample(checkpointing) / (peak * efficiency)

    # -- communication -----------------------------------------------------------------------------
    @property
    def bus_gbs(self) -> float:
        """NCCL bus bandwidth of a collective over the whole job: the node's links, or its network across nodes."""
        return self._bus_gbs

    @property
    def _bus_gbs(self) -> float:
        if self.nodes == 1:
            return self.node.collective_gbs
        return min(self.node.collective_gbs, self.node.node_network_gbs)

    def _collective_s(self, bytes_moved_per_rank: float) -> float:
        return bytes_moved_per_rank / (self._bus_gbs * GB) if self.world > 1 else 0.0

    def offloaded_fraction(self, candidate: Candidate) -> float:
        """Share of the optimizer partition on the host: 1 for classic offload, DeepSpeed's sub-group split for a
        ratio (stage3.py:1105: sub-group i offloaded iff i >= int((1 - ratio) * sub_groups)), 0 without offload."""
        if not candidate.rung.offload_optimizer:
            return 0.0
        # DeepSpeed's expression on the ratio autotune writes
        # (autotune.modes.applies.deepspeed_ratio: 0.9 really acts as 0.9)
        on_gpu = device_sub_groups(candidate.mode.offload_ratio, SUB_GROUPS)
        return (SUB_GROUPS - on_gpu) / SUB_GROUPS

    def _check_mode(self, candidate: Candidate) -> None:
        """The simulator models partial offload and ZeRO++ only; anything else would be silently wrong."""
        mode = candidate.mode
        if not models_mode(mode):
            raise ValueError(f"the simulator has no model of {mode.label}")
        zero_plus_plus = mode.hpz_partition_size != 1 or mode.quantized_weights or mode.quantized_gradients
        if zero_plus_plus and candidate.rung.stage != 3:
            raise ValueError("ZeRO++ is a stage-3 mode")
        if mode.offload_ratio != 1.0 and not (candidate.rung.stage == 3 and candidate.rung.offload_optimizer == "cpu"):
            raise ValueError("the offload ratio needs ZeRO-3 with CPU optimizer offload")

    def _stage3_comm_s(self, candidate: Candidate) -> float:
        """Stage 3's two all-gathers and reduce-scatter per micro-step; ZeRO++ as in its paper (see the top)."""
        p, n, mode = self.model.total_params, self.world, candidate.mode
        share = (n - 1) / n
        weights = WEIGHT_BYTES * p
        forward_bytes = share * (QUANTIZED_WEIGHT_BYTES * p if mode.quantized_weights else weights)
        seconds = self._collective_s(forward_bytes)
        hpz = mode.hpz_partition_size
        if hpz > 1 and self.nodes > 1:  # backward all-gather from the secondary partition, inside the node
            seconds += (hpz - 1) / hpz * weights / (self.node.collective_gbs * GB)
        else:
            seconds += self._collective_s(share * weights)
        gradients = share * GRAD_BYTES * p
        if mode.quantized_gradients:  # int4 all-to-all: 1/4 of the volume, intra-node stage on the fast links
            seconds += self._collective_s(QUANTIZED_GRADIENT_FRACTION * gradients)
            if self.nodes > 1:
                seconds += QUANTIZED_GRADIENT_FRACTION * gradients / (self.node.collective_gbs * GB)
        else:
            seconds += self._collective_s(gradients)
        quantized_elements = p * (int(mode.quantized_weights) + int(mode.quantized_gradients))
        bandwidth = (self.gpu.memory_bandwidth_gbs or 1000.0) * GB
        return seconds + quantized_elements * QUANTIZE_BYTES_PER_ELEMENT / bandwidth

    def step_cost(self, candidate: Candidate) -> StepCost:
        self._check_mode(candidate)
        rung, p, n = candidate.rung, self.model.total_params, self.world
        share = (n - 1) / n
        compute = self._compute_s(candidate.micro_batch, candidate.grad_checkpointing)
        latency = COLLECTIVE_LATENCY_S * 3 * self.model.total_layers
        grad_bytes = GRAD_BYTES * p
        micro_s, optimizer_s = compute, 0.0
        if rung.stage == 0:  # all-reduce of the gradients at the accumulation boundary, after backward
            optimizer_s += self._collective_s(2 * share * grad_bytes)
        elif rung.stage in (1, 2):
            if rung.stage == 2:  # gradients reduce-scattered in every backward (overlap_comm off at 1-2)
                micro_s += self._collective_s(share * grad_bytes)
            else:
                optimizer_s += self._collective_s(share * grad_bytes)
            optimizer_s += self._collective_s(share * WEIGHT_BYTES * p)  # updated weights all-gathered
        else:  # stage 3: two all-gathers and a reduce-scatter per micro-step, overlapped (overlap_comm on)
            comm = self._stage3_comm_s(candidate) + latency
            if rung.offload_param:
                host = (self.node.nvme_gbs / self.node.gpus_per_node) if rung.offload_param == "nvme" else None
                link = min(self.node.pcie_gbs, host) if host else self.node.pcie_gbs
                comm += 2 * WEIGHT_BYTES * p / n / (link * GB)  # own shard fetched for forward and backward
            micro_s = max(compute, comm) + latency
        shard = p / n if rung.stage >= 1 else p
        offloaded = self.offloaded_fraction(candidate)
        if rung.offload_optimizer:
            # gradients of the offloaded part go down and its updated bf16 weights come back over PCIe; CPU Adam
            # in between (a partial ratio moves only its share: stage3.py:1342 copies each sub-group's gradients
            # to that sub-group's device)
            host_shard = offloaded * shard
            micro_s += GRAD_BYTES * host_shard / (self.node.pcie_gbs * GB)
            optimizer_s += WEIGHT_BYTES * host_shard / (self.node.pcie_gbs * GB)
            cores = self.node.cpu_cores_per_gpu * CPU_ADAM_PARAMS_PER_CORE_S
            memory_bound = self.node.host_memory_gbs_per_gpu * GB / CPU_ADAM_BYTES_PER_PARAM
            optimizer_s += host_shard / min(cores, memory_bound)
            if rung.offload_optimizer == "nvme":  # optimizer states read and written once per step
                optimizer_s += 2 * OPTIMIZER_BYTES * host_shard * self.node.gpus_per_node / (self.node.nvme_gbs * GB)
        # GPU Adam on what stays: memory-bound pass over 16 bytes read + 12 written per parameter (the partial
        # ratio's GPU sub-groups run torch AdamW, the same memory-bound pass), after the CPU part (sequential)
        optimizer_s += 28 * (1 - offloaded) * shard / ((self.gpu.memory_bandwidth_gbs or 1000.0) * GB)
        return StepCost(micro_s, optimizer_s)

    def accumulation(self, candidate: Candidate) -> int:
        if self.global_batch is None:
            return 1
        return max(1, self.global_batch // (candidate.micro_batch * self.world))

    def samples_per_s(self, candidate: Candidate) -> float:
        cost = self.step_cost(candidate)
        gas = self.accumulation(candidate)
        return candidate.micro_batch * gas * self.world / (gas * cost.micro_s + cost.optimizer_s)

    # -- memory ----------------------------------------------------------------------------------
    def gpu_bytes(self, candidate: Candidate) -> int:
        self._check_mode(candidate)
        m, rung, n, s = self.model, candidate.rung, self.world, self.seq_len
        p = m.total_params
        if rung is Rung.Z0:
            states = (WEIGHT_BYTES + GRAD_BYTES + OPTIMIZER_BYTES) * p
        elif rung is Rung.Z1:
            states = (WEIGHT_BYTES + GRAD_BYTES) * p + OPTIMIZER_BYTES * p / n
        elif rung is Rung.Z2:
            states = WEIGHT_BYTES * p + (GRAD_BYTES + OPTIMIZER_BYTES) * p / n
        elif rung is Rung.Z2_OFFLOAD_OPT:
            states = WEIGHT_BYTES * p
        elif rung is Rung.Z3:
            states = (WEIGHT_BYTES + GRAD_BYTES + OPTIMIZER_BYTES) * p / n
        elif rung in (Rung.Z3_OFFLOAD_OPT, Rung.Z3_NVME_OPT) and rung.offload_param is None:
            states = (WEIGHT_BYTES + GRAD_BYTES) * p / n
        else:
            states = GRAD_BYTES * p / n  # parameters offloaded; gradient partition before it is copied out
        if rung.offload_optimizer == "cpu":  # a partial ratio keeps its GPU sub-groups' optimizer states there
            states += (1 - self.offloaded_fraction(candidate)) * PARTIAL_OFFLOAD_DEVICE_BYTES * p / n
        hpz = candidate.mode.hpz_partition_size
        if hpz > 1:  # hpZ's secondary copy of the bf16 weights, partitioned inside the node (ZeRO++ section 3.2)
            states += WEIGHT_BYTES * p / hpz
        if rung.stage in (1, 2):
            buffers = 2 * 200_000_000 * GRAD_BYTES  # reduce + all-gather buckets (2e8 elements, our dsconfig)
        elif rung.stage == 3:
            buffers = 2 * m.largest_layer_params * WEIGHT_BYTES + 2 * m.hidden_size**2 * WEIGHT_BYTES
        else:
            buffers = 0
        sh = s * m.hidden_size
        if candidate.grad_checkpointing:
            per_sample = m.total_layers * CHECKPOINT_BYTES_PER_SH * sh + ACTIVATION_BYTES_PER_SH * sh
        else:
            per_sample = m.total_layers * ACTIVATION_BYTES_PER_SH * sh
        per_sample += s * m.vocab_size * LOGIT_BYTES_PER_VOCAB
        activations = FRAGMENTATION * per_sample * candidate.micro_batch
        return int(RUNTIME_BYTES + states + buffers + activations)

    def host_bytes_per_node(self, candidate: Candidate) -> int:
        """Pinned host buffers of offload: fp32 master + Adam states + fp32 gradients (+ bf16 params)."""
        rung, p = candidate.rung, self.model.total_params
        per_rank = 0.0
        if rung.offload_optimizer == "cpu":
            offloaded = self.offloaded_fraction(candidate)
            per_rank += offloaded * (OPTIMIZER_BYTES + 4) * p / (self.world if rung.stage >= 1 else 1)
        if rung.offload_param == "cpu":
            per_rank += WEIGHT_BYTES * p / self.world
        return int(per_rank * self.node.gpus_per_node + 8 * GIB * self.node.gpus_per_node)  # + processes

    # -- a trial -----------------------------------------------------------------------------------
    def measured_steps(self, candidate: Candidate) -> int:
        """Whole optimizer steps the worker times for `candidate`: enough_steps' rule on this machine's steps (no
        spread: MIN_STEPS, fewer once MAX_MEASURE_S of them are in)."""
        cycle = self.cycle_seconds(candidate)
        steps = [cycle]
        while not enough_steps(steps, min_steps=self.shape.min_steps):
            steps.append(cycle)
        return len(steps)

    def cycle_seconds(self, candidate: Candidate) -> float:
        """One whole optimizer step: its accumulation's micro-steps and the optimizer step."""
        cost = self.step_cost(candidate)
        return self.accumulation(candidate) * cost.micro_s + cost.optimizer_s

    def ok_steps_seconds(self, candidate: Candidate, *, confirmation: bool = False) -> float:
        """The steps of a trial that runs to its end (see WARMUP_STEPS): warm-up, measured steps, the parts."""
        return sum(self.steps_breakdown(candidate, confirmation=confirmation).values())

    def steps_breakdown(self, candidate: Candidate, *, confirmation: bool = False) -> dict[str, float]:
        """Seconds of a trial that runs to its end, by part: warm-up, measured optimizer steps, and the plain
        micro-steps at its micro-batch and half of it (the search's step-time line; the pick's fresh confirmation
        times no half, TuneContext.confirmation_spec)."""
        cost = self.step_cost(candidate)
        parts = 0.0
        smaller = 0 if confirmation else candidate.micro_batch // 2
        if smaller and self.whole_smaller(candidate):
            parts += self.shape.part_steps * self.cycle_seconds(replace(candidate, micro_batch=smaller))
        else:
            if self.accumulation(candidate) > 1 or smaller:
                parts += self.shape.part_steps * cost.micro_s
            if smaller:
                parts += self.shape.part_steps * self.step_cost(replace(candidate, micro_batch=smaller)).micro_s
        return {
            "warmup": self.shape.warmup_steps * (cost.micro_s + cost.optimizer_s),
            "measured": self.measured_steps(candidate) * self.cycle_seconds(candidate),
            "parts": parts,
        }

    def whole_smaller(self, candidate: Candidate) -> bool:
        """Whether the trial times its smaller micro-batch as whole steps (trial/worker/train_steps.py timed_steps):
        one micro-step per optimizer step at both (no fixed global batch) and a warm-up step after the first."""
        return self.global_batch is None and self.shape.warmup_steps >= 2

    def steps_seconds(
        self, candidate: Candidate, *, confirmation: bool = False, first_in_process: bool = False
    ) -> float:
        """A trial's time after its build: the whole measurement when it runs; its first warm-up step when it runs
        out of memory (FAILED_TRIAL_STEPS); up to the trial timeout when it times out. `first_in_process`: the trial
        is its process's first (`trial_result`), which matters only where `fresh_extra_bytes` moves its peak."""
        status = self.result(candidate).status
        if status == "ok" and self.stops_over(candidate, fresh=confirmation or first_in_process):
            return self.steps_breakdown(candidate)["warmup"]  # it stops after its warm-up (`stops_over`)
        if status == "ok":
            return self.ok_steps_seconds(candidate, confirmation=confirmation)
        if status == "timeout":
            return self.trial_timeout_s - TRIAL_STARTUP_S
        return self.failed_steps_seconds(candidate)

    def failed_steps_seconds(self, candidate: Candidate) -> float:
        """A trial that runs out of memory: its first warm-up step (FAILED_TRIAL_STEPS)."""
        cost = self.step_cost(candidate)
        return FAILED_TRIAL_STEPS * (cost.micro_s + cost.optimizer_s)

    def trial_seconds(self, candidate: Candidate) -> float:
        """One trial in its own process run to its end: start-up, build, steps (what the trial timeout bounds)."""
        return TRIAL_STARTUP_S + self.ok_steps_seconds(candidate)

    def stops_over(self, candidate: Candidate, *, fresh: bool = False) -> bool:
        """Whether the trial runs and its peak (fresh: with `fresh_extra_bytes`) is over `stop_over_bytes`."""
        if self.stop_over_bytes is None or not self.result(candidate).ok:
            return False
        peak = self.gpu_bytes(candidate) + (self.fresh_extra_bytes if fresh else 0)
        return peak <= self.gpu.memory_bytes and peak > self.stop_over_bytes

    def trial_result(self, candidate: Candidate, *, fresh: bool = False, first_in_process: bool = False) -> TrialResult:
        """What autotune's trial reports (`run`; `run_fresh` with fresh=True): `result` (`fresh_result`), or, where
        it stops over the limit after warm-up (`stops_over`), over_budget with that peak and nothing timed. A trial
        that is the first its process runs (fresh, or a warm launch's first) starts from a fresh process's state:
        `fresh_extra_bytes` is on its peaks too, and it says so (TrialResult.first_in_process)."""
        new = fresh or first_in_process
        result = self.fresh_result(candidate) if fresh else self.result(candidate)
        if new and not fresh:
            result = self.with_fresh_extra(candidate, result)
        if not self.stops_over(candidate, fresh=new):
            return replace(result, first_in_process=new)
        ranks = [replace(r, micro_peak_bytes=None, smaller_micro_peak_bytes=None) for r in result.ranks]
        return TrialResult(
            status="over_budget",
            error="over the search's limit after warm-up: stopped before timing",
            ranks=ranks,
            wall_s=TRIAL_STARTUP_S + self.steps_seconds(candidate, confirmation=fresh, first_in_process=new),
            first_in_process=new,
        )

    def run(self, candidate: Candidate) -> tuple[TrialResult, bool]:
        """A trial in the warm workers `launches` groups (WARM_CONFIRMED): the first of its process when none is up,
        after a fresh run or a trial that failed (the pool's replacement)."""
        first = not self._worker_up
        self.launched.append(candidate)
        result = self.trial_result(candidate, first_in_process=first)
        self._worker_up = result.ok or result.status == "over_budget"
        return result, False

    def run_fresh(self, candidate: Candidate) -> tuple[TrialResult, bool]:
        """A trial in a process of its own (Search.confirm_fresh's RunTrial): recorded as a fresh launch."""
        self.fresh_runs.add(len(self.launched))
        self.launched.append(candidate)
        self._worker_up = False  # the pool stopped for it (trial/launch/warm.py FreshAfterWarm)
        return self.trial_result(candidate, fresh=True), False

    def fresh_result(self, candidate: Candidate) -> TrialResult:
        """The confirmation's `result`: no smaller micro-batch timed (TuneContext.confirmation_spec), and
        `fresh_extra_bytes` more on every peak the trial measures (none by default)."""
        result = replace(
            self.result(candidate), smaller_micro_batch=None, smaller_micro_step_s=None, smaller_step_s=None
        )
        result = replace(result, ranks=[replace(r, smaller_micro_peak_bytes=None) for r in result.ranks])
        return self.with_fresh_extra(candidate, result)

    def with_fresh_extra(self, candidate: Candidate, result: TrialResult) -> TrialResult:
        """`result` as a process that ran no trial before measures it: `fresh_extra_bytes` more on every peak (an
        OOM where that passes the card)."""
        if not (self.fresh_extra_bytes and result.ok):
            return result
        extra = self.fresh_extra_bytes
        if self.gpu_bytes(candidate) + extra > self.gpu.memory_bytes:
            return TrialResult(status="oom_gpu", error="torch.OutOfMemoryError: CUDA out of memory.")
        ranks = [
            replace(
                r,
                device_used_bytes=(r.device_used_bytes or 0) + extra,
                micro_peak_bytes=(r.micro_peak_bytes or 0) + extra,
                smaller_micro_peak_bytes=None
                if r.smaller_micro_peak_bytes is None
                else r.smaller_micro_peak_bytes + extra,
            )
            for r in result.ranks
        ]
        return replace(result, ranks=ranks)

    def trials(self, launcher: Launcher) -> list[tuple[Candidate, bool]]:
        """The trials `launcher` runs, each with whether it runs in a process of its own. The GPU default runs
        everything recorded, the confirmations fresh. The other two do not confirm: the search runs the same trials
        up to its first confirmation (search/pick_decision.py Pick.confirm_fresh is its last step, and this machine
        answers a trial the same every time) and stops there; every trial is fresh under FRESH, none under WARM."""
        if launcher is Launcher.WARM_CONFIRMED:
            return [(c, i in self.fresh_runs) for i, c in enumerate(self.launched)]
        unconfirmed = self.launched[: min(self.fresh_runs, default=len(self.launched))]
        return [(c, launcher is Launcher.FRESH) for c in unconfirmed]

    def launches(self, launcher: Launcher) -> list[Launch]:
        """The trials `launcher` runs, grouped by process. A trial run fresh is a process of its own, and the next
        warm trial starts a new process (trial/launch/warm.py FreshAfterWarm stops the pool first). A warm worker
        (trial/launch/warm.py) runs trial after trial, a fresh model and engine each, until one fails (an OOM, a
        timeout, a
        killed rank); the next trial starts a new one. The pool's other restart, after a worker's memory grew past
        WARM_GROWTH_LIMIT_BYTES, is not simulated."""
        groups: list[Launch] = []
        new_process = True
        confirms = launcher is Launcher.WARM_CONFIRMED  # its fresh trials are the pick's confirmations
        for candidate, fresh in self.trials(launcher):
            if fresh or new_process:
                groups.append(Launch(confirmation=fresh and confirms))
            groups[-1].append(candidate)
            new_process = fresh or not self.result(candidate).ok
        return groups

    def launch_steps_seconds(self, launch: Launch) -> float:
        """The steps of one launch's trials (a confirmation's as it runs: `steps_seconds`)."""
        return sum(self.steps_seconds(c, confirmation=launch.confirmation) for c in launch)

    def tune_seconds(self, launcher: Launcher) -> float:
        """Wall time of `launcher`'s trials: each launch's process start and cold build once, each further trial in
        it a warm build; every trial its steps. A fresh trial is a launch of one: start, cold build, steps."""
        total = 0.0
        for launch in self.launches(launcher):
            total += STARTUP.process_start_s + STARTUP.cold_build_s
            total += self.launch_steps_seconds(launch)
            total += STARTUP.warm_build_s * (len(launch) - 1)
        return total

    def result(self, candidate: Candidate) -> TrialResult:
        peak = self.gpu_bytes(candidate)
        if peak > self.gpu.memory_bytes:
            return TrialResult(status="oom_gpu", error="torch.OutOfMemoryError: CUDA out of memory.")
        if self.host_bytes_per_node(candidate) > self.node.host_ram_bytes:
            return TrialResult(status="oom_host", error="rank 0 was killed by SIGKILL (exit 137)")
        if self.trial_seconds(candidate) > self.trial_timeout_s:
            return TrialResult(status="timeout", error="no result within the trial timeout")
        cost = self.step_cost(candidate)
        gas = self.accumulation(candidate)
        cycle = gas * cost.micro_s + cost.optimizer_s
        smaller = candidate.micro_batch // 2 or None  # autotune's trials also time half the micro-batch
        whole = smaller is not None and self.whole_smaller(candidate)
        smaller_s = self.step_cost(replace(candidate, micro_batch=smaller)).micro_s if smaller and not whole else None
        smaller_step_s = self.cycle_seconds(replace(candidate, micro_batch=smaller)) if smaller and whole else None
        # ...and measure each forward/backward's own peak; this machine's peak is in those passes at any size
        smaller_peak = self.gpu_bytes(replace(candidate, micro_batch=smaller)) if smaller else None
        rank = RankMetrics(
            rank=0,
            device_used_bytes=peak,
            host_rss_peak_bytes=self.host_bytes_per_node(candidate),
            micro_peak_bytes=peak,
            smaller_micro_peak_bytes=smaller_peak,
        )
        return TrialResult(
            status="ok",
            ranks=[rank],
            step_times_s=[cycle] * 5,
            micro_step_s=None if whole else cost.micro_s,
            optimizer_step_s=None if whole else cost.optimizer_s,
            accumulation=gas,
            smaller_micro_batch=smaller,
            smaller_micro_step_s=smaller_s,
            smaller_step_s=smaller_step_s,
            samples_per_s=self.samples_per_s(candidate),
            wall_s=self.trial_seconds(candidate),
        )

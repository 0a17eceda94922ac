"""Which memory modes beyond the classic ladder (modern modes) apply where, read from DeepSpeed 0.19.8's own code.

For one rung and one machine: which modes are worth considering (`considered_modes`, asked by the search), whether
each applies, why not, and whether a trial on this backend can verify it. An offload ratio acts per sub-group in
DeepSpeed, and the default sub_group_size makes most models one sub-group, so `ratio_sub_group_size` gives
dsconfig.build the size at which a ratio means what it says.

Reasoning and sources (partial offload, ZenFlow, ZeRO++, SuperOffload): modes/README.md#applies
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction

from autotune.core.choices import Device, Precision
from autotune.core.ladder import Mode, Rung
from autotune.core.versions import SUPER_OFFLOAD as SUPER_OFFLOAD_FLOOR
from autotune.core.versions import ZENFLOW as ZENFLOW_FLOOR
from autotune.core.versions import installed
from autotune.hardware.specs import Target

# The ratio is searched in steps of 1/RATIO_STEPS, and the emitted sub_group_size cuts each rank's parameters into
# about RATIO_STEPS sub-groups so each step moves one sub-group (stage3.py:1105). 20 steps = 5% granularity;
# more sub-groups only add optimizer-step calls (one per sub-group, stage3.py `_optimizer_step`).
RATIO_STEPS = 20

# Families of modes, the names the report and the CPU-backend table use.
PARTIAL_OFFLOAD = "partial_offload"
ZENFLOW = "zenflow"
HPZ = "hpz"
QUANTIZED_WEIGHTS = "quantized_weights"
QUANTIZED_GRADIENTS = "quantized_gradients"
SUPER_OFFLOAD = "super_offload"
FAMILIES = (PARTIAL_OFFLOAD, ZENFLOW, HPZ, QUANTIZED_WEIGHTS, QUANTIZED_GRADIENTS, SUPER_OFFLOAD)


@dataclass(frozen=True)
class CpuBackendResult:
    """What a real DeepSpeed step did for one mode on the CPU backend (DS_ACCELERATOR=cpu, gloo)."""

    runs: bool
    error: str  # the first line of DeepSpeed's error when it does not run; "" when it does


# MEASURED, not assumed: benchmarks/modes_cpu_backend.py runs one gpt2-tiny DeepSpeed step per mode through
# autotune.trial.run_trial (DeepSpeed 0.19.8, torch 2.13 CPU; ZeRO++ on 2 gloo ranks) and records the outcome in
# benchmarks/results/modes_cpu_backend.json; the slow test tests/test_modes_cpu.py re-runs it against this table.
# The failures, in DeepSpeed's code: qwZ loads QuantizerBuilder (runtime/zero/partition_parameters.py:865) and qgZ
# loads it in all_to_all_quant_reduce (runtime/comm/coalesced_collectives.py:34); the CPU accelerator hands out
# NotImplementedBuilder for it (accelerator/cpu_accelerator.py:352, ops/op_builder/cpu/no_impl.py:21).
# SuperOffload asserts CUDA (runtime/superoffload/superoffload_stage3.py:23-24).
CPU_BACKEND: dict[str, CpuBackendResult] = {
    PARTIAL_OFFLOAD: CpuBackendResult(True, ""),
    ZENFLOW: CpuBackendResult(True, ""),
    HPZ: CpuBackendResult(True, ""),
    QUANTIZED_WEIGHTS: CpuBackendResult(False, "ValueError: This op had not been implemented on CPU backend."),
    QUANTIZED_GRADIENTS: CpuBackendResult(False, "ValueError: This op had not been implemented on CPU backend."),
    SUPER_OFFLOAD: CpuBackendResult(
        False, "AssertionError: SuperOffload only supports NVIDIA CUDA GPUs, but found accelerator 'cpu'."
    ),
}


@dataclass(frozen=True, kw_only=True)
class ModeFacts:
    """What decides whether a mode applies: the layout, the backend, the hardware and the optimizer."""

    nodes: int = 1
    gpus_per_node: int = 1
    device: Device = "cuda"  # "cpu": the CPU backend, DS_ACCELERATOR=cpu
    superchip: bool = False  # host and GPU share a fast coherent link (GH200-class); hardware profile's flag
    ds_optimizer: bool = True  # the config has a DeepSpeed optimizer section (adamw / torch-adamw), not a client one
    precision: Precision = "bf16"  # the training's precision: SuperOffload's update is exact only without a loss scale
    allow_approximate: bool = False  # --allow-approximate: modes that change the update rule or numerics may apply
    deepspeed_version: str | None = None  # the installed DeepSpeed: a mode it predates is not searched (core/versions)

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


# GPUs that share a coherent NVLink-C2C link with their host CPU (NVIDIA Grace Hopper / Grace Blackwell), the
# hardware SuperOffload is built for (DeepSpeed SuperOffload tutorial and arXiv:2509.21271: GH200, GB200). AMD's
# MI300A is a superchip too, but superoffload_stage3.py:23 asserts CUDA. Matched in the GPU's profile key or name
# (profiles/hardware/gh200.json; a probe reports e.g. "NVIDIA GH200 480GB").
SUPERCHIP_MARKERS = ("gh200", "gb200", "grace")


def is_superchip(gpu_key: str, gpu_name: str) -> bool:
    text = f"{gpu_key} {gpu_name}".lower()
    return any(marker in text for marker in SUPERCHIP_MARKERS)


def facts_for(
    target: Target,
    device: str,
    ds_optimizer: bool = True,
    precision: Precision = "bf16",
    allow_approximate: bool = False,
) -> ModeFacts:
    """ModeFacts for a planning or tuning target: its layout, backend and whether its GPU is a superchip."""
    return ModeFacts(
        nodes=target.nodes,
        gpus_per_node=target.gpus_per_node,
        device="cpu" if device == "cpu" else "cuda",
        superchip=device != "cpu" and is_superchip(target.gpu.key, target.gpu.name),
        ds_optimizer=ds_optimizer,
        precision=precision,
        allow_approximate=allow_approximate,
        deepspeed_version=installed("deepspeed"),
    )


# What each mode that is not the same training changes, in one line (the summary's words when one is picked).
# Read in DeepSpeed 0.19.8 (paths relative to the `deepspeed` package):
# - ZenFlow: runtime/zenflow/zenflow_stage_1_and_2.py selects the top-k gradient columns (topk_ratio) and steps
#   them each iteration; the other columns' updates are accumulated and applied every update_interval steps on
#   the CPU (runtime/zenflow/engine.py:48-69): a different optimizer algorithm.
# - qwZ / qgZ: runtime/zero/config.py:328-343; weights are all-gathered as int8 blocks
#   (partition_parameters.py:1491-1496, CUDAQuantizer) and gradients reduce-scattered as int4
#   (runtime/comm/coalesced_collectives.py:34, all_to_all_quant_reduce): lossy numerics.
# - Partial offload ratio: the sub-groups kept on the device step with a torch AdamW built ONCE from param group 0's
#   lr/betas/eps/weight_decay (runtime/zero/stage3.py:313-322, used at 1256-1258) while an lr scheduler updates the
#   ZeRO optimizer's param_groups, which are DeepSpeedCPUAdam's (stage3.py:3345-3349): under any lr schedule the
#   device share keeps the initial lr, and a type "Adam" (L2) config gets decoupled (AdamW) decay there.
# - SuperOffload: exact in bf16/fp32: CPU sub-groups step asynchronously during backward with the group's current
#   lr (superoffload/superoffload_stage3.py:169-178), rolled back on overflow or a non-finite norm (205-218), and
#   stepped only after unscaling and clipping when gradient_clipping is set (248-253). In fp16 without clipping the
#   asynchronous step sees the loss-SCALED gradient (the unscale comes later, 243), so Adam's eps acts as eps/scale.
# - hpZ is exact: the secondary partition is dropped after every optimizer step (stage3.py:2835-2846,
#   invalidate_secondary_tensor 755-759) and rebuilt by copying the updated parameter (partition_parameters.py:
#   1940-1947), so forward/backward all-gather the same 16-bit weights; only the gather's process group changes.
APPROXIMATE_FLAG = "--allow-approximate"


def approximation(mode: Mode, facts: ModeFacts) -> str:
    """What `mode` changes about the training, in one line; "" when it trains the same model the same way."""
    changes = []
    if mode.zenflow:
        changes.append(
            "ZenFlow updates only the top-k gradient columns each step and applies the rest later on the CPU"
            " (a different optimizer algorithm)"
        )
    if mode.quantized_weights:
        changes.append("ZeRO++ qwZ all-gathers weights as int8 (lossy)")
    if mode.quantized_gradients:
        changes.append("ZeRO++ qgZ reduce-scatters gradients as int4 (lossy)")
    if mode.offload_ratio != 1.0:
        changes.append(
            "partial offload steps its device share with a torch AdamW fixed at the initial lr/betas/weight decay"
            " (an lr schedule does not reach it; stage3.py:313-322)"
        )
    if mode.super_offload and facts.precision == "fp16":
        changes.append("SuperOffload in fp16 steps on loss-scaled gradients (Adam's eps scaled)")
    return "; ".join(changes)


def _same_training_only(option: ModeOption, facts: ModeFacts) -> ModeOption:
    """An applicable mode that changes the training applies only with the explicit opt-in."""
    what = approximation(option.mode, facts)
    if not option.applies or not what or facts.allow_approximate:
        return option
    reason = f"changes the training ({what}); tried only with {APPROXIMATE_FLAG}"
    return ModeOption(option.mode, option.family, False, reason, trial_verifiable=False)


@dataclass(frozen=True)
class ModeOption:
    """One mode considered for one rung: whether it applies, why (not), and whether a trial here can verify it."""

    mode: Mode
    family: str
    applies: bool
    reason: str
    trial_verifiable: bool

    def to_dict(self) -> dict:
        return {
            "mode": self.mode.to_dict(),
            "family": self.family,
            "label": self.mode.label,
            "applies": self.applies,
            "reason": self.reason,
            "trial_verifiable": self.trial_verifiable,
        }


def ratio_mode(ratio: float) -> Mode:
    """The partial-offload Mode for `ratio`, rounded to the searched 1/RATIO_STEPS grid (1.0 = classic offload)."""
    if not 0.0 <= ratio <= 1.0 or math.isnan(ratio):
        raise ValueError(f"offload ratio must be within 0..1, got {ratio}")
    return Mode(offload_ratio=round(ratio * RATIO_STEPS) / RATIO_STEPS)


def ratio_grid() -> list[float]:
    """Every ratio the search may try, 0 .. 1 in 1/RATIO_STEPS steps."""
    return [step / RATIO_STEPS for step in range(RATIO_STEPS + 1)]


def ratio_sub_group_size(trainable_params: int, world_size: int, steps: int = RATIO_STEPS) -> int:
    """The sub_group_size (elements per rank) that cuts each rank's share into about `steps` sub-groups.

    DeepSpeed partitions every parameter over all ranks (`param.partition_numel()`, ceil(numel / world)) and cuts
    sub-groups from that per-rank share (stage3.py:1212-1226), so the per-rank share divided by `steps` gives
    `steps` sub-groups, each of which then holds about 1/steps of the optimizer states.
    """
    per_rank = math.ceil(trainable_params / max(1, world_size))
    return max(1, math.ceil(per_rank / steps))


# Sub-group counts per rank `deepspeed_ratio` keeps exact. dsconfig cuts about RATIO_STEPS (ratio_sub_group_size);
# a few more (a tiny trailing sub-group, stage3.py:1210-1233) and a user's own sizes are covered with room to spare.
MAX_EXACT_SUB_GROUPS = 8 * RATIO_STEPS


def _intended_device_sub_groups(ratio: float, sub_groups: int) -> int:
    """floor((1 - ratio) x n) in exact arithmetic: the count `ratio` means (the grid's ratios are k / RATIO_STEPS)."""
    keep = 1 - Fraction(ratio).limit_denominator(RATIO_STEPS * 1000)
    return math.floor(keep * sub_groups)


@functools.lru_cache(maxsize=256)  # a pure function of one float, asked once per estimate: memoised
def deepspeed_ratio(ratio: float) -> float:
    """The offload ratio to WRITE so DeepSpeed keeps exactly floor((1 - ratio) x n) sub-groups on the device.

    DeepSpeed computes `int((1 - ratio) * n)` in floating point (stage3.py:1105), so e.g. (1 - 0.9) * 20 is
    1.9999999999999996 and ratio 0.9 acts as 0.95 (one device sub-group, not two); 0.8 acts as 0.85. The value
    written is `ratio` moved down by the fewest floating-point steps for which DeepSpeed's own expression gives
    the intended count for every n up to MAX_EXACT_SUB_GROUPS (a few ULPs: (1 - r) x n is a multiple of
    1 / RATIO_STEPS, so the nudge never reaches the next count). Ratios the expression already gets right come
    back unchanged (0.5, 0.25, 0.75, ...).
    """
    if not 0.0 <= ratio <= 1.0 or math.isnan(ratio):
        raise ValueError(f"offload ratio must be within 0..1, got {ratio}")
    written = ratio
    for _ in range(64):
        counts = range(1, MAX_EXACT_SUB_GROUPS + 1)
        if all(int((1.0 - written) * n) == _intended_device_sub_groups(ratio, n) for n in counts):
            return written
        written = math.nextafter(written, 0.0)
    raise ValueError(f"no floating-point offload ratio near {ratio} keeps DeepSpeed's sub-group count exact")


def device_sub_groups(ratio: float, sub_groups: int, as_written: bool = False) -> int:
    """Sub-groups DeepSpeed keeps on the device: its own int((1 - r) * n) (stage3.py:1105) on the value the config
    carries: `deepspeed_ratio(ratio)` for autotune's configs (dsconfig writes that), `ratio` itself for a
    user's config (`as_written`), where DeepSpeed's truncation applies as it stands."""
    written = ratio if as_written else deepspeed_ratio(ratio)
    return int((1.0 - written) * max(1, sub_groups))


def offloaded_fraction(ratio: float, sub_groups: int = RATIO_STEPS, as_written: bool = False) -> float:
    """The fraction of sub-groups DeepSpeed really puts on the CPU for `ratio` (stage3.py:1105).

    Sub-group i stays on the device when i < int((1 - ratio) * n): the device share is rounded DOWN, so the host
    share is at least `ratio`. With one sub-group (DeepSpeed's default size on models < 1e9 params per rank) any
    ratio > 0 offloads everything.
    """
    sub_groups = max(1, sub_groups)
    return 1.0 - device_sub_groups(ratio, sub_groups, as_written) / sub_groups


def cpu_backend_result(family: str) -> CpuBackendResult:
    return CPU_BACKEND[family]


def _verifiable(family: str, facts: ModeFacts) -> bool:
    """A trial on this backend can run the mode: on a GPU every mode can; on the CPU backend only measured ones."""
    return facts.device != "cpu" or CPU_BACKEND[family].runs


def _option(mode: Mode, family: str, facts: ModeFacts, why_not: str | None, why: str) -> ModeOption:
    applies = why_not is None
    reason = why if why_not is None else why_not
    return ModeOption(mode, family, applies, reason, trial_verifiable=applies and _verifiable(family, facts))


def _partial_offload(rung: Rung, facts: ModeFacts) -> ModeOption:
    mode = ratio_mode(0.5)  # a representative point; the search bisects the ratio itself
    why_not = None
    if rung.stage != 3:
        why_not = "partial offload (offload_optimizer.ratio < 1) is ZeRO-3 only (runtime/zero/config.py:396-400)"
    elif rung.offload_optimizer != "cpu":
        why_not = (
            "the ratio splits CPU-offloaded optimizer states; the NVMe swap path ignores it (stage3.py:1117-1121)"
            if rung.offload_optimizer == "nvme"
            else "needs optimizer offload to the CPU: it is the knob between this rung's neighbours"
        )
    elif rung.offload_param is not None:
        why_not = "considered on ZeRO-3 + optimizer offload only: with parameters offloaded the rung is memory-bound"
    elif not facts.ds_optimizer:
        why_not = "needs DeepSpeed's own Adam (stage3.py:317: 'Hybrid Optimizer Only Supports DeepSpeedCPUAdam')"
    why = "offloads only a fraction of the optimizer states: between ZeRO-3 and ZeRO-3 + optimizer offload"
    return _option(mode, PARTIAL_OFFLOAD, facts, why_not, why=why)


def _zenflow(rung: Rung, facts: ModeFacts) -> ModeOption:
    why_not = None
    if rung.stage not in (1, 2) or rung.offload_optimizer != "cpu":
        why_not = "ZenFlow is built for stages 1-2 with CPU optimizer offload (zenflow_stage_1_and_2.py:111-115)"
    elif not facts.ds_optimizer:
        why_not = "ZenFlow wraps DeepSpeed's own CPU Adam (engine.py:2386-2398), not a client optimizer"
    else:
        why_not = ZENFLOW_FLOOR.missing(facts.deepspeed_version)
    why = "updates the top-k gradient columns on the GPU, the rest asynchronously on the CPU"
    return _option(Mode(zenflow=True), ZENFLOW, facts, why_not, why=why)


def _zero_plus_plus(rung: Rung, facts: ModeFacts) -> list[ModeOption]:
    why_not = None
    if rung.stage != 3:
        why_not = "ZeRO++ partitions and quantizes ZeRO-3 parameter traffic (runtime/zero/config.py:324-340)"
    elif facts.nodes < 2:
        why_not = "ZeRO++ cuts inter-node traffic; on one node there is none to cut (arXiv:2306.10209 section 3)"
    elif facts.gpus_per_node < 2:
        why_not = "hpZ needs more than one GPU per node to hold the secondary partition"
    elif rung.offload_param is not None:
        why_not = "with parameters offloaded the hpZ copy lives on the host (partition_parameters.py:1915)"
    per_node = max(2, facts.gpus_per_node)
    choices = [
        (
            Mode(hpz_partition_size=per_node),
            HPZ,
            f"keeps a secondary 16-bit parameter partition per node ({per_node} ranks): all-gathers stay in the node",
        ),
        (
            Mode(quantized_weights=True, quantized_gradients=True),
            QUANTIZED_WEIGHTS,
            "int8 weight all-gather and int4 gradient reduce-scatter: half/quarter the inter-node bytes",
        ),
        (
            Mode(hpz_partition_size=per_node, quantized_weights=True, quantized_gradients=True),
            HPZ,
            "full ZeRO++ (hpZ + qwZ + qgZ), as DeepSpeed's ZeRO++ tutorial configures it",
        ),
    ]
    applies = why_not is None
    return [
        ModeOption(
            mode,
            family,
            applies,
            why if why_not is None else why_not,
            trial_verifiable=applies and _zpp_verifiable(mode, facts),
        )
        for mode, family, why in choices
    ]


def _zpp_verifiable(mode: Mode, facts: ModeFacts) -> bool:
    families = [HPZ] if mode.hpz_partition_size > 1 else []
    families += [QUANTIZED_WEIGHTS] if mode.quantized_weights else []
    families += [QUANTIZED_GRADIENTS] if mode.quantized_gradients else []
    return all(_verifiable(family, facts) for family in families)


def _super_offload(rung: Rung, facts: ModeFacts) -> ModeOption:
    why_not = None
    if rung.stage != 3 or rung.offload_optimizer != "cpu" or rung.offload_param is not None:
        why_not = "SuperOffload replaces the ZeRO-3 optimizer-offload optimizer (engine.py:2749); other rungs lack it"
    elif not facts.superchip:
        why_not = "SuperOffload is tuned for superchips (GH200-class coherent host link); this hardware is not one"
    elif not facts.ds_optimizer:
        why_not = "SuperOffload builds its own CPU Adam from the config's optimizer section"
    else:
        why_not = SUPER_OFFLOAD_FLOOR.missing(facts.deepspeed_version)
    why = "stage-3 offload for superchips: CPU Adam on cpuadam_cores_perc of the cores, overlapped with backward"
    return _option(Mode(super_offload=True), SUPER_OFFLOAD, facts, why_not, why=why)


def considered_modes(rung: Rung, facts: ModeFacts) -> list[ModeOption]:
    """Every modern mode considered on `rung`, in a fixed order: partial offload, ZenFlow, ZeRO++, SuperOffload.

    Each says whether it applies here and why (not); the report lists them all so a user sees what was weighed.
    """
    options = [_partial_offload(rung, facts), _zenflow(rung, facts)]
    options += _zero_plus_plus(rung, facts)
    options.append(_super_offload(rung, facts))
    return [_same_training_only(option, facts) for option in options]


def applicable_modes(rung: Rung, facts: ModeFacts) -> list[Mode]:
    """The modes that apply on `rung` (partial offload stands for its whole ratio range)."""
    return [option.mode for option in considered_modes(rung, facts) if option.applies]


def mode_applies(rung: Rung, mode: Mode, facts: ModeFacts) -> bool:
    """Whether this exact mode may be emitted on `rung` (the classic mode always may)."""
    if mode.is_classic:
        return True
    if approximation(mode, facts) and not facts.allow_approximate:
        return False
    if mode.offload_ratio != 1.0:
        other = Mode(offload_ratio=1.0, **{k: v for k, v in mode.to_dict().items() if k != "offload_ratio"})
        return _partial_offload(rung, facts).applies and (other.is_classic or mode_applies(rung, other, facts))
    if mode.zenflow:
        return _zenflow(rung, facts).applies and mode == Mode(zenflow=True)
    if mode.super_offload:
        return _super_offload(rung, facts).applies and mode == Mode(super_offload=True)
    return _zero_plus_plus(rung, facts)[0].applies


def mode_trial_verifiable(mode: Mode, facts: ModeFacts) -> bool:
    """Whether a trial on facts.device can run `mode` (every part of it)."""
    families = []
    if mode.offload_ratio != 1.0:
        families.append(PARTIAL_OFFLOAD)
    if mode.zenflow:
        families.append(ZENFLOW)
    if mode.super_offload:
        families.append(SUPER_OFFLOAD)
    return _zpp_verifiable(mode, facts) and all(_verifiable(family, facts) for family in families)


def mode_from_zero_section(zero: dict) -> Mode:
    """The Mode a user's `zero_optimization` section runs (the inverse of dsconfig.mode_fields), for `check`."""
    offload = zero.get("offload_optimizer") or {}
    hpz = zero.get("zero_hpz_partition_size", 1)
    return Mode(
        offload_ratio=float(offload.get("ratio", 1.0)) if offload.get("device", "none") != "none" else 1.0,
        zenflow=zero.get("zenflow") is not None,
        hpz_partition_size=int(hpz) if hpz not in (None, "auto", 0) else 1,
        quantized_weights=bool(zero.get("zero_quantized_weights", False)),
        quantized_gradients=bool(zero.get("zero_quantized_gradients", False)),
        super_offload=bool(offload.get("super_offload", False)),
    )

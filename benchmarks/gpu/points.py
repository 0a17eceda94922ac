"""What the GPU validation kit measures: the memory points, the OOM probes, the tune and the grid.

Plain data, read top to bottom. The full kit targets one 80-141 GB Hopper card; the dry run swaps in tiny
models on the CPU backend so every stage's code runs in CI.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autotune.core.ladder import Mode, Rung

EMULATED_CARD_GIB = 24  # the card the OOM, tune and grid stages emulate (RTX 3090/4090/A10G class)


@dataclass(frozen=True)
class MemoryPoint:
    model: str
    rung: Rung
    micro_batch: int
    seq_len: int
    grad_checkpointing: bool = False
    mode: Mode = field(default_factory=Mode)  # a modern memory mode; classic by default (the key is then unchanged)
    zero_init: bool = True  # ZeRO-3 built under deepspeed.zero.Init; False: whole on the GPU first (key gains a tag)
    # an autotune.training.optimizers name; torch-adamw loads no DeepSpeed op, so it runs while the ops build (key tag)
    optimizer: str = "adamw"

    @property
    def key(self) -> str:
        ckpt = "+ckpt" if self.grad_checkpointing else ""
        mode = "" if self.mode.is_classic else "/" + "+".join(self.mode.parts)
        init = "" if self.zero_init else "/no-zero-init"
        optimizer = "" if self.optimizer == "adamw" else f"/{self.optimizer}"
        return f"{self.model}/{self.rung.value}{ckpt}/mb{self.micro_batch}/s{self.seq_len}{mode}{init}{optimizer}"


def _points(*rows: tuple) -> list[MemoryPoint]:
    return [MemoryPoint(m, Rung(r), mb, s, ck) for m, r, mb, s, ck in rows]


# ZeRO-3 without zero.Init (a script that builds the model before DeepSpeed starts): the whole 16-bit model reaches
# the GPU before it is partitioned. Whether its freed blocks stay cached and only the step's parameter-sized tensors
# reuse them (estimate/buffers.py reserve_left_after_reuse), or DeepSpeed's defragment empties the cache, is read,
# not measured; each is the twin of a zero.Init point of the list below.
NO_ZERO_INIT_POINTS = [
    MemoryPoint("llama-3.2-1b", Rung.Z3, 4, 1024, True, zero_init=False),
    MemoryPoint("llama-3.2-3b", Rung.Z3_OFFLOAD_OPT, 8, 1024, True, zero_init=False),
]

# Two llama-class sizes (1.24B and 3.21B), every rung, checkpointing on and off, bf16, on the whole card. On one
# GPU ZeRO 0-2 partition nothing: a 3.21B model's 16 B/param of states (~48 GiB) plus activations is predicted at
# 81-87 GiB with its margin and the unpressured cache, so the 3B points are ZeRO-3 or offload; every point is
# predicted at most 70 GiB (tests/test_gpu_kit.py), so none OOMs on an 80 GB card instead of giving a peak.
# Ordered so that an interrupted run has both sizes, the offload rungs and the zero.Init question early.
GPU_MEMORY_POINTS = [
    *_points(
        ("llama-3.2-1b", "z0", 4, 1024, False),
        ("llama-3.2-1b", "z2+offload_opt", 4, 1024, False),
        ("llama-3.2-1b", "z3", 4, 1024, True),
        ("llama-3.2-3b", "z3", 2, 1024, True),
        ("llama-3.2-3b", "z3+offload_opt+param", 4, 1024, True),
    ),
    *NO_ZERO_INIT_POINTS,
    *_points(
        ("llama-3.2-1b", "z0", 4, 1024, True),
        ("llama-3.2-1b", "z1", 4, 1024, False),
        ("llama-3.2-1b", "z2", 8, 1024, False),
        ("llama-3.2-1b", "z3+offload_opt+param", 8, 1024, True),
        ("llama-3.2-1b", "z0", 8, 1024, True),
        ("llama-3.2-3b", "z2+offload_opt", 4, 1024, False),
        ("llama-3.2-3b", "z3", 1, 1024, True),
        ("llama-3.2-3b", "z3+offload_opt", 8, 1024, True),
        ("llama-3.2-1b", "z1", 8, 1024, True),
    ),
]

# The one-command lease (benchmarks/gpu/lease.sh), ordered by what the GPU default rests on (issue 42). First the
# points the warm stage re-runs, measured fresh: llama-3.2-1b ZeRO-0 and ZeRO-3 with torch's AdamW, which loads no
# DeepSpeed op, so both (and the warm pool after them) run while the ops build. ZeRO-3 is also the sampler point:
# timed with the NVML sampler at 10 ms and at 1 s (its cost to a ZeRO-3 step, unmeasured so far).
LEASE_WARM_POINTS = [
    MemoryPoint("llama-3.2-1b", Rung.Z0, 4, 1024, False, optimizer="torch-adamw"),
    MemoryPoint("llama-3.2-1b", Rung.Z3, 4, 1024, True, optimizer="torch-adamw"),
]
SAMPLER_PERIODS_S = (0.01, 1.0)  # the default (trial/trial_types.py SAMPLE_PERIOD_S) and one 100x longer
# The remaining memory points, last in the lease, cheapest first (1B without offload, then 1B offload, then the
# 3B offload point and the zero.Init twin): ZeRO 0-3, optimizer and parameter offload, checkpointing on and off,
# one without zero.Init. Each is predicted (+ the unpressured extra + its margin) at most ~60 GiB, well inside an
# 80 GB card (tests/test_gpu_kit.py checks it).
LEASE_MEMORY_POINTS = [
    *_points(
        ("llama-3.2-1b", "z1", 4, 1024, False),
        ("llama-3.2-1b", "z2", 8, 1024, False),
        ("llama-3.2-1b", "z2+offload_opt", 4, 1024, False),
        ("llama-3.2-1b", "z3+offload_opt+param", 8, 1024, True),
    ),
    NO_ZERO_INIT_POINTS[0],
    *_points(("llama-3.2-3b", "z3+offload_opt", 8, 1024, True)),
]
# The smoke trial, right after the install and beside the op builds: a tiny model, ZeRO-0, torch's AdamW (no
# DeepSpeed op), one step, through the real trial path (LocalLauncher, the worker, DeepSpeed's engine).
SMOKE_POINT = MemoryPoint("tiny-llama", Rung.Z0, 1, 64, False, optimizer="torch-adamw")

DRY_MEMORY_POINTS = [
    *_points(
        ("tiny-llama", "z0", 4, 128, False),
        ("tiny-llama", "z2+offload_opt", 4, 128, True),
        ("tiny-gpt2", "z3", 2, 128, False),
    ),
    MemoryPoint("tiny-gpt2", Rung.Z3, 2, 128, False, zero_init=False),
]
DRY_WARM_POINTS = [
    MemoryPoint("tiny-llama", Rung.Z0, 4, 128, False, optimizer="torch-adamw"),
    MemoryPoint("tiny-gpt2", Rung.Z3, 2, 128, False, optimizer="torch-adamw"),
]

# Cold-H200 wall times per item, seconds: estimates until a lease measures them (lease.json `stages`, each row's
# `phases`), read from issue 42's account of the lease at 92c6f6a. The CPU dry run of the lease sleeps each item up
# to these (kit.py --emulate-h200), so its test checks the plan fits the budget with them, not with CPU times.
H200_WALL_S = {
    "smoke": 15.0,  # tiny model, one step: interpreter, imports, CUDA context, engine
    "point": 25.0,  # a 1B point without offload, fresh (the issue: 1B non-offload re-runs 10-25 s)
    "warm": 15.0,  # the same in a warm worker: start-up paid once
    "offload": 75.0,  # an offload point (the issue: 45-100 s)
    "oom": 40.0,  # the first OOM probe: fails at engine init
    "tune_trial": 75.0,  # the tune's trials on the emulated card are offload trials
}


# Whose memory the peak is (trial/worker/peak_sites.py): a few memory points again, now recording every allocation with
# its Python stack. Separate trials because the recording costs host RAM (the trace), which would spoil the memory
# stage's host-RAM figures; GPU memory is not touched by it, so each site row also checks its allocated peak
# against its memory-stage twin. ZeRO-3 with full offload first: the published set's worst points (LlamaFactory
# #5977, #7282) are that config, 34-39% above the model, and this says which part of the step holds the rest.
GPU_SITE_POINTS = [
    MemoryPoint("llama-3.2-3b", Rung.Z3_OFFLOAD_ALL, 4, 1024, True),
    MemoryPoint("llama-3.2-1b", Rung.Z3, 4, 1024, True),
    MemoryPoint("llama-3.2-3b", Rung.Z3, 2, 1024, True),
    MemoryPoint("llama-3.2-1b", Rung.Z0, 4, 1024, False),
]
# The CPU backend has no allocation trace (peak_sites.py says why): the dry run's rows carry that note, which
# checks the request's way from the kit through the worker and back.
DRY_SITE_POINTS = DRY_MEMORY_POINTS[:2]


@dataclass(frozen=True)
class OomProbe:
    """One config under the emulated card: expect_oom says what the memory model predicts."""

    point: MemoryPoint
    expect_oom: bool


GPU_OOM_PROBES = [
    OomProbe(MemoryPoint("llama-3.2-3b", Rung.Z0, 8, 1024), expect_oom=True),  # predicted ~3x the card
    OomProbe(MemoryPoint("llama-3.2-1b", Rung.Z2_OFFLOAD_OPT, 2, 1024, True), expect_oom=False),
    OomProbe(MemoryPoint("llama-3.2-1b", Rung.Z0, 64, 1024), expect_oom=True),  # activations, not states
]
LEASE_OOM_PROBES = GPU_OOM_PROBES[:2]  # one predicted ~3x over (OOMs at engine init, quick), one that fits
DRY_OOM_PROBES = [
    OomProbe(MemoryPoint("gpt2-small-demo", Rung.Z0, 64, 256), expect_oom=True),
    OomProbe(MemoryPoint("tiny-llama", Rung.Z0, 2, 64), expect_oom=False),
]


@dataclass(frozen=True)
class ModesSetting:
    """Partial optimizer offload on the emulated card beside its two neighbours, ZeRO-3 and ZeRO-3 + offload.

    The kit adds the smallest ratio the memory model says fits (a scan of autotune.modes.applies.ratio_grid) to
    `ratios`, so the run shows whether "offload just enough" fits and how fast it is against both neighbours.
    """

    model: str
    micro_batch: int
    seq_len: int
    grad_checkpointing: bool
    ratios: tuple[float, ...]
    steps: int = 5
    # The other modes, run once each on the same card: whether they run at all on this GPU, their memory beside
    # the prediction, and their speed. qwZ/qgZ and SuperOffload cannot run on the CPU backend (autotune.modes.applies.
    # CPU_BACKEND), so this is their only trial; ZeRO++ on one GPU exercises the quantizer ops, not the traffic.
    others: tuple[tuple[Rung, Mode], ...] = ()


# llama-3.2-1b (1.24B): ZeRO-3 keeps ~18 B/param = ~22 GB of model states on one GPU, over a 24 GB card with
# activations; ZeRO-3 + offload keeps ~2 B/param. The ratios in between are the point of the stage. Predicted
# today (autotune's estimate, micro-batch 4, seq 1024, checkpointing): ZeRO-3 25.8 GiB (over), ratio 0.5 23.3 GiB
# (over), ratio 0.8 17.9 GiB + 2.6 GiB margin (the smallest that fits, so the kit adds it), full offload 11.8 GiB;
# 0.7 sits at the edge. Re-computed by the kit at run time; these figures only say why the ratios were chosen.
GPU_MODES = ModesSetting(
    "llama-3.2-1b",
    4,
    1024,
    True,
    (0.5, 0.7),
    others=(
        (Rung.Z2_OFFLOAD_OPT, Mode(zenflow=True)),
        (Rung.Z3_OFFLOAD_OPT, Mode(super_offload=True)),
        (Rung.Z3_OFFLOAD_OPT, Mode(quantized_weights=True, quantized_gradients=True)),
    ),
)
DRY_MODES = ModesSetting(
    "gpt2-small-demo", 2, 128, False, (0.5,), steps=3, others=((Rung.Z2_OFFLOAD_OPT, Mode(zenflow=True)),)
)


@dataclass(frozen=True)
class TuneSetting:
    """The tune stage and the grid it is judged against: same model, card, rungs and micro-batches."""

    model: str
    seq_len: int
    max_trials: int
    grid_micro_batches: tuple[int, ...]
    rungs: tuple[Rung, ...] = tuple(r for r in Rung if not r.needs_nvme)  # NVMe needs a path and libaio
    grid_checkpointing: tuple[bool, ...] = (False, True)
    rerun_steps: int = 50  # the choice re-run: long enough for a speed beside the tune's trial
    min_tune_s: float = 300.0  # start the tune only with this much budget left (estimates until measured)
    rerun_s: float = 240.0  # kept back from the tune's --time-budget for the re-run
    # kept back too: the search checks its budget only before a trial, and the pick's fresh confirmation runs
    # after it (search/ladder_walk.py, search/pick_decision.py), so one trial and one fresh process may overrun it
    reserve_s: float = 0.0

    @property
    def rungs_arg(self) -> str:
        return ",".join(r.value for r in self.rungs)


GPU_TUNE = TuneSetting("llama-3.2-1b", 1024, 12, (1, 2, 4, 8, 16, 32))
# The lease's quick tune: the same card and model, a few trials, a short re-run.
# On the 24 GB card only offload fits llama-3.2-1b (estimate: ZeRO-3 25.8 GiB at micro-batch 4, GPU_MODES above):
# the rungs are the two offload ones, at most 2 trials, and the tune's --time-budget keeps `reserve_s` back, one
# offload trial plus the pick's fresh confirmation (H200_WALL_S), which the search runs after its budget check.
# The choice's long re-run is left to the full kit (rerun_s 0): the lease's minutes go to the OOM classes instead.
LEASE_TUNE = TuneSetting(
    "llama-3.2-1b", 1024, 2, (1, 2, 4, 8), rungs=(Rung.Z2_OFFLOAD_OPT, Rung.Z3_OFFLOAD_OPT), rerun_steps=20,
    min_tune_s=200.0, rerun_s=0.0, reserve_s=2 * H200_WALL_S["tune_trial"],
)  # fmt: skip
# The grid covers the tune's whole space, checkpointing included: on a loaded machine a checkpointed candidate can
# measure fastest on the tiny model, and a choice outside the grid could not be compared with the grid's best.
DRY_TUNE = TuneSetting(
    "tiny-llama", 64, 4, (1, 4), rungs=(Rung.Z0, Rung.Z3), rerun_steps=10, min_tune_s=60.0, rerun_s=60.0
)
# The lease's dry run: the dry tune's model and rungs under the lease's trial cap, reserve and no re-run, so its
# gating is the one the GPU lease runs (with --emulate-h200 the stage takes the lease tune's cold-H200 wall).
DRY_LEASE_TUNE = TuneSetting(
    "tiny-llama", 64, LEASE_TUNE.max_trials, (1, 4), rungs=(Rung.Z0, Rung.Z3), rerun_steps=10,
    min_tune_s=LEASE_TUNE.min_tune_s, rerun_s=0.0, reserve_s=LEASE_TUNE.reserve_s,
)  # fmt: skip


@dataclass(frozen=True)
class SideBySide:
    """compare_tuners.py arguments: autotune vs DeepSpeed Autotuning (fast mode) vs the exhaustive grid."""

    args: tuple[str, ...]


GPU_SIDE_BY_SIDE = SideBySide(
    (
        "--device", "cuda", "--model", "llama-3.2-1b", "--seq-len", "1024", "--micro-batches", "1,2,4,8",
        "--emulate-gpu-gb", str(EMULATED_CARD_GIB), "--tight-budget", "none", "--threads", "0",
        "--autotune-rungs", "z0,z1,z2,z2+offload_opt,z3,z3+offload_opt,z3+offload_opt+param",
    )
)  # fmt: skip
# DeepSpeed's autotuner is left out of the dry run: on CPU it alone takes ~9 minutes (benchmarks/results/compare.md).
DRY_SIDE_BY_SIDE = SideBySide(
    ("--device", "cpu", "--model", "tiny-gpt2", "--seq-len", "64", "--micro-batches", "1", "--repeats", "1",
     "--steps", "2", "--warmup", "1", "--tight-budget", "none", "--launcher", "warm", "--skip-ds")
)  # fmt: skip

"""DeepSpeed Autotuning's search strategy (fast mode), replayed on the simulated cluster.

A transcription of deepspeed 0.19.8 `autotuning/autotuner.py` (`tune`, `tune_space`,
`get_min_max_micro_batch_size`, `get_tuning_micro_batch_size_list`, `run_tuning_micro_batch_sizes`):
ZeRO stages 0-3 in order, micro-batch only, no offload, no gradient checkpointing (it does not tune
either: issues deepspeedai/DeepSpeed#3379, #3478). One model-info profile launch first. Its memory
figures: instantiation memory by its own formula (fp16/bf16: 2+2+16 bytes per parameter, partitioned by
stage) and activation memory per sample from the profile run (here: the simulator's true value).
Experiments it would repeat are counted once, in its favour. It gets the same per-GPU memory
limit as autotune (headroom x memory): a trial over it fails.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from autotune.core.ladder import Candidate, Rung
from gpu_sim.machine import TRIAL_STARTUP_S, SimulatedCluster

METRIC_PERCENT_DIFF_CONST = 0.05  # deepspeed/autotuning/constants.py:21
MAX_MICRO_BATCH = 1024  # autotuning config default max_train_micro_batch_size_per_gpu
NUM_TUNING_MICRO_BATCH_SIZES = 3  # autotuning config default
STAGE_RUNGS = (Rung.Z0, Rung.Z1, Rung.Z2, Rung.Z3)
# An experiment runs whole optimizer steps until DeepSpeed's engine exits it: `global_steps == end_profile_step + 1`
# (runtime/engine.py:3657-3658), end_profile_step 5 by default (autotuning/constants.py:62): 6 steps. An experiment
# that runs out of memory fails in its first step (as autotune's trials: SimulatedCluster.failed_steps_seconds).
EXPERIMENT_STEPS = 5 + 1


@dataclass
class DsRun:
    machine: SimulatedCluster
    memory_limit: float  # the same per-GPU limit autotune gets (as --gpu-memory-fraction would enforce)
    # autotuning config `max_train_batch_size` (autotuner.py:250-256): a user with a fixed global batch sets it,
    # which caps the micro-batch at that batch / GPUs; gas = its per-GPU share // micro-batch (autotuner.py:759)
    max_train_batch_size: int | None = None
    records: dict[Candidate, float] = field(default_factory=dict)  # experiment -> metric (0 = failed)
    launches: int = 1  # the model-info profile run
    # the user's script's gradient checkpointing, which DeepSpeed Autotuning keeps as it is in every experiment
    checkpointing: bool = False

    def experiment(self, rung: Rung, micro_batch: int) -> float:
        candidate = Candidate(rung, micro_batch, self.checkpointing)
        if candidate not in self.records:
            self.launches += 1
            result = self.machine.result(candidate)
            within = self.machine.gpu_bytes(candidate) <= self.memory_limit
            self.records[candidate] = (result.samples_per_s or 0.0) if result.ok and within else 0.0
        return self.records[candidate]

    @property
    def max_micro_batch(self) -> int:
        """autotuner.py `max_train_micro_batch_size_per_gpu` (lines 250-256)."""
        if self.max_train_batch_size:
            return min(MAX_MICRO_BATCH, self.max_train_batch_size // self.machine.world)
        return MAX_MICRO_BATCH

    # --- autotuner.py -----------------------------------------------------------------------------
    def instantiation_bytes(self, stage: int) -> float:
        p, n = self.machine.model.total_params, self.machine.world
        params, grads, optimizer = 2.0 * p, 2.0 * p, 16.0 * p
        if stage >= 1:
            optimizer /= n
        if stage >= 2:
            grads /= n
        if stage >= 3:
            params /= n
        return params + grads + optimizer

    def activation_bytes(self) -> float:
        one = Candidate(Rung.Z3_OFFLOAD_ALL, 1, self.checkpointing)
        two = Candidate(Rung.Z3_OFFLOAD_ALL, 2, self.checkpointing)
        return float(self.machine.gpu_bytes(two) - self.machine.gpu_bytes(one))

    def min_max(self, rung: Rung, prev_max: int, calculated_max: int) -> tuple[int, int]:
        if prev_max > calculated_max:
            return -1, -1
        used: list[int] = []
        low_start = prev_max if prev_max >= 1 else 1
        if not self.experiment(rung, low_start):
            return -1, -1
        used.append(low_start)
        max_mb = min(calculated_max, self.max_micro_batch)
        for mb in (math.ceil(1.05 * max_mb), max_mb, int(0.95 * max_mb)):
            if mb > self.max_micro_batch or mb < 1:
                continue
            if mb in used:
                return low_start, mb
            if self.experiment(rung, mb):
                return low_start, mb
        prev_metric = self.records.get(Candidate(rung, low_start, self.checkpointing))
        low, high = low_start, max_mb
        while low <= high:
            mid = (low + high) // 2
            if mid not in used:
                metric = self.experiment(rung, mid)
                if metric:
                    low = mid + 1
                    used.append(mid)
                    if prev_metric and (metric - prev_metric) / prev_metric < METRIC_PERCENT_DIFF_CONST:
                        break
                    prev_metric = metric
                else:
                    high = mid - 1
            else:
                low = mid + 1
        return low_start, low - 1

    def tuning_list(self, min_mb: int, max_mb: int) -> list[int]:
        if min_mb <= 0 or max_mb <= 0:
            return []
        min_mb = max(min_mb, max_mb // 2)
        stride = max(1, (max_mb - min_mb) // NUM_TUNING_MICRO_BATCH_SIZES)
        return [mb for mb in range(min_mb, max_mb, stride) if max_mb // mb != 1] + [max_mb]

    def tune_space(self, rung: Rung, prev_max: int) -> tuple[int, int, float]:
        gpu = self.memory_limit
        calculated_max = int((gpu - self.instantiation_bytes(rung.stage)) // self.activation_bytes())
        if calculated_max < prev_max:
            return 0, 0, 0.0
        min_mb, max_mb = self.min_max(rung, prev_max, calculated_max)
        if max_mb < prev_max or max_mb <= 0:
            return 0, 0, 0.0
        sizes = self.tuning_list(min_mb, max_mb)
        for mb in sizes:
            self.experiment(rung, mb)
        best_metric = self.records.get(Candidate(rung, max_mb, self.checkpointing), 0.0)
        lowest = sizes[-2] + 1 if len(sizes) > 1 else min_mb
        stride = max(1, (max_mb - lowest) // 3)
        for mb in reversed(range(lowest, max_mb, stride)):
            metric = self.experiment(rung, mb)
            if metric and metric > best_metric * (1 + METRIC_PERCENT_DIFF_CONST):
                best_metric = metric
            else:
                break
        space = {c: v for c, v in self.records.items() if c.rung is rung and v}
        if not space:
            return max_mb, 0, 0.0
        fast_best = max(space, key=space.get)  # type: ignore[arg-type]
        return max_mb, fast_best.micro_batch, space[fast_best]

    def tune(self) -> Candidate | None:
        activation = self.activation_bytes()
        max_mbs = mbs = 0
        for rung in STAGE_RUNGS:
            if self.memory_limit <= self.instantiation_bytes(rung.stage) + activation:
                continue
            next_max, next_mbs, _ = self.tune_space(rung, max_mbs)
            if next_mbs > mbs:
                mbs, max_mbs = next_mbs, next_max
        ran = {c: v for c, v in self.records.items() if v}
        return max(ran, key=ran.get, default=None)  # type: ignore[arg-type]


def ds_autotuning(
    machine: SimulatedCluster, memory_limit: float, max_train_batch_size: int | None = None, checkpointing: bool = False
) -> tuple[Candidate | None, int, float]:
    """DeepSpeed Autotuning's pick, the launches it spent (profile run included) and their simulated seconds (the
    profile run counted as one start-up); a trial whose peak is
    over `memory_limit` fails, as it would on a card of that size. `max_train_batch_size`: its autotuning config
    key, set to a fixed global batch (it then never exceeds that batch, though a micro-batch that does not divide
    the per-GPU share runs a smaller one: gas is floored). `checkpointing`: the user's script checkpoints (it is not
    tuned, kept in every experiment)."""
    run = DsRun(machine, memory_limit, max_train_batch_size, checkpointing=checkpointing)
    pick = run.tune()
    wall = TRIAL_STARTUP_S + sum(experiment_seconds(machine, c) for c in run.records)
    return pick, run.launches, wall


def experiment_seconds(machine: SimulatedCluster, candidate: Candidate) -> float:
    """One experiment in its own process: start-up, build, EXPERIMENT_STEPS whole steps (one when it fails)."""
    if not machine.result(candidate).ok:
        return TRIAL_STARTUP_S + machine.failed_steps_seconds(candidate)
    return TRIAL_STARTUP_S + EXPERIMENT_STEPS * machine.cycle_seconds(candidate)

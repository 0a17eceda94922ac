"""What one launch of a trial costs on the whole allocation: start-up, build, and the GPU time it holds.

The launch accounting of `machine.SimulatedCluster` charges every launch the start-up we measured on the CPU
backend (`machine.STARTUP`: one 2-core VM, tiny GPT-2). On a multi-node allocation a launch costs more, and this
module adds only what it can derive:
- the model's first broadcast, which every build pays once per trial: under ZeRO-3 `zero.Init` broadcasts every
  parameter from rank 0 as it is made (deepspeed 0.19.8 runtime/zero/partition_parameters.py:1204-1206), at stages
  0-2 the engine broadcasts the module (runtime/engine.py:2038 `_broadcast_model`); either way the 16-bit model
  once over the job's collective bandwidth (`SimulatedCluster.bus_gbs`, the network's across nodes);
- the GPU time: every launch holds the whole allocation (all `world` GPUs) for its start-up, build and steps.
What grows with the allocation in practice and has no figure here: srun's spawn of the ranks over many nodes, the
TCPStore rendezvous of every rank, NCCL's communicator bootstrap, imports from a shared file system. Published
figures exist only at thousands of ranks (pytorch/pytorch#124982: torchelastic's rendezvous 373 s at 4000 hosts
before its fix, 10 s after; pytorch/gloo#408: gloo process-group init ~82 s at 2k ranks before, ~18 s after), none
at the 16-512 ranks simulated here, so nothing is charged for them: every start-up figure is a lower bound, and
`extra_gpu_hours_per_startup_minute` says what each unmodelled minute per launch would add.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpu_sim.machine import GB, STARTUP, WEIGHT_BYTES, Launch, SimulatedCluster


@dataclass(frozen=True)
class LaunchCosts:
    """Seconds, on one machine: a launch's process start, and a trial's build in a new process or a warm worker."""

    process_start_s: float
    fresh_build_s: float
    warm_build_s: float

    @property
    def fresh_trial_s(self) -> float:
        """A trial in a process of its own, before its steps."""
        return self.process_start_s + self.fresh_build_s


def model_broadcast_s(machine: SimulatedCluster) -> float:
    """The 16-bit model broadcast once over the job (see the top); 0 on one GPU."""
    if machine.world <= 1:
        return 0.0
    return WEIGHT_BYTES * machine.model.total_params / (machine.bus_gbs * GB)


def launch_costs(machine: SimulatedCluster) -> LaunchCosts:
    """The CPU-measured start-up (a lower bound) with the model's broadcast on every build."""
    broadcast = model_broadcast_s(machine)
    return LaunchCosts(
        process_start_s=STARTUP.process_start_s,
        fresh_build_s=STARTUP.cold_build_s + broadcast,
        warm_build_s=STARTUP.warm_build_s + broadcast,
    )


def launches_seconds(machine: SimulatedCluster, launches: list[Launch]) -> float:
    """Wall of trials grouped by process (each Launch one process, its candidates in order): each launch its process
    start and a fresh build, each further trial in it a warm build; every trial its steps."""
    costs = launch_costs(machine)
    total = 0.0
    for launch in launches:
        total += costs.fresh_trial_s + costs.warm_build_s * (len(launch) - 1)
        total += machine.launch_steps_seconds(launch)
    return total


def gpu_hours(seconds: float, gpus: int) -> float:
    return seconds * gpus / 3600


def extra_gpu_hours_per_startup_minute(launches: int, gpus: int) -> float:
    """What one more minute of start-up per launch (the unmodelled part, see the top) adds to a tune."""
    return launches * 60 * gpus / 3600

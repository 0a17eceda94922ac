"""How a multi-node tune could run its trials (issue 44), replayed on the simulated cluster.

- today: the default runs every trial of a multi-node tune as a fresh launch of the whole job
  (autotune.trial.launch.chooser.choose_launch: several nodes run srun or hostfile trials), so each trial pays the
  allocation's start-up and nothing is confirmed apart (every trial already ran fresh);
- (a) warm workers across nodes: one launch of persistent workers on every node runs trial after trial, the pick
  confirmed in a fresh full launch (the single-node GPU default's accounting, `Launcher.WARM_CONFIRMED`), a new
  launch after a failure; either the worker releases the ZeRO++ process groups DeepSpeed keeps in its globals
  (that accounting as it is) or it is replaced after each trial that leaves them (`keeps_process_groups`,
  `warm_across_nodes`);
- (b) search small, confirm at scale: autotune's search on one node (and on two when asked) with warm workers, the
  memory model calibrated on those trials (autotune.estimate's real `estimate` with the search's `Calibration`)
  placing every candidate at the full world size, and only the top candidates run at full scale, each a fresh full
  launch; the fastest of those that fit is the pick. That search-side logic does not exist in
  `autotune.search`; it is simulated here (`small_then_scale`).
The machine's truth is `SimulatedCluster`'s own physics; the estimate is consulted only as the design would consult
it, to choose what to run, never to judge it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from autotune.core.choices import Device
from autotune.core.ladder import Candidate, Mode, Rung
from autotune.estimate.estimate_types import Calibration, EstimateSettings
from autotune.estimate.peak import estimate
from autotune.hardware.specs import Target
from autotune.search.records import SearchOutcome
from autotune.search.state import largest_where
from autotune.trial.launch.chooser import JobFacts, LaunchChoice, choose_launch
from gpu_sim.machine import Launch, Launcher, SimulatedCluster
from gpu_sim.scale import gpu_hours, launches_seconds
from gpu_sim.scenarios import Scenario

Chooser = Callable[[JobFacts], LaunchChoice]


def scenario_job(nodes: int, device: Device = "cuda") -> JobFacts:
    """The job a scenario stands for, as the chooser sees it: `autotune tune` with `--trial-workers auto` (the
    default); several GPU nodes inside a SLURM allocation (the chooser refuses several GPU nodes outside SLURM
    without a node list: trial/launch/chooser.py choose_launch)."""
    return JobFacts(nodes=nodes, device=device, trial_workers="auto", in_slurm=nodes > 1)


def launcher_of(choice: LaunchChoice) -> Launcher:
    """The simulator's launcher for the chooser's answer. Warm workers: a kind that names them ("warm" today; a
    multi-node pool may get a kind of its own, e.g. "warm_srun") or a choice that says so (a truthy `warm`
    attribute); then `confirm_fresh` adds the pick's fresh full-scale confirmation. Every other kind (fresh, srun,
    hostfile, local_nodes, own_command) starts a process per trial."""
    warm = "warm" in choice.kind or bool(getattr(choice, "warm", False))
    if not warm:
        return Launcher.FRESH
    return Launcher.WARM_CONFIRMED if choice.confirm_fresh else Launcher.WARM


def default_launcher(nodes: int, device: Device = "cuda", choose: Chooser = choose_launch) -> Launcher:
    """The launcher autotune's default gives a tune of `nodes` nodes, read from the one launcher chooser
    (trial/launch/chooser.py choose_launch), not restated here: when the chooser runs warm workers across nodes,
    the benchmark follows. `choose`: another chooser's answer (tests; the record's "warm across nodes" run)."""
    return launcher_of(choose(scenario_job(nodes, device)))


def warm_across_nodes_chooser(facts: JobFacts) -> LaunchChoice:
    """The answer issue 44's design (a) gives (records/multinode_design_sim_2026-11-29.md): several nodes run
    warm workers across nodes with the pick confirmed in a fresh full-scale launch; one node as the real chooser
    says. Injected to show what the new default will report before the chooser gives it."""
    if facts.nodes > 1 and facts.trial_workers == "auto" and facts.command is None:
        return LaunchChoice("warm", confirm_fresh=facts.device != "cpu")
    return choose_launch(facts)


def keeps_process_groups(candidate: Candidate) -> bool:
    """Whether a trial leaves process groups in deepspeed.utils.groups' globals that the next trial of a warm worker
    would trip on (deepspeed 0.19.8):
    - hpZ (zero_hpz_partition_size > 1): stage3.py:753 and partition_parameters.py:1119 call
      `groups._create_zero_param_parallel_group`, which asserts `_ZERO_PARAM_INTRA_PARALLEL_GROUP is None`
      (groups.py:936-939) and sets it (952): a second hpZ engine in the same process fails the assertion;
    - qgZ (zero_quantized_gradients): engine.py:2161 calls `groups._get_local_all_to_all_group`, which makes new
      groups into `_ALL_TO_ALL_GROUP` on every call (groups.py:738-765) and nothing destroys the old ones: each
      trial leaves NCCL communicators (their device buffers) behind.
    A worker could instead release them: `deepspeed.comm.destroy_process_group(group)` for each of those groups
    (comm.py:186-196), which calls `groups._release_process_group_references` (groups.py:89-150) to drop the
    reference. Not built; the simulation replaces the worker (the costlier choice). qwZ alone makes no group."""
    mode = candidate.mode
    return mode.hpz_partition_size > 1 or mode.quantized_gradients


def warm_across_nodes(machine: SimulatedCluster) -> list[Launch]:
    """Design (a)'s launches: the GPU default's (a new one after a failure and around each fresh confirmation), and
    a new one after every trial that `keeps_process_groups`."""
    launches: list[Launch] = []
    for launch in machine.launches(Launcher.WARM_CONFIRMED):
        current = Launch(confirmation=launch.confirmation)
        for candidate in launch:
            current.append(candidate)
            if keeps_process_groups(candidate):
                launches.append(current)
                current = Launch(confirmation=launch.confirmation)
        if current:
            launches.append(current)
    return launches


@dataclass(frozen=True)
class FullScale:
    """The full job the design must tune: its machine (truth), what the search sees, and the grid it may pick in."""

    machine: SimulatedCluster
    target: Target
    settings: EstimateSettings
    micro_batches: list[int]
    modes: dict[Rung, list[Mode]]  # every mode setting per rung (the exhaustive reference's)
    headroom: float

    @property
    def limit(self) -> float:
        return self.headroom * self.machine.gpu.memory_bytes

    def fits(self, candidate: Candidate) -> bool:
        """Measured at full scale: runs, and within the headroom (device and host)."""
        machine = self.machine
        host_ok = machine.host_bytes_per_node(candidate) <= self.headroom * machine.node.host_ram_bytes
        return machine.result(candidate).ok and machine.gpu_bytes(candidate) <= self.limit and host_ok


def small_scenario(scenario: Scenario, nodes: int) -> Scenario:
    """The job on `nodes` nodes with the same per-rank batch (the global batch shrunk with the world), so the
    micro-batch grid and the accumulation are the full job's."""
    if scenario.global_batch is None:
        return replace(scenario, nodes=nodes)
    return replace(scenario, nodes=nodes, global_batch=scenario.global_batch * nodes // scenario.nodes)


def calibration_at(world: int, measured: list[tuple[int, Calibration]]) -> Calibration:
    """The calibration to place candidates at `world` ranks. One small world: its own. Two: the fixed offset (what
    the model misses per rank, a part of it in partitions that shrink with the world) extrapolated as a + b / N
    through both; the activation slopes of the larger world (activations per rank do not depend on N)."""
    if len(measured) == 1:
        return measured[0][1]
    (n1, c1), (n2, c2) = sorted(measured, key=lambda item: item[0])[:2]
    b = (c1.overhead_bytes - c2.overhead_bytes) / (1 / n1 - 1 / n2)
    a = c2.overhead_bytes - b / n2
    return replace(c2, overhead_bytes=int(a + b / world))


def predicted_largest(full: FullScale, calibration: Calibration, group: Candidate) -> Candidate | None:
    """The largest micro-batch of `group`'s rung, checkpointing and mode the calibrated estimate places within the
    headroom at the full world size (bisection: the prediction grows with the micro-batch)."""
    host_limit = full.headroom * full.machine.node.host_ram_bytes

    def fits(micro_batch: int) -> bool:
        candidate = replace(group, micro_batch=micro_batch)
        predicted = estimate(full.machine.model, full.target, candidate, full.settings, calibration=calibration)
        return predicted.gpu_peak_bytes <= full.limit and predicted.host_ram_bytes <= host_limit

    best = largest_where(full.micro_batches, fits)
    return replace(group, micro_batch=best) if best is not None else None


def every_group(full: FullScale) -> list[Candidate]:
    """One candidate per rung x checkpointing x mode (micro-batch 1 stands for the group)."""
    return [
        Candidate(rung, 1, ckpt, mode) for rung in full.modes for mode in full.modes[rung] for ckpt in (False, True)
    ]


def _group_key(candidate: Candidate) -> tuple:
    return candidate.rung, candidate.grad_checkpointing, candidate.mode


@dataclass
class SmallSearch:
    """One small search: its world, its machine (launch accounting) and what it measured."""

    nodes: int
    machine: SimulatedCluster
    outcome: SearchOutcome


def measured_speeds(searches: list[SmallSearch]) -> dict[tuple, float]:
    """Per group, the best samples/s per GPU a small search measured within its headroom; where two worlds measured
    a group, the larger world's (closer to the full job's traffic)."""
    speeds: dict[tuple, float] = {}
    for small in sorted(searches, key=lambda s: s.nodes):
        own: dict[tuple, float] = {}
        for record in small.outcome.trials:
            if record.within_headroom and record.result.samples_per_s:
                key = _group_key(record.candidate)
                own[key] = max(own.get(key, 0.0), record.result.samples_per_s / small.machine.world)
        speeds.update(own)
    return speeds


def small_then_scale(
    full: FullScale,
    scenario: Scenario,
    search: Callable[[Scenario], tuple[SimulatedCluster, SearchOutcome]],
    small_nodes: tuple[int, ...] = (1,),
    top: int = 3,
    unmeasured_at_scale: bool = False,
) -> dict:
    """Design (b). `search(scenario)`: autotune's search on that scenario's cluster (warm workers, no confirmation:
    the full-scale runs are its confirmation). The full-scale runs: the `top` groups by measured speed among those
    the calibrated estimate places within the headroom at full scale, each at its largest predicted micro-batch; with
    `unmeasured_at_scale`, also every group placed there that no small search measured (it did not fit small, or
    the search never tried it). A full-scale run over the headroom is followed by the next smaller micro-batch of
    its group (a wrong calibration costs a launch). Every full-scale run is a fresh launch of the whole job."""
    searches = [SmallSearch(n, *search(small_scenario(scenario, n))) for n in small_nodes]
    calibration = calibration_at(full.machine.world, [(s.machine.world, s.outcome.calibration) for s in searches])
    speeds = measured_speeds(searches)
    placed = [c for g in every_group(full) if (c := predicted_largest(full, calibration, g)) is not None]
    measured = sorted((c for c in placed if _group_key(c) in speeds), key=lambda c: -speeds[_group_key(c)])
    chosen = measured[:top]
    if unmeasured_at_scale:
        chosen += [c for c in placed if _group_key(c) not in speeds]
    runs, fitting = run_at_scale(full, chosen)
    machine = full.machine
    pick = max(fitting, key=machine.samples_per_s, default=None)
    small_walls = [(launches_seconds(s.machine, s.machine.launches(Launcher.WARM)), s.machine.world) for s in searches]
    small_s = sum(seconds for seconds, _ in small_walls)
    small_busy = sum(gpu_hours(seconds, gpus) for seconds, gpus in small_walls)
    full_s = launches_seconds(machine, [Launch([c]) for c in runs])
    return {
        "small_nodes": list(small_nodes),
        "top": top,
        "unmeasured_at_scale": unmeasured_at_scale,
        "small_launches": sum(len(s.machine.launches(Launcher.WARM)) for s in searches),
        "small_trials": sum(len(s.machine.launched) for s in searches),
        "placed_at_scale": len(placed),
        "unmeasured_placed": sum(_group_key(c) not in speeds for c in placed),
        "full_runs": [c.key + (":fits" if full.fits(c) else ":" + _why_not(full, c)) for c in runs],
        "full_launches": len(runs),
        "pick": pick.key if pick else None,
        "samples_per_s": machine.samples_per_s(pick) if pick else 0.0,
        "simulated_wall_s": round(small_s + full_s, 1),
        "gpu_hours_allocation": round(gpu_hours(small_s + full_s, machine.world), 1),
        "gpu_hours_busy": round(small_busy + gpu_hours(full_s, machine.world), 1),
    }


def run_at_scale(full: FullScale, chosen: list[Candidate]) -> tuple[list[Candidate], list[Candidate]]:
    """Each chosen candidate in a fresh full launch; one that does not fit is followed by the next smaller
    micro-batch of its group. Returns every launch's candidate, in order, and those that fit."""
    runs: list[Candidate] = []
    fitting: list[Candidate] = []
    for candidate in chosen:
        while True:
            runs.append(candidate)
            if full.fits(candidate):
                fitting.append(candidate)
                break
            smaller = [m for m in full.micro_batches if m < candidate.micro_batch]
            if not smaller:
                break
            candidate = replace(candidate, micro_batch=smaller[-1])
    return runs, fitting


def _why_not(full: FullScale, candidate: Candidate) -> str:
    result = full.machine.result(candidate)
    return result.status if not result.ok else "over the headroom"

"""The multi-node accounting of benchmarks/search_quality.py (issue 44): each scenario under the launcher the default
really uses, the start-up of a launch on the whole allocation, and the two candidate designs replayed on the
simulated cluster (benchmarks/gpu_sim/designs.py)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from tests.fakes.simulator import scenario_named, simulated_machine

from autotune.core.ladder import Candidate, Mode, Rung
from autotune.estimate.estimate_types import Calibration
from autotune.trial.launch.chooser import JobFacts, LaunchChoice

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from gpu_sim import designs, scale  # noqa: E402
from gpu_sim.machine import GB, STARTUP, Launch, Launcher  # noqa: E402


def test_the_default_launcher_is_read_from_the_launcher_chooser() -> None:
    """Several nodes run warm workers across the nodes and confirm the pick in a fresh launch of all of them
    (trial/launch/chooser.py choose_launch: one srun step inside SLURM), as one GPU node does; one CPU node runs warm
    without the confirmation."""
    assert designs.default_launcher(1) is Launcher.WARM_CONFIRMED
    assert designs.default_launcher(2) is Launcher.WARM_CONFIRMED
    assert designs.default_launcher(64) is Launcher.WARM_CONFIRMED
    assert designs.default_launcher(1, device="cpu") is Launcher.WARM


def test_the_chooser_is_asked_about_the_scenarios_job() -> None:
    asked: list[JobFacts] = []

    def chooser(facts: JobFacts) -> LaunchChoice:
        asked.append(facts)
        return LaunchChoice("srun")

    assert designs.default_launcher(8, choose=chooser) is Launcher.FRESH
    (facts,) = asked
    assert (facts.nodes, facts.device, facts.trial_workers) == (8, "cuda", "auto")
    assert facts.in_slurm and facts.command is None


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        (LaunchChoice("warm", confirm_fresh=True), Launcher.WARM_CONFIRMED),
        (LaunchChoice("warm"), Launcher.WARM),
        (LaunchChoice("fresh"), Launcher.FRESH),
        (LaunchChoice("srun"), Launcher.FRESH),
        (LaunchChoice("hostfile"), Launcher.FRESH),
        (LaunchChoice("local_nodes"), Launcher.FRESH),
        (LaunchChoice("own_command"), Launcher.FRESH),
        # a multi-node pool with a kind of its own, or a srun choice that says it is warm (nodes2's chooser may
        # answer either way): warm workers, and the fresh full-scale confirmation when it says so
        (SimpleNamespace(kind="warm_srun", confirm_fresh=True), Launcher.WARM_CONFIRMED),
        (SimpleNamespace(kind="srun", warm=True, confirm_fresh=True), Launcher.WARM_CONFIRMED),
        (SimpleNamespace(kind="srun", warm=False, confirm_fresh=False), Launcher.FRESH),
    ],
)
def test_a_chooser_answer_maps_to_the_simulators_launcher(choice: LaunchChoice, expected: Launcher) -> None:
    assert designs.default_launcher(2, choose=lambda facts: choice) is expected


def test_warm_across_nodes_is_the_injected_answer_for_several_nodes_only() -> None:
    injected = designs.warm_across_nodes_chooser
    assert designs.default_launcher(2, choose=injected) is Launcher.WARM_CONFIRMED
    assert designs.default_launcher(64, choose=injected) is Launcher.WARM_CONFIRMED
    assert designs.default_launcher(1, choose=injected) is designs.default_launcher(1)
    assert designs.default_launcher(2, device="cpu", choose=injected) is Launcher.WARM


def test_a_multi_node_scenario_is_counted_warm_across_nodes_and_gets_the_designs() -> None:
    from search_quality import run_scenario

    row = run_scenario(scenario_named("zeropp-wins-across-nodes"))
    assert row["default"]["launcher"] == Launcher.WARM_CONFIRMED.value
    assert row["default"]["launches"] == row["autotune"]["launches"][Launcher.WARM_CONFIRMED.value]
    assert row["default"]["launches"] < row["autotune"]["launches"][Launcher.FRESH.value]
    multi = row["multi_node"]
    today = multi["designs"]["today (fresh per trial)"]
    assert today["full_launches"] == row["autotune"]["launches"][Launcher.FRESH.value]
    released = multi["designs"]["(a) warm across nodes, ZeRO++ groups released"]
    assert released["full_launches"] == row["autotune"]["launches"][Launcher.WARM_CONFIRMED.value]
    replaced = multi["designs"]["(a) warm across nodes, replaced after ZeRO++"]
    assert released["full_launches"] < replaced["full_launches"] < today["full_launches"]
    assert released["pick"] == replaced["pick"] == row["autotune"]["pick"]  # the same search, other processes


def test_a_single_node_scenario_keeps_the_gpu_default_and_has_no_designs() -> None:
    from search_quality import run_scenario

    row = run_scenario(scenario_named("memory-not-binding"))
    assert row["default"]["launcher"] == Launcher.WARM_CONFIRMED.value
    assert row["default"]["launches"] == row["autotune"]["launches"][Launcher.WARM_CONFIRMED.value]
    assert row["multi_node"] is None


def test_the_headline_counts_multi_node_scenarios_apart_under_their_launchers() -> None:
    from search_quality import headline

    rows = [
        {"tune_defaults": {"launches": 2, "launcher": "warm + fresh confirmation"}, "multi_node": None},
        {"tune_defaults": {"launches": 4, "launcher": "warm + fresh confirmation"}, "multi_node": None},
        {"tune_defaults": {"launches": 27, "launcher": "fresh"}, "multi_node": {"designs": {}}},
    ]
    line = headline(rows)
    assert "one node (warm + fresh confirmation): median 3 launches over 2" in line
    assert "several nodes (fresh): median 27 full-allocation launches over 1" in line
    # the chooser runs warm across nodes
    rows[2]["tune_defaults"] = {"launches": 2, "launcher": "warm + fresh confirmation"}
    assert "several nodes (warm + fresh confirmation): median 2 full-allocation launches" in headline(rows)


def test_zeropp_trials_end_a_warm_worker_unless_their_groups_are_released() -> None:
    """hpZ and qgZ leave process groups in deepspeed.utils.groups' globals; qwZ alone makes none."""
    machine = simulated_machine("zeropp-wins-across-nodes")
    plain = Candidate(Rung.Z3, 2, False)
    hpz = Candidate(Rung.Z3, 2, False, Mode(hpz_partition_size=4))
    qwz = Candidate(Rung.Z3, 2, False, Mode(quantized_weights=True))
    qgz = Candidate(Rung.Z3, 2, False, Mode(quantized_weights=True, quantized_gradients=True))
    for candidate in (plain, hpz, plain, qwz, plain, qgz, plain):
        assert machine.result(candidate).ok
        machine.run(candidate)
    assert machine.launches(Launcher.WARM_CONFIRMED) == [[plain, hpz, plain, qwz, plain, qgz, plain]]
    assert designs.warm_across_nodes(machine) == [[plain, hpz], [plain, qwz, plain, qgz], [plain]]
    assert [designs.keeps_process_groups(c) for c in (plain, hpz, qwz, qgz)] == [False, True, False, True]


def test_a_build_pays_the_model_broadcast_over_the_job() -> None:
    """zero.Init / _broadcast_model send the 16-bit model once over the job's collective bandwidth."""
    machine = simulated_machine("sixty-four-nodes-70b")
    node = machine.node  # across nodes the slower of the node's links and its network
    expected = 2 * machine.model.total_params / (min(node.collective_gbs, node.node_network_gbs) * GB)
    assert scale.model_broadcast_s(machine) == pytest.approx(expected)
    costs = scale.launch_costs(machine)
    assert costs.fresh_build_s == pytest.approx(STARTUP.cold_build_s + expected)
    assert costs.warm_build_s == pytest.approx(STARTUP.warm_build_s + expected)
    one, two = Candidate(Rung.Z3, 1, True), Candidate(Rung.Z3, 2, True)
    wall = scale.launches_seconds(machine, [Launch([one, two]), Launch([two])])
    steps = machine.steps_seconds(one) + 2 * machine.steps_seconds(two)
    assert wall == pytest.approx(2 * costs.fresh_trial_s + costs.warm_build_s + steps)
    assert scale.gpu_hours(wall, machine.world) == pytest.approx(wall * 512 / 3600)
    assert scale.extra_gpu_hours_per_startup_minute(3, 512) == pytest.approx(3 * 512 / 60)


def test_the_small_scenario_keeps_the_per_rank_batch() -> None:
    full = scenario_named("sixty-four-nodes-70b")
    small = designs.small_scenario(full, 1)
    assert small.nodes == 1 and small.global_batch * 64 == full.global_batch
    from search_quality import grid

    assert grid(small, 8) == grid(full, 512)


def test_two_small_worlds_extrapolate_the_offset_in_one_over_the_world() -> None:
    at_8 = Calibration(overhead_bytes=3_000_000_000, activation_scales={"nockpt": 1.1})
    at_16 = Calibration(overhead_bytes=2_000_000_000, activation_scales={"nockpt": 1.3})
    assert designs.calibration_at(512, [(8, at_8)]) is at_8
    placed = designs.calibration_at(512, [(16, at_16), (8, at_8)])
    # a + b / N through both: b = 1e9 / (1/8 - 1/16) = 16e9, a = 1e9
    assert placed.overhead_bytes == pytest.approx(1e9 + 16e9 / 512, abs=1)
    assert placed.activation_scales == at_16.activation_scales  # the larger world's slopes


def _full(name: str):
    from search_quality import HEADROOM, cluster, grid, mode_grid, mode_options

    scenario = scenario_named(name)
    machine, target, settings = cluster(scenario)
    full = designs.FullScale(
        machine, target, settings, grid(scenario, machine.world), mode_grid(mode_options(scenario)), HEADROOM
    )
    return scenario, full


def _search(small):
    from search_quality import search

    return search(small, confirm=False)


def test_searching_one_node_misses_what_only_crosses_nodes() -> None:
    """ZeRO++ does not apply on one node (modes/applies.py), so (b)'s small search never measures hpZ; the winner at
    two nodes is hpZ, which (b) finds only by running the unmeasured groups at full scale, one launch each."""
    scenario, full = _full("zeropp-wins-across-nodes")
    top = designs.small_then_scale(full, scenario, _search)
    assert top["pick"] is not None and "hpz" not in top["pick"] and top["full_launches"] == 3
    everything = designs.small_then_scale(full, scenario, _search, unmeasured_at_scale=True)
    assert everything["pick"] is not None and "hpz" in everything["pick"]
    assert everything["full_launches"] > 10 * top["full_launches"]
    assert everything["samples_per_s"] > top["samples_per_s"]


def test_a_calibration_that_underestimates_at_scale_costs_a_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A full-scale run over the headroom is followed by the next smaller micro-batch of its group."""
    scenario, full = _full("multi-node-infiniband")
    wrong = Calibration(overhead_bytes=-12 * 2**30)  # the model thinks 12 GiB less is needed than it says
    monkeypatch.setattr(designs, "calibration_at", lambda world, measured: wrong)
    result = designs.small_then_scale(full, scenario, _search)
    failed = [run for run in result["full_runs"] if not run.endswith(":fits")]
    assert failed and result["full_launches"] > 3
    index = result["full_runs"].index(failed[0])
    before, after = (_group_and_micro_batch(run) for run in result["full_runs"][index : index + 2])
    assert after[0] == before[0] and after[1] < before[1]  # the same group, a smaller micro-batch


def _group_and_micro_batch(run: str) -> tuple[str, int]:
    """'z3/mb16/ckpt/hpz8:fits' -> ('z3/ckpt/hpz8', 16)."""
    parts = run.rsplit(":", 1)[0].split("/")
    return "/".join(parts[:1] + parts[2:]), int(parts[1].removeprefix("mb"))


def test_ds_autotuning_keeps_the_users_checkpointing() -> None:
    """Llama-2-70B at 4096 tokens fits no micro-batch without checkpointing; DeepSpeed Autotuning, which keeps the
    script's checkpointing, finds ZeRO-3 with it on: the design table counts the better of the two for it."""
    from gpu_sim.design_report import ds_at_scale
    from gpu_sim.ds_autotuning import ds_autotuning

    machine = simulated_machine("sixty-four-nodes-70b")
    limit = 0.9 * machine.gpu.memory_bytes
    assert ds_autotuning(machine, limit, 1024)[0] is None
    pick, launches, _ = ds_autotuning(machine, limit, 1024, checkpointing=True)
    assert pick is not None and pick.grad_checkpointing and pick.rung is Rung.Z3
    row = ds_at_scale(machine, limit, 1024)
    assert row["checkpointing"] is True and row["pick"] == pick.key and row["full_launches"] == launches


def test_the_design_table_lists_every_design_of_a_multi_node_row() -> None:
    from gpu_sim.design_report import designs_medians, designs_table

    design = {
        "full_launches": 4,
        "small_launches": 0,
        "simulated_wall_s": 600.0,
        "gpu_hours_allocation": 2.7,
        "pick": "z3/mb2/ckpt",
        "quality": 1.0,
        "vs_ds_autotuning": 1.0,
    }
    row = {
        "scenario": "s",
        "multi_node": {
            "world": 16,
            "designs": {"today": design, "(a)": replace_dict(design, full_launches=2)},
            "ds_autotuning": replace_dict(design, vs_ds_autotuning=None),
        },
    }
    table = designs_table([row, {"scenario": "single", "multi_node": None}])
    assert table.count("| s (16 GPUs) |") == 3 and "single" not in table
    assert designs_medians([row, row]) == {"today": 4, "(a)": 2}


def replace_dict(values: dict, **changes) -> dict:
    return {**values, **changes}


def test_a_candidate_placed_at_scale_is_the_largest_the_estimate_fits() -> None:
    _, full = _full("sixty-four-nodes-70b")
    group = Candidate(Rung.Z3, 1, True)
    placed = designs.predicted_largest(full, Calibration(), group)
    assert placed is not None and placed.micro_batch == max(full.micro_batches)
    tiny = replace(full, headroom=0.01)
    assert designs.predicted_largest(tiny, Calibration(), group) is None

"""The GPU validation kit (benchmarks/gpu/): its bookkeeping with a swapped-in trial runner, and its real dry run.

The fast tests check what the kit decides (errors like for like, resumption, the grid's skip rule, the time
budget) without launching a trial; the slow one runs `validate.sh --dry-run` for real on the CPU backend.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.fakes.launchers import GpuKitTrials

from autotune.core.units import GiB
from autotune.trial import TrialResult, TrialSpec

KIT_DIR = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"


@pytest.fixture
def kit_module(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(KIT_DIR))
    import kit

    return kit


def _kit(kit_module, tmp_path: Path, trials: GpuKitTrials, budget_s: float = 600.0):
    kit = kit_module.Kit(tmp_path / "validation.json", dry_run=True, budget_s=budget_s, run_trial=trials)
    kit.load()
    return kit


def test_memory_rows_put_each_measure_beside_its_like_for_like_prediction(kit_module, tmp_path: Path) -> None:
    trials = GpuKitTrials()
    kit = _kit(kit_module, tmp_path, trials)
    kit_module.stage_memory(kit)
    rows = kit.data["memory"]["rows"]
    assert len(rows) == len(kit_module.DRY_MEMORY_POINTS) == len(trials.specs)
    row = next(iter(rows.values()))
    assert row["predicted_bytes"] > 0 and row["status"] == "ok"
    # The CPU backend's measure is host RSS; the row's error is against exactly that figure.
    expected = round(100 * (row["predicted_bytes"] - row["host_rss_peak_bytes"]) / row["host_rss_peak_bytes"], 1)
    assert row["error_pct_host_rss"] == expected
    assert kit.data["memory"]["summary"]["ok"] == len(rows)


def test_site_rows_record_allocations_and_check_the_recording_against_their_memory_twin(
    kit_module, tmp_path: Path
) -> None:
    trials = GpuKitTrials()
    kit = _kit(kit_module, tmp_path, trials)
    kit_module.stage_memory(kit)
    assert not any(spec.record_peak_sites for spec in trials.specs)  # the memory stage's figures stay clean
    kit_module.stage_sites(kit)
    asked = trials.specs[len(kit_module.DRY_MEMORY_POINTS) :]
    assert len(asked) == len(kit_module.DRY_SITE_POINTS) and all(spec.record_peak_sites for spec in asked)
    rows = kit.data["sites"]["rows"]
    assert set(rows) == {point.key for point in kit_module.DRY_SITE_POINTS}
    for row in rows.values():
        assert row["peak_sites"]["sites"] and row["predicted_components"]
        assert row["allocated_vs_memory_stage_pct"] == 0.0  # same fake peak as its twin


def test_a_point_without_zero_init_is_built_whole_and_predicted_so(kit_module, tmp_path: Path) -> None:
    """The zero.Init twins: the trial builds the whole model first and the prediction carries the cached reserve."""
    trials = GpuKitTrials()
    kit = _kit(kit_module, tmp_path, trials)
    kit_module.stage_memory(kit)
    rows = kit.data["memory"]["rows"]
    twins = [p for p in kit_module.DRY_MEMORY_POINTS if not p.zero_init]
    assert twins and all(p.key.endswith("/no-zero-init") for p in twins)
    for point in twins:
        row = rows[point.key]
        assert row["zero_init"] is False
        assert row["predicted_components"]["unpartitioned_model_reserve"] > 0
    built = {spec.zero_init for spec in trials.specs}
    assert built == {True, False}
    import points

    keys = {p.key for p in points.GPU_MEMORY_POINTS}
    for point in points.NO_ZERO_INIT_POINTS:  # each has its zero.Init twin in the list, to compare like for like
        twin = points.MemoryPoint(point.model, point.rung, point.micro_batch, point.seq_len, point.grad_checkpointing)
        assert point.key in keys and twin.key in keys


def test_gpu_errors_subtract_what_lives_outside_torch(kit_module) -> None:
    row = {
        "predicted_bytes": 10 * GiB,
        "predicted_components": {"cuda_context": GiB, "nccl_buffers": GiB, "allocator_slack": GiB},
        "nvml_peak_bytes": 10 * GiB,  # the trial process's own (trial/worker/memory.py): other tenants are not in it
        "nvml_baseline_bytes": 11 * GiB,
        "max_reserved_bytes": 8 * GiB,
        "max_allocated_bytes": 7 * GiB,
        "pressured": True,
        "predicted_unpressured_extra_bytes": 2 * GiB,
    }
    errors = kit_module._errors(row, "cuda")
    assert errors == {"error_pct_nvml": 0.0, "error_pct_reserved": 0.0, "error_pct_allocated": 0.0}


def test_on_the_whole_card_reserved_and_nvml_are_compared_with_the_unpressured_extra(kit_module) -> None:
    row = {
        "predicted_bytes": 10 * GiB,
        "predicted_components": {"cuda_context": GiB, "nccl_buffers": GiB, "allocator_slack": GiB},
        "nvml_peak_bytes": 12 * GiB,
        "max_reserved_bytes": 10 * GiB,
        "max_allocated_bytes": 7 * GiB,  # what tensors need: no cache, so no extra
        "pressured": False,
        "predicted_unpressured_extra_bytes": 2 * GiB,
    }
    assert kit_module._errors(row, "cuda") == {
        "error_pct_nvml": 0.0,
        "error_pct_reserved": 0.0,
        "error_pct_allocated": 0.0,
    }


def test_rows_record_the_extra_the_phases_and_the_stack_predicted_with(kit_module, tmp_path: Path) -> None:
    class PhasedTrials(GpuKitTrials):
        def __call__(self, spec: TrialSpec) -> TrialResult:
            result = super().__call__(spec)
            return dataclasses.replace(result, phases={"imports": 3.0, "engine_init": 2.0}, startup_s=6.0)

    kit = _kit(kit_module, tmp_path, PhasedTrials())
    kit_module.stage_memory(kit)
    for row in kit.data["memory"]["rows"].values():
        assert row["phases"] == {"imports": 3.0, "engine_init": 2.0} and row["startup_s"] == 6.0
        assert "predicted_unpressured_extra_bytes" in row and row["pressured"] is True  # CPU: an RSS budget
        assert set(row["predicted_stack"]) >= {"torch_version", "cuda_version", "compute_capability"}


def test_the_tunes_re_run_keeps_the_chosen_mode(kit_module, tmp_path: Path) -> None:
    trials = GpuKitTrials()
    kit = _kit(kit_module, tmp_path, trials)
    choice = {"rung": "z3+offload_opt", "micro_batch": 2, "grad_checkpointing": True, "mode": {"offload_ratio": 0.6}}
    kit.data["tune"] = {"result": {"choice": {**choice, "samples_per_s": 5.0}}}
    kit_module.stage_tune(kit, tmp_path)
    offload = trials.specs[-1].ds_config["zero_optimization"]["offload_optimizer"]
    assert offload["ratio"] == 0.6
    rerun = kit.data["tune"]["rerun"]
    assert rerun["mode"]["offload_ratio"] == 0.6 and "0.6" in rerun["key"]
    setting = kit_module._tune_setting(kit)
    grid_key = kit_module.choice_point(setting, choice).key
    assert grid_key == rerun["key"]


def test_gpu_points_leave_room_on_an_80_gb_card(kit_module) -> None:
    """Predicted (+ its margin + the unpressured cache) at most 70 GiB: a point must give a peak, not an OOM."""
    import points

    from autotune.core.ladder import Candidate
    from autotune.estimate.runtime import RuntimeStack
    from autotune.hardware.specs import Target, generic_gpu
    from estimate_accuracy import predicted_trial

    h100 = RuntimeStack(
        "2.11.0+cu130", "13.0", None, "9.0", transformers_version="5.17.0", deepspeed_version="0.19.8"
    )  # the lent machine's stack
    card = int(79.1 * GiB)  # an H100 80GB as CUDA reports it
    target = Target(generic_gpu(card), gpus_per_node=1, nodes=1, free_memory_bytes=card)
    for point in {*points.GPU_MEMORY_POINTS, *points.LEASE_MEMORY_POINTS, *points.GPU_SITE_POINTS}:
        candidate = Candidate(point.rung, point.micro_batch, point.grad_checkpointing, point.mode)
        _, predicted, _ = predicted_trial(
            point.model, candidate, point.seq_len, target, "cuda", "bf16", zero_init=point.zero_init, stack=h100
        )
        need = predicted.gpu_peak_bytes + predicted.gpu_margin_bytes + predicted.gpu_unpressured_extra_bytes
        assert need <= 70 * GiB, point.key


def test_a_second_run_resumes_instead_of_repeating(kit_module, tmp_path: Path) -> None:
    kit = _kit(kit_module, tmp_path, GpuKitTrials())
    kit_module.stage_memory(kit)
    again = GpuKitTrials()
    kit2 = _kit(kit_module, tmp_path, again)
    kit_module.stage_memory(kit2)
    assert again.specs == []
    assert len(kit2.data["runs"]) == 2  # each run records its machine and versions


def test_grid_skips_micro_batches_above_a_failure_in_the_same_group(kit_module, tmp_path: Path) -> None:
    trials = GpuKitTrials(oom_above=1)
    kit = _kit(kit_module, tmp_path, trials)
    kit_module.stage_grid(kit)
    rows = kit.data["grid"]["rows"]
    statuses = {key: row["status"] for key, row in rows.items()}
    assert all(s == "ok" for k, s in statuses.items() if "/mb1/" in k)
    assert all(s == "oom_gpu" for k, s in statuses.items() if "/mb4/" in k)
    assert kit.data["grid"]["complete"] is True
    assert kit.data["grid"]["summary"]["best"]["samples_per_s"] == 10.0


def test_nothing_starts_that_would_end_after_the_budget(kit_module, tmp_path: Path) -> None:
    trials = GpuKitTrials()
    kit = _kit(kit_module, tmp_path, trials, budget_s=5.0)
    kit_module.stage_memory(kit)
    assert trials.specs == []  # the default estimate for a dry-run item is 30 s


def test_unknown_stage_is_refused_in_one_line() -> None:
    done = subprocess.run(
        [sys.executable, str(KIT_DIR / "kit.py"), "--dry-run", "--stages", "memory,nope"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "unknown stage(s) nope" in done.stderr and "Traceback" not in done.stderr


def test_modes_stage_runs_zero3_offload_and_partial_ratios_beside_each_other(kit_module, tmp_path: Path) -> None:
    """Modern modes: ZeRO-3, ZeRO-3 + offload and partial offload (the set ratios and the smallest predicted to fit)."""
    trials = GpuKitTrials()
    kit = _kit(kit_module, tmp_path, trials)
    kit_module.stage_modes(kit)
    section = kit.data["modes"]
    ratio = section["smallest_fitting_ratio"]
    assert ratio is not None and 0.0 <= ratio <= 1.0
    rows = section["rows"]
    every = [spec.ds_config["zero_optimization"] for spec in trials.specs]
    others = every[len(every) - len(kit_module.DRY_MODES.others) :]
    assert [c["stage"] for c in others] == [rung.stage for rung, _ in kit_module.DRY_MODES.others]
    assert "zenflow" in others[0]
    configs = every[: len(every) - len(others)]
    assert [c["stage"] for c in configs] == [3] * len(configs)
    ratios = {c.get("offload_optimizer", {}).get("ratio") for c in configs}
    assert None in ratios and {*kit_module.DRY_MODES.ratios} <= ratios  # ZeRO-3 has no offload section
    partial = [c for c in configs if c.get("offload_optimizer", {}).get("ratio") is not None]
    assert all("sub_group_size" in c for c in partial)
    assert len(rows) == len(trials.specs) and section["summary"]["fastest_that_ran"] in rows


def test_smallest_fitting_ratio_falls_as_the_card_grows(kit_module) -> None:
    setting = kit_module.ModesSetting("gpt2", 2, 256, True, ())
    ratios = [kit_module.smallest_fitting_ratio(setting, limit, "cuda") for limit in (3 * GiB, 4 * GiB, 80 * GiB)]
    assert ratios[-1] == 0.0
    known = [r for r in ratios if r is not None]
    assert known == sorted(known, reverse=True)


def test_the_warm_stage_puts_each_warm_trial_beside_its_fresh_row(kit_module, tmp_path: Path) -> None:
    trials = GpuKitTrials()
    kit = _kit(kit_module, tmp_path, trials)
    kit_module.stage_memory(kit)
    fresh_trials = len(trials.specs)
    kit_module.stage_warm(kit)
    warm = kit.data["warm"]
    first, second = (point.key for point in kit_module.DRY_MEMORY_POINTS[:2])
    assert [row["key"] for row in warm["rows"]] == [first, second, first] and warm["complete"]
    assert len(trials.specs) == fresh_trials + 3
    assert all(row["max_reserved_bytes"]["warm_minus_fresh"] == 0 for row in warm["rows"])  # the fake is stateless
    assert warm["summary"]["ok"] == 3
    kit_module.stage_warm(kit)  # a second run keeps the pool's rows: their order is part of what they measured
    assert len(trials.specs) == fresh_trials + 3


def test_warm_rows_say_what_a_warm_worker_adds_and_how_far_the_card_grew(kit_module) -> None:
    from warm_check import compare, summary

    fresh = {"key": "k", "status": "ok", "max_allocated_bytes": 10 * GiB, "nvml_peak_bytes": 12 * GiB, "startup_s": 9.0}
    rows = [
        compare({**fresh, "gpu_used_after_bytes": 1 * GiB, "startup_s": 0.5}, fresh),
        compare({**fresh, "nvml_peak_bytes": 12 * GiB + 300 * 2**20, "gpu_used_after_bytes": GiB + 40 * 2**20}, fresh),
    ]
    assert rows[0]["startup_s"] == {"warm": 0.5, "fresh": 9.0}
    assert rows[1]["nvml_peak_bytes"]["warm_minus_fresh"] == 300 * 2**20
    assert rows[1]["host_rss_peak_bytes"]["warm_minus_fresh"] is None  # not measured either way
    result = summary(rows, restarts=1, recycled=[])
    assert result["largest_abs_nvml_peak_bytes_diff"] == 300 * 2**20
    assert result["largest_abs_max_allocated_bytes_diff"] == 0
    assert result["card_used_growth_after_first_bytes"] == 40 * 2**20


def test_the_tune_stage_puts_the_picks_warm_peak_beside_its_fresh_confirmation(kit_module) -> None:
    """The GPU default confirms the pick in a fresh process: the kit's tune row says what that found (the first
    GPU measurement of warm against fresh peaks a real tune makes), and which picks it dropped."""
    from dataclasses import replace

    from tests.fakes.reports import golden_report
    from warm_check import pick_confirmation

    from autotune.core.ladder import Candidate, Rung
    from autotune.report.data import Choice, TrialEntry
    from autotune.trial.trial_types import RankMetrics, TrialResult

    def entry(candidate: Candidate, peak: int, purpose: str, fits: bool = True) -> TrialEntry:
        result = TrialResult("ok", ranks=[RankMetrics(0, device_used_bytes=peak)], samples_per_s=1.0)
        return TrialEntry(
            candidate=candidate, result=result, predicted_peak_bytes=peak, limit_bytes=20 * GiB, within_headroom=fits,
            host_peak_bytes=None, host_limit_bytes=None, from_cache=False, purpose=purpose,
        )  # fmt: skip

    dropped, pick = Candidate(Rung.Z2, 9), Candidate(Rung.Z2, 8)
    trials = (
        entry(pick, 18 * GiB, "first of a group"),
        entry(dropped, 19 * GiB, "boundary walk"),
        entry(dropped, 21 * GiB, "fresh-process confirmation", fits=False),
        entry(pick, 18 * GiB + 300 * 2**20, "fresh-process confirmation"),
    )
    choice = Choice(
        candidate=pick, description=pick.describe(), samples_per_s=1.0, tokens_per_s=None,
        peak_bytes=18 * GiB + 300 * 2**20, predicted_peak_bytes=17 * GiB, peak_in_fresh_process=True,
    )  # fmt: skip
    report = replace(golden_report(), choice=choice, trials=trials)
    assert pick_confirmation(report.to_json()) == {
        "pick": pick.key,
        "fresh_peak_bytes": 18 * GiB + 300 * 2**20,
        "warm_peak_bytes": 18 * GiB,
        "dropped_picks": [dropped.key],
        "warm_minus_fresh_bytes": -300 * 2**20,
    }
    # no confirmation launched: the pick's own trial was the first of its launch (Pick.confirm_fresh)
    own = replace(report, trials=trials[:2], choice=replace(choice, peak_bytes=18 * GiB))
    assert pick_confirmation(own.to_json()) == {"pick": pick.key, "fresh_peak_bytes": 18 * GiB, "own_first_trial": True}
    unconfirmed = replace(own, choice=replace(choice, peak_in_fresh_process=None))
    assert pick_confirmation(unconfirmed.to_json()) is None  # nothing confirmed (the CPU backend)
    assert pick_confirmation({"error": "Traceback ..."}) is None


@pytest.mark.slow
def test_dry_run_exercises_every_stage_for_real(tmp_path: Path) -> None:
    """The kit end to end on the CPU backend with tiny models: what CI runs so the kit does not rot."""
    out = tmp_path / "kit"
    env = {**os.environ, "COLUMNS": "200"}
    done = subprocess.run(
        ["bash", str(KIT_DIR / "validate.sh"), "--dry-run", "--out", str(out), "--budget-s", "1500"],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads((out / "validation-dry-run.json").read_text())
    assert data["setup"]["ops"] and "error" not in data["setup"]["ops"]
    assert all(row["status"] == "ok" for row in data["memory"]["rows"].values())
    warm = data["warm"]  # two points again in one warm pool, the first one twice, beside their fresh rows
    assert warm["complete"] and [row["status"] for row in warm["rows"]] == ["ok"] * 3
    assert warm["summary"]["pool_restarts"] == 1 and warm["rows"][0]["startup_s"]["warm"] is not None
    assert all(row["verdict"] == "as predicted" for row in data["oom"]["rows"].values())
    sites = data["sites"]["rows"].values()  # the CPU backend has no allocation trace: the rows say so
    assert sites and all(row["status"] == "ok" and "CUDA" in row["peak_sites"]["error"] for row in sites)
    assert data["tune"]["exit_code"] == 0 and data["tune"]["rerun"]["status"] == "ok"
    assert data["grid"]["complete"] and "tune_choice_vs_grid_best" in data["grid"]["summary"]
    assert data["side_by_side"]["exit_code"] == 0
    modes = data["modes"]
    assert modes["smallest_fitting_ratio"] is not None
    assert all(row["status"] == "ok" for row in modes["rows"].values())
    partial = [row for row in modes["rows"].values() if row["mode"]["offload_ratio"] != 1.0]
    assert partial and all(row["engine_facts"]["offload_ratio"] == row["mode"]["offload_ratio"] for row in partial)


def _lease_kit(kit_module, tmp_path: Path, trials, budget_s: float = 600.0, **fields):
    kit = kit_module.Kit(
        tmp_path / "validation.json", dry_run=True, budget_s=budget_s, run_trial=trials, lease=True, **fields
    )
    kit.load()
    return kit


def test_the_lease_measures_the_warm_points_first_with_an_optimizer_that_needs_no_op(kit_module, tmp_path) -> None:
    """Issue 42: warm vs fresh comes right after the smoke, beside the op builds (torch AdamW loads no DeepSpeed op)."""
    trials = GpuKitTrials()
    kit = _lease_kit(kit_module, tmp_path, trials, memory_set="warm")
    kit_module.stage_memory(kit)
    assert [s.optimizer for s in trials.specs] == ["torch-adamw", "torch-adamw"]
    assert all(s.ds_config["optimizer"]["params"].get("torch_adam") for s in trials.specs)
    rows = kit.data["memory"]["rows"]
    assert list(rows) == [p.key for p in kit_module.DRY_WARM_POINTS] and all(k.endswith("/torch-adamw") for k in rows)
    kit.memory_set = "rest"
    kit_module.stage_memory(kit)
    assert len(rows) == 2 + len(kit_module.DRY_MEMORY_POINTS)  # the rest come last, none twice
    lease = kit_module.LEASE_MEMORY_POINTS
    assert lease[-1].model == "llama-3.2-3b" and not lease[0].rung.offload_optimizer  # cheapest first


def test_each_warm_item_is_gated_on_the_wall_of_the_fresh_point_it_re_runs(kit_module, tmp_path) -> None:
    """Not on the slowest memory row of all (an offload point of 45-100 s), which dropped the third warm item."""
    trials = GpuKitTrials()
    kit = _lease_kit(kit_module, tmp_path, trials, memory_set="warm")
    kit_module.stage_memory(kit)
    rows = kit.data["memory"]["rows"]
    for row in rows.values():
        row["wall_s"] = 20.0
    rows["an offload point"] = {"key": "x", "status": "ok", "wall_s": 100.0}
    kit.budget_s = kit_module.time.monotonic() - kit.started + 3 * 24.0 + 1  # three warm items' worth
    kit_module.stage_warm(kit)
    assert len(kit.data["warm"]["rows"]) == 3 and kit.data["warm"]["complete"]


def test_the_sampler_stage_times_zero3_at_10_ms_and_1_s_and_calls_overlap_a_tie(kit_module, tmp_path) -> None:
    trials = GpuKitTrials()
    stepped = lambda spec: dataclasses.replace(trials(spec), step_times_s=[0.5, 0.6])  # noqa: E731
    kit = _lease_kit(kit_module, tmp_path, stepped, memory_set="warm")
    kit_module.stage_memory(kit)
    kit_module.stage_sampler(kit)
    section = kit.data["sampler"]
    assert set(section["rows"]) == {"0.01s", "1s"}
    assert [s.sample_period_s for s in trials.specs] == [0.01, 0.01, 1.0]  # the 10 ms row is the memory stage's
    assert section["summary"]["verdict"].startswith("tie")  # the fake's steps are alike
    fast = {"status": "ok", "step_times_s": [1.0, 1.1]}
    slow = {"status": "ok", "step_times_s": [0.5, 0.6]}
    assert "costs step time" in kit_module._sampler_summary({"0.01s": fast, "1s": slow})["verdict"]


def test_the_lease_tune_keeps_a_trial_and_the_fresh_confirmation_back_and_states_host_memory(
    kit_module, monkeypatch: pytest.MonkeyPatch
) -> None:
    setting = kit_module.LEASE_TUNE
    assert setting.max_trials == 2 and setting.reserve_s >= 100 and setting.rerun_s == 0
    assert all(rung.offload_optimizer for rung in setting.rungs)  # all the emulated 24 GB card fits of llama-3.2-1b
    kit = kit_module.Kit(Path("/nonexistent/v.json"), dry_run=False, budget_s=100, lease=True)
    monkeypatch.setattr(kit_module, "emulated_fraction", lambda _kit: 0.17)  # no GPU here: only an argument
    args = kit_module._limit_args(kit)
    assert args[-2:] == ["--host-memory", "128GiB"]


def test_a_failed_smoke_trial_stops_the_kit_with_its_row_saved(kit_module, tmp_path, monkeypatch) -> None:
    failed = TrialResult(status="error", error="CUDA error: no kernel image is available")
    monkeypatch.setattr(kit_module.Kit, "launch", lambda self, spec, key, launcher=None: (failed, None))
    results = tmp_path / "v.json"
    code = kit_module.main(["--dry-run", "--lease", "--stages", "smoke,memory", "--results", str(results),
                            "--out", str(tmp_path / "kit")])  # fmt: skip
    data = json.loads(results.read_text())
    assert code == 3 and data["smoke"]["status"] == "error" and "memory" not in data
    assert data["smoke"]["optimizer"] == "torch-adamw"

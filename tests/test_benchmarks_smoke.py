"""Fast checks of benchmarks/compare_tuners.py: it parses, builds DeepSpeed's autotuning config, picks the
memory-bound budget, and renders its chart and markdown from a JSON, all without launching a trial; and one scenario
of benchmarks/search_quality.py (simulated) end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(autouse=True)
def _benchmarks_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))


def test_runner_help() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "compare_tuners.py"), "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "--render-only" in done.stdout and "DeepSpeed Autotuning" in done.stdout


def test_uneven_micro_batches_are_refused() -> None:
    from compare.settings import BenchSettings

    with pytest.raises(ValueError, match="do not divide"):
        BenchSettings(model="tiny-gpt2", device="cpu", seq_len=64, micro_batches=(3, 4)).check()


def test_ds_autotuning_config_constrains_its_space(tmp_path: Path) -> None:
    from compare.ds_autotuner import autotuning_config
    from compare.settings import BenchSettings

    settings = BenchSettings(model="tiny-gpt2", device="cpu", seq_len=64, micro_batches=(4, 16))
    base = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 16, "bf16": {"enabled": True}}
    config = autotuning_config({**base, "zero_optimization": {"stage": 0}}, settings, tmp_path)
    assert config["train_micro_batch_size_per_gpu"] == [4, 16]
    assert config["gradient_accumulation_steps"] == 1 and "train_batch_size" not in config
    assert config["zero_optimization"] == {"stage": [0, 1, 2, 3]}
    assert config["autotuning"]["enabled"] and config["autotuning"]["fast"]
    assert config["bf16"] == {"enabled": True}


def test_tight_limit_excludes_the_winner_in_the_widest_gap() -> None:
    from compare.analysis import budget_for_limit, tight_limit

    rows = [
        {"status": "ok", "samples_per_s": 10.0, "peak_bytes": 400},
        {"status": "ok", "samples_per_s": 12.0, "peak_bytes": 410},
        {"status": "ok", "samples_per_s": 30.0, "peak_bytes": 600},
        {"status": "error", "samples_per_s": None, "peak_bytes": None},
    ]
    assert tight_limit(rows, None) == 505
    assert tight_limit(rows[2:], None) is None
    assert budget_for_limit(900 * 2**20, 0.9) == "1000MiB"


def test_chosen_config_reads_offload_back() -> None:
    from compare.records import ChosenConfig

    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 8,
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
    }
    chosen = ChosenConfig.from_ds_config(config, grad_checkpointing=True)
    assert (chosen.stage, chosen.micro_batch, chosen.offload_optimizer, chosen.offload_param) == (3, 2, "cpu", None)
    assert chosen.label == "ZeRO-3, mb 2, GAS 8, opt->cpu, ckpt"


def _run(method: str, wall: float, speed: float) -> dict:
    return {
        "status": "ok",
        "wall_s": wall,
        "launches": 3,
        "chosen": {"label": "ZeRO-0, mb 4, GAS 1"},
        "reported_samples_per_s": speed * 1.2,
        "remeasured": {
            "samples_per_s_median": speed,
            "samples_per_s_min": speed * 0.9,
            "samples_per_s_max": speed * 1.1,
            "repeats_ok": 2,
            "peak_bytes_median": 500 * 2**20,
        },
    }


def test_render_from_json(tmp_path: Path) -> None:
    from compare.output import render_markdown, write_chart

    data = {
        "date": "2026-01-01T00:00:00+00:00",
        "total_wall_s": 100.0,
        "git": {"commit": "abc", "dirty": False},
        "machine": {"cpu_model": "test cpu", "logical_cores": 2, "ram_bytes": 2**34, "gpus": []},
        "versions": {"python": "3.11", "autotune": "0.1.0"},
        "settings": {
            "model": "tiny-gpt2",
            "seq_len": 64,
            "precision": "bf16",
            "device": "cpu",
            "ranks": 1,
            "global_batch": 16,
            "shared_rungs": ["z0", "z1", "z2", "z3"],
            "micro_batches": [4, 16],
            "launcher": "local",
            "measurement": {"warmup_steps": 3, "max_steps": 10, "repeats": 2},
        },
        "scenarios": {
            "main": {
                "label": "memory does not bind",
                "methods": {
                    "autotune": _run("autotune", 20.0, 50.0),
                    "deepspeed_autotuning": _run("deepspeed_autotuning", 200.0, 45.0),
                    "exhaustive": _run("exhaustive", 100.0, 50.0),
                },
                "ratios": {"autotune_wall_over_ds_wall": 0.1, "autotune_tput_over_exhaustive_best": 1.0},
                "notes": [],
            }
        },
        "latency": {},
        "caveats": ["a caveat"],
    }
    text = render_markdown(data, "results/x.png")
    assert "| memory does not bind | autotune | 20.0 s | 3 | ZeRO-0, mb 4, GAS 1 | 50.00 (45.0-55.0, 2) |" in text
    assert "**met**" in text and "a caveat" in text
    # The chart needs the `bench` extra; the README's test install (`.[test]`) does not have it.
    pytest.importorskip("matplotlib", reason="the chart needs matplotlib: pip install -e '.[bench]'")
    write_chart(data, tmp_path / "chart.png")
    assert (tmp_path / "chart.png").stat().st_size > 0


def test_quick_start_benchmark_runs_the_readme_one_liner() -> None:
    """benchmarks/quick_start.py times the README's quick start word for word: one line, pip then the demo."""
    from quick_start import readme_command

    command = readme_command(BENCHMARKS.parent / "README.md")
    *installs, demo = command.split(" && ")
    assert [step.split()[:4] for step in installs] == [["python3", "-m", "pip", "install"]] * 2
    assert "'.[plot]'" in installs[-1]  # the demo's picture needs matplotlib
    assert demo.startswith("autotune --model gpt2-small-demo --device cpu ")


def test_search_quality_reports_each_scenario_under_the_default(tmp_path: Path) -> None:
    """One scenario end to end: the default's launcher from the chooser, the search under each limit setting, the
    proposals (benchmarks/search_quality.py, gpu_sim/budget_report.py)."""
    out = tmp_path / "sq.json"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "search_quality.py"), "--scenario", "memory-not-binding", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(out.read_text())
    (row,) = data["scenarios"]
    assert row["default"]["launcher"] == "warm + fresh confirmation"
    limits = row["under_default"]["chooser in the code"]["limits"]
    assert data["command_defaults"]["tune_max_trials"] == "derived"
    tune = limits["tune's GPU defaults (no time budget, derived --max-trials)"]
    assert tune["time_budget_s"] is None and tune["max_trials"] == row["tune_defaults"]["max_trials"]
    assert limits["the CPU's default time budget, on GPUs"]["time_budget_s"] == 600.0
    assert row["tune_defaults"]["launcher"] == "warm + fresh confirmation"
    assert limits["no time budget (the hook's default)"]["quality"] == row["autotune"]["quality"]
    assert row["default_proposals"][0]["budget_needed_s"] is not None
    assert "under the default (chooser in the code)" in done.stdout
    # what the default really searches: its same-training modes, held to their own exhaustive best
    same = row["default_same_training"]
    assert same["launcher"] == row["default"]["launcher"] and same["time_budget_s"] is None
    assert same["max_trials"] is not None and 0 < same["quality"] <= 1.0
    assert same["exhaustive_samples_per_s"] <= row["exhaustive"]["samples_per_s"]  # fewer modes, no faster best
    assert data["default_same_training_summary"]["lowest_quality"] == ["memory-not-binding", round(same["quality"], 4)]
    assert "the default as it really runs" in done.stdout

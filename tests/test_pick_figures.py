"""The figures that decided are the figures shown: after an interleaved re-measurement the verdict quotes the
interleaved trials it was decided on, and the pick has one speed in the terminal summary, the markdown report, the
JSON and `TuneResult.samples_per_s`, with its fastest single trial under its own name."""

from __future__ import annotations

import json

from tests.fakes.launchers import PhasedSpeedLauncher

from autotune import tune
from autotune.cli.tune import _print_summary
from autotune.core.ladder import Rung
from autotune.tuner import TuneRequest

# ZeRO-3 (less simple) wins the first pass clearly (4 / 0.5 = 8 vs 4 / 1.5 = 2.67 samples/s at micro-batch 4),
# so its win is re-measured interleaved (ZeRO-3, ZeRO-0, ZeRO-3, ZeRO-0); there the two tie at 4.00 samples/s
# (pooled medians), and the tie goes to the simpler ZeRO-0. ZeRO-0's fastest single trial is 4 / 0.9 = 4.44.
FIRST_PASS = {0: [1.0, 1.5, 2.0], 3: [0.45, 0.5, 0.55]}
INTERLEAVED = {0: [[0.8, 0.9, 1.0], [1.0, 1.1, 1.2]], 3: [[0.9, 1.0, 1.1], [0.95, 1.0, 1.05]]}


def _tuned(tmp_path):
    steps = {stage: [FIRST_PASS[stage], *INTERLEAVED[stage]] for stage in FIRST_PASS}
    launcher = PhasedSpeedLauncher(steps)
    request = TuneRequest.of(
        model="tiny-gpt2",
        device="cpu",
        memory_budget="2GiB",
        seq_len=64,
        rungs=(Rung.Z0, Rung.Z3),
        micro_batches=(4,),
        out=str(tmp_path / "ds_config.json"),
        use_cache=False,
    )
    return tune(request, launcher=launcher), launcher


def test_the_verdict_quotes_the_interleaved_pair_it_was_decided_on(tmp_path, capsys) -> None:
    result, launcher = _tuned(tmp_path)
    assert launcher.calls == {0: 3, 3: 3}  # first pass, then two interleaved rounds
    report = result.report
    assert report is not None and report.verdict is not None and report.choice is not None
    verdict = report.verdict
    assert verdict.remeasured and verdict.tie and report.choice.candidate.rung is Rung.Z0
    assert round(verdict.speed.samples_per_s, 2) == 4.00 and round(verdict.runner_up_speed.samples_per_s, 2) == 4.00
    _print_summary(result)
    terminal = capsys.readouterr().out
    markdown = result.report_path.read_text()
    for text in (terminal, markdown):
        line = next(line for line in text.splitlines() if "Tie within noise" in line)
        assert "ZeRO-0" in line and "at 4.00 and" in line and "at 4.00 samples/s" in line
        assert "2.67" not in line and "8.00" not in line  # the first pass decided nothing
        assert "re-measured interleaved" in text


def test_the_pick_has_one_speed_everywhere(tmp_path, capsys) -> None:
    result, _ = _tuned(tmp_path)
    report = result.report
    assert report is not None and report.choice is not None
    decided = report.verdict.speed.samples_per_s
    on_disk = json.loads(result.report_json_path.read_text())
    assert result.samples_per_s == report.choice.samples_per_s == on_disk["choice"]["samples_per_s"] == decided
    assert round(report.choice.fastest_trial_samples_per_s, 2) == 4.44  # kept, under its own name
    _print_summary(result)
    terminal = capsys.readouterr().out
    markdown = result.report_path.read_text()
    assert f"Speed: {decided:.2f} samples/s" in terminal and f"Speed: {decided:.2f} samples/s" in markdown
    assert f"Measured {decided:.2f} samples/s" in markdown
    assert "4.44" not in terminal

"""The pick among measured candidates: the median's interval, the step-count rule and the tie rule."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.fakes.reports import golden_report

from autotune.core.ladder import Candidate, Mode, Rung
from autotune.core.measurement import MIN_STEPS, StepStats, enough_steps, median_rank_bound, speed_of
from autotune.report.data import Choice, HostNeed, TrialEntry, TuneReport, VerdictEntry
from autotune.search.pick_decision import decide, settle, simplicity
from autotune.trial.trial_types import TrialResult

Z0 = Candidate(Rung.Z0, 8, False)
Z2 = Candidate(Rung.Z2, 8, False)
Z2_OFFLOAD = Candidate(Rung.Z2_OFFLOAD_OPT, 8, False)
ZENFLOW = Candidate(Rung.Z2_OFFLOAD_OPT, 8, False, Mode(zenflow=True))


def _speed(step_s: float, spread: float, n: int = 9):
    """n steps spread evenly over step_s * (1 +- spread), 8 samples per step."""
    times = [step_s * (1 - spread + 2 * spread * i / (n - 1)) for i in range(n)]
    return speed_of(times, 8 / step_s)


def test_median_interval_ranks_match_the_binomial_table() -> None:
    # Conover table A3 / the binomial sums: n=5 -> [x1, x5] (93.75%), n=10 -> [x2, x9], n=20 -> [x6, x15]
    assert [median_rank_bound(n) for n in (5, 6, 10, 20)] == [1, 1, 2, 6]
    stats = StepStats.of([1.0, 1.2, 0.9, 1.1, 1.05, 0.95, 1.0, 1.3, 0.8, 1.0])
    assert stats.steps == 10 and stats.median_s == pytest.approx(1.0)
    assert (stats.low_s, stats.high_s) == (0.9, 1.2)


def test_step_count_follows_the_measured_variance() -> None:
    quiet = [1.0, 1.01, 0.99, 1.0, 1.005]
    loaded = [1.0, 1.4, 0.8, 1.2, 0.9, 1.3]
    assert not enough_steps(quiet[: MIN_STEPS - 1])
    assert enough_steps(quiet)  # +-1%: five steps suffice
    assert not enough_steps(loaded)  # +-30%: keep measuring
    assert enough_steps(loaded * 4, max_steps=20)  # up to the cap
    assert enough_steps(loaded, max_seconds=5.0)  # or the time cap
    assert enough_steps([100.0, 120.0, 90.0])  # slow steps: three, once the time cap is passed
    assert not enough_steps([100.0, 120.0])


def test_a_win_needs_a_margin_beyond_the_spread() -> None:
    clear = decide({Z2_OFFLOAD: _speed(1.0, 0.02), Z0: _speed(1.2, 0.02)})
    assert clear.pick == Z2_OFFLOAD and not clear.tie and clear.margin == pytest.approx(0.2)
    close = decide({ZENFLOW: _speed(1.0, 0.2), Z2_OFFLOAD: _speed(1.05, 0.2), Z0: _speed(1.1, 0.2)})
    assert close.tie and close.pick == Z0 and close.runner_up == ZENFLOW  # simplest vs fastest


def test_simplicity_prefers_no_host_offload_then_earlier_rungs_then_no_mode() -> None:
    ordered = sorted([ZENFLOW, Z2_OFFLOAD, Z2, Z0], key=simplicity)
    assert ordered == [Z0, Z2, Z2_OFFLOAD, ZENFLOW]


def _recording(answer: dict):
    """A re-measure that answers `answer` and records what it was asked: (candidates, rounds) per call."""
    asked: list = []

    def remeasure(candidates, rounds):
        asked.append((tuple(candidates), rounds))
        return answer

    return asked, remeasure


def test_a_tie_is_remeasured_and_decided_on_the_interleaved_trials_only() -> None:
    # offload clearly faster when measured alike
    asked, remeasure = _recording({Z0: _speed(1.5, 0.02), Z2_OFFLOAD: _speed(1.0, 0.02)})
    verdict = settle({Z0: _speed(1.0, 0.2), Z2_OFFLOAD: _speed(0.98, 0.2)}, remeasure)
    assert asked == [((Z0, Z2_OFFLOAD), 2)]
    assert verdict.pick == Z2_OFFLOAD and verdict.remeasured and not verdict.tie
    unchanged = settle({Z0: _speed(1.0, 0.2), Z2_OFFLOAD: _speed(0.98, 0.2)}, lambda c, r: None)
    assert unchanged.tie and unchanged.pick == Z0 and not unchanged.remeasured


def test_a_less_simple_configs_clear_win_must_hold_side_by_side() -> None:
    """Trials minutes apart also measure the machine in between: offload recommended only if it wins interleaved."""
    asked, remeasure = _recording({Z2_OFFLOAD: _speed(1.0, 0.02), Z0: _speed(1.02, 0.02)})  # alike side by side
    verdict = settle({Z2_OFFLOAD: _speed(1.0, 0.02), Z0: _speed(6.0, 0.02)}, remeasure)
    assert asked == [((Z2_OFFLOAD, Z0), 2)]
    assert verdict.remeasured and verdict.tie and verdict.pick == Z0
    held = settle(
        {Z2_OFFLOAD: _speed(1.0, 0.02), Z0: _speed(6.0, 0.02)},
        lambda c, r: {Z2_OFFLOAD: _speed(1.0, 0.02), Z0: _speed(5.0, 0.02)},
    )
    assert held.pick == Z2_OFFLOAD and held.remeasured and not held.tie


def test_a_simpler_configs_clear_win_is_not_remeasured() -> None:
    def remeasure(candidates, rounds):
        raise AssertionError("a clear win of the simpler config needs no re-measure")

    verdict = settle({Z0: _speed(1.0, 0.02), Z2_OFFLOAD: _speed(1.5, 0.02)}, remeasure)
    assert verdict.pick == Z0 and not verdict.tie and not verdict.remeasured


def _trial(candidate: Candidate, result: TrialResult) -> TrialEntry:
    return TrialEntry(
        candidate=candidate,
        result=result,
        predicted_peak_bytes=2 * 2**30,
        limit_bytes=4 * 2**30,
        within_headroom=True,
        host_peak_bytes=None,
        host_limit_bytes=None,
        from_cache=False,
        purpose="",
    )


def _report_data(verdict, device: str = "cuda") -> TuneReport:
    """A real report (tests/data/report) with this verdict, its pick, one trial of it and a host need."""
    pick = verdict.pick
    trial = _trial(pick, TrialResult("ok", step_times_s=[1.0, 1.1, 0.9, 1.0, 1.05], samples_per_s=8.0))
    choice = Choice(
        candidate=pick,
        description=pick.describe(),
        samples_per_s=verdict.speed.median,
        tokens_per_s=None,
        peak_bytes=3 * 2**30,
        predicted_peak_bytes=2 * 2**30,
    )
    return replace(
        golden_report(),
        choice=choice,
        verdict=VerdictEntry.from_json(verdict.to_dict()),
        limit_bytes=4 * 2**30,
        headroom=0.9,
        device=device,
        host_need=HostNeed(ram_bytes=40 * 2**30, pinned_bytes=16 * 2**30, nvme_bytes=0, measured=False),
        trials=(trial,),
    )


def test_summary_leads_with_pick_spread_runner_up_headroom_and_host_needs() -> None:
    from autotune.report.pick import lead_lines

    tie = decide({Z0: _speed(1.0, 0.2), Z2_OFFLOAD: _speed(0.97, 0.2)})
    pick, speed, versus, memory, host = lead_lines(_report_data(tie))
    assert pick == f"Pick: {Z0.describe()}."
    assert "samples/s (" in speed and "steps" in speed and "interval" in speed
    assert versus.startswith("Tie within noise:") and Z2_OFFLOAD.describe() in versus
    assert f"{tie.speed.median:.2f}" in versus and f"{tie.runner_up_speed.median:.2f}" in versus
    assert "1.0 GiB left (25%)" in memory
    assert "40.0 GiB per node" in host and "16.0 GiB of it pinned" in host
    clear = decide({Z2_OFFLOAD: _speed(1.0, 0.02), Z0: _speed(1.2, 0.02)})
    assert "beyond the spread" in lead_lines(_report_data(clear))[2]


def test_a_pick_confirmed_in_a_fresh_process_says_so_and_reads_back() -> None:
    from autotune.report.data import TuneReport
    from autotune.report.pick import memory_line

    verdict = decide({Z0: _speed(1.0, 0.02)})
    plain = _report_data(verdict)
    assert "fresh process" not in memory_line(plain) and "peak_in_fresh_process" not in plain.to_json()["choice"]
    assert plain.choice is not None
    confirmed = replace(plain, choice=replace(plain.choice, peak_in_fresh_process=True))
    assert memory_line(confirmed).startswith("Memory: measured peak (in a fresh process, as your job starts) 3.0 GiB")
    again = TuneReport.from_json(confirmed.to_json())
    assert again.choice is not None and again.choice.peak_in_fresh_process is True


def test_chart_marks_the_pick_and_carries_each_trials_interval() -> None:
    from autotune.report.plot import _trial_rows

    rows = _trial_rows(_report_data(decide({Z0: _speed(1.0, 0.02)})))
    assert rows[0]["chosen"]
    down, up = rows[0]["interval"]
    assert down > 0 and up > 0


def test_steps_timed_past_the_stopping_point_are_dropped() -> None:
    """An own command runs on between two polls: its figure is the prefix the stopping rule accepts, capped."""
    from autotune.core.measurement import steps_until_enough

    steady = [1.0, 1.01, 0.99, 1.0, 1.005] + [5.0] * 18  # known to +-3% after five steps; the rest came later
    assert steps_until_enough(steady, max_steps=12, max_seconds=600) == steady[:5]
    noisy = [1.0, 2.0] * 12
    assert len(steps_until_enough(noisy, max_steps=12, max_seconds=600)) == 12  # the cap, never the 24 read
    assert steps_until_enough(noisy[:3], max_steps=12, max_seconds=600) == noisy[:3]  # not enough yet: all of them


def test_hook_summary_leads_with_the_lines_tune_prints() -> None:
    from pathlib import Path

    from autotune.cli.hook import _summary
    from autotune.hook.coordinate import HookRecord
    from autotune.hook.env import JobEnv
    from autotune.hook.run import HookResult
    from autotune.report.pick import summary_head

    tie = decide({Z0: _speed(1.0, 0.2), Z2_OFFLOAD: _speed(0.97, 0.2)})
    report = replace(_report_data(tie), model={"name": "tiny-gpt2"}, target_description="1x1 cpu")
    record = HookRecord(
        "key",
        "complete",
        "{}",
        "tuned",
        verified=True,
        job_id=None,
        hardware="fp",
        leader="host pid 1",
        created=0.0,
        details={"trials_launched": 3, "outputs": {"report": report.to_json()}},
    )
    job = JobEnv("none", None, 1, 1, rank=0, node_rank=0, local_rank=0, nodelist=(), master_addr=None)
    lines = _summary(
        HookResult("leader", Path("ds.json"), record, job, key="key", waited_s=0.0, elapsed_s=1.0)
    ).splitlines()
    head = summary_head(report, verified=True, from_cache=False)
    assert lines[0] == "tiny-gpt2 on 1x1 cpu: verified by trials" == head[0]
    assert [line.strip() for line in lines[1 : len(head)]] == head[1:]
    assert lines[2].strip().startswith("Speed:") and lines[3].strip().startswith("Tie within noise:")
    # then the hook's own line, and under it the world size, the launch lines and the notes (all indented)
    assert lines[len(head)].startswith("autotune hook: none: 1 node(s)")
    tail = lines[len(head) + 1 :]
    assert tail[0].strip().startswith("valid for world size 1") and all(line.startswith("  ") for line in tail)
    assert any(line.strip().startswith("train: HF Trainer script:") for line in tail)
    bare = HookResult(
        "hit",
        Path("ds.json"),
        HookRecord(
            "key", "complete", "{}", "tuned", verified=True, job_id=None, hardware="fp", leader="h", created=0.0
        ),
        job,
        key="key",
        waited_s=0.0,
        elapsed_s=1.0,
    )
    bare_lines = _summary(bare).splitlines()  # a record without the report: the hook's line, then its handoff
    assert bare_lines[0].startswith("autotune hook:") and all(line.startswith("  ") for line in bare_lines[1:])


def test_verbose_lists_every_measured_candidate_with_its_interval_fastest_first() -> None:
    from autotune.report.pick import measured_detail, measurement_lines

    clear = decide({Z2_OFFLOAD: _speed(1.0, 0.02), Z0: _speed(1.2, 0.02)})
    data = _report_data(clear)
    slow = TrialResult("ok", step_times_s=[2.0, 2.2, 1.8, 2.0, 2.1], samples_per_s=4.0)
    failed = TrialResult("oom_host")
    data = replace(data, trials=(*data.trials, _trial(Z0, slow), _trial(Z2, failed)))
    title, fast, slower = measurement_lines(data)
    assert title.startswith("Measured") and "95% interval" in title
    assert fast.strip().startswith(Z2_OFFLOAD.describe()) and slower.strip().startswith(Z0.describe())
    assert "4.00 samples/s (3.64-4.44, 5 steps); single steps 2-2.1 s (IQR)" in slower  # quartiles 2.0, 2.1
    assert measured_detail(failed) == ""

"""The search with the modern memory modes: the offload ratio bisected and confirmed by trials, modes compared by
measured speed only, never pruned by the ladder's order, and planned-only modes never picked.

The memory model and the trial runner are fakes here (tests/fakes/machines.py LinearMemory and LinearMachine; no
DeepSpeed, no timing): each test says what the model believes and what the "machine" does, so a test fails when
the search trusts the wrong one.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.fakes.launchers import RatioSpeedLauncher
from tests.fakes.machines import GIB, LinearMachine, LinearMemory, linear_peak_gib
from tests.fakes.reports import golden_report
from tests.fakes.searches import RATIOS, mode_search

from autotune.core.ladder import Candidate, Mode, Rung
from autotune.core.stop import StopReason
from autotune.modes.applies import ModeFacts, ModeOption, considered_modes
from autotune.modes.search_view import ModeRecord, is_ratio_mode, smallest_fitting_ratio
from autotune.report.data import Choice, ModeEntry, Skipped, TrialEntry, TuneReport
from autotune.report.markdown import render_markdown
from autotune.search.records import TrialRecord
from autotune.search.relations import holds_at_least_the_memory_of
from autotune.search.speed import BoundContext, GroupMeasurements, could_beat
from autotune.trial.trial_types import RankMetrics, TrialResult


def test_bisection_finds_the_smallest_fitting_ratio_in_log_steps() -> None:
    asked: list[float] = []

    def fits(ratio: float) -> bool:
        asked.append(ratio)
        return ratio >= 0.62  # the fake estimator: GPU memory falls as the ratio rises

    assert smallest_fitting_ratio(RATIOS, fits) == 0.65  # the next real setting above 0.62 (5% steps)
    assert len(asked) <= 6  # log2(19) + 1, not a linear scan
    assert smallest_fitting_ratio(RATIOS, lambda r: False) is None
    assert smallest_fitting_ratio(RATIOS, lambda r: True) == RATIOS[0]
    assert smallest_fitting_ratio([], lambda r: True) is None


# -- the search over a fake memory model and machine (tests/fakes/machines.py) -------------------------------


def _partial(rung: Rung = Rung.Z3_OFFLOAD_OPT, verifiable: bool = True) -> ModeOption:
    return ModeOption(
        Mode(offload_ratio=0.5), "partial_offload", True, "between ZeRO-3 and full offload", trial_verifiable=verifiable
    )


def test_partial_offload_is_searched_and_wins_although_full_offload_was_measured_slower_first() -> None:
    """Z3 does not fit at all (16 GiB of states + activations > 16 GiB); full offload fits everything but is slow;
    the smallest ratio that fits at the largest micro-batch wins. The ladder puts full offload first; its
    measurement must not bound partial offload (it does more host work, not less)."""
    machine = LinearMachine(memory_bytes=16 * GIB)
    search = mode_search(machine, LinearMemory(), {Rung.Z3_OFFLOAD_OPT: [_partial()]}, [Rung.Z3, Rung.Z3_OFFLOAD_OPT])
    outcome = search.run_search()
    classic_full = [c for c in machine.launched if c.rung is Rung.Z3_OFFLOAD_OPT and c.mode.is_classic]
    partial = [c for c in machine.launched if is_ratio_mode(c.mode)]
    assert classic_full and partial
    assert machine.launched.index(classic_full[0]) < machine.launched.index(partial[0])
    assert outcome.best is not None and is_ratio_mode(outcome.best.candidate.mode)
    # at micro-batch 8: 4 + 12 (1 - r) + 8 <= 16 -> r >= 2/3 -> 0.7, the smallest real setting that fits
    assert outcome.best.candidate == Candidate(Rung.Z3_OFFLOAD_OPT, 8, False, Mode(offload_ratio=0.7))
    record = next(m for m in outcome.modes if is_ratio_mode(m.mode))
    assert record.status == "measured" and record.samples_per_s == outcome.best.result.samples_per_s
    assert record.trials == len(partial)


def test_bounds_never_let_full_offload_prune_partial_offload_but_zero3_may() -> None:
    context = BoundContext(checkpointing_cost=1.3, optimizer_saving_s=None)
    partial = Candidate(Rung.Z3_OFFLOAD_OPT, 4, False, Mode(offload_ratio=0.3))
    full_offload = GroupMeasurements(Rung.Z3_OFFLOAD_OPT, False, ((4, 4.0), (2, 2.1)))
    best = (100.0, 100.0)
    assert could_beat(best, [full_offload], partial, context, loses_ties=True)[0]  # 1 sample/s: still not a bound
    zero3 = GroupMeasurements(Rung.Z3, False, ((4, 4.0), (2, 2.1)))
    beatable, why = could_beat(best, [zero3], partial, context, loses_ties=True)
    assert not beatable and "z3" in why  # ZeRO-3 does less work than any partial offload at the same batch
    other_mode = GroupMeasurements(Rung.Z3, False, ((4, 4.0), (2, 2.1)), Mode(hpz_partition_size=8))
    assert could_beat(best, [other_mode], partial, context, loses_ties=True)[0]  # a different mode bounds nothing


def test_an_oom_at_ratio_r_moves_the_next_try_up_and_calibrates() -> None:
    """The model thinks the optimizer states are 12 GiB, the machine has 14: the predicted smallest ratio runs out
    of memory; the next try at the same micro-batch is a larger ratio, and the OOM went to the calibration."""
    machine = LinearMachine(memory_bytes=16 * GIB, optimizer_gib=14.0)
    memory = LinearMemory(optimizer_gib=12.0)
    search = mode_search(machine, memory, {Rung.Z3_OFFLOAD_OPT: [_partial()]}, [Rung.Z3_OFFLOAD_OPT])
    outcome = search.run_search()
    partial = [c for c in machine.launched if is_ratio_mode(c.mode)]
    first = partial[0]
    assert first.mode.offload_ratio == 0.7 and machine.run(first)[0].status == "oom_gpu"
    following = partial[1]
    assert following.micro_batch == first.micro_batch
    assert following.mode.offload_ratio > first.mode.offload_ratio
    assert first in memory.oom_calibrations
    assert all(t.within_headroom or t.memory_failure for t in outcome.trials)


def test_measured_peaks_on_both_sides_of_a_ratio_draw_its_line() -> None:
    """The model's slope is half the truth's (12 vs 24 GiB of optimizer states): stepping up one ratio at a time
    by the model would miss again. The classic offload (ratio 1) measured 12 GiB at micro-batch 8 and ratio 0.7
    19.2 GiB: the line between the two measured peaks lands on the smallest ratio that fits, with no trial between.
    Limit 16 GiB (80% of 20): at micro-batch 8 the truth needs 4 + 24 (1 - r) + 8 <= 16, r >= 5/6 -> 0.85."""
    machine = LinearMachine(memory_bytes=20 * GIB, optimizer_gib=24.0)
    search = mode_search(
        machine, LinearMemory(), {Rung.Z3_OFFLOAD_OPT: [_partial()]}, [Rung.Z3_OFFLOAD_OPT], headroom=0.8
    )
    outcome = search.run_search()
    at_8 = [
        t
        for t in outcome.trials
        if is_ratio_mode(t.candidate.mode) and t.candidate.micro_batch == 8 and not t.candidate.grad_checkpointing
    ]
    assert [t.candidate.mode.offload_ratio for t in at_8] == [0.7, 0.85]
    assert [t.within_headroom for t in at_8] == [False, True]
    assert at_8[0].result.peak_memory_bytes  # over the headroom, not OOM: its peak is known


def test_two_measured_peaks_on_one_side_of_a_ratio_extend_their_line_below_the_models_answer() -> None:
    """The model believes 24 GiB of optimizer states, the truth is 12: by the model's slope no ratio under 0.85 fits
    at micro-batch 8. The classic offload (ratio 1) and ratio 0.85 measured 12 and 13.8 GiB there; the line through
    them (not the model's slope from the nearest one) says 0.7 fits, and it does: 4 + 12 (1 - r) + 8 <= 16 GiB
    (80% of 20) -> r >= 2/3, the smallest real setting 0.7."""
    machine = LinearMachine(memory_bytes=20 * GIB, optimizer_gib=12.0)
    memory = LinearMemory(optimizer_gib=24.0)
    search = mode_search(machine, memory, {Rung.Z3_OFFLOAD_OPT: [_partial()]}, [Rung.Z3_OFFLOAD_OPT], headroom=0.8)
    outcome = search.run_search()
    at_8 = [
        t
        for t in outcome.trials
        if is_ratio_mode(t.candidate.mode) and t.candidate.micro_batch == 8 and not t.candidate.grad_checkpointing
    ]
    assert [t.candidate.mode.offload_ratio for t in at_8] == [0.85, 0.7]
    assert all(t.within_headroom for t in at_8)
    assert outcome.best is not None and outcome.best.candidate.mode.offload_ratio == 0.7


def test_a_ratio_far_from_the_measured_micro_batches_is_read_off_their_memory_line() -> None:
    """The truth's activations are 1.5 GiB a sample, the model's 1. The classic offload measured at micro-batches 2
    and 4: a ratio at micro-batch 8 is their line at 8 plus the model's difference between the ratio and the classic
    offload at 8 (what the ratio changes), not the nearest peak plus the model's whole difference (which would carry
    the model's activation slope over four micro-batches and put it 2 GiB low)."""
    machine = LinearMachine(memory_bytes=20 * GIB, activation_gib=1.5)
    search = mode_search(machine, LinearMemory(), {Rung.Z3_OFFLOAD_OPT: [_partial()]}, [Rung.Z3_OFFLOAD_OPT])
    for micro_batch in (2, 4):
        classic = Candidate(Rung.Z3_OFFLOAD_OPT, micro_batch, False)
        result, _ = machine.run(classic)
        search.outcome.trials.append(TrialRecord(classic, result, 0, search.limit_bytes))
    ratio_at_8 = Candidate(Rung.Z3_OFFLOAD_OPT, 8, False, Mode(offload_ratio=0.95))
    truth = machine.run(ratio_at_8)[0].peak_memory_bytes
    assert truth == int(linear_peak_gib(ratio_at_8, 12.0, 1.5) * GIB)
    assert abs(search.mode_walk.anchored_peak(ratio_at_8) - truth) <= 1


def test_the_simulated_fixed_batch_scenario_reaches_the_integer_best_partial_offload(monkeypatch) -> None:
    """benchmarks/gpu_sim's boundary-between-powers-fixed-batch: the integer best is partial offload at ratio 0.6;
    the ratio walk stopped at 0.65 (0.988 of it) while the model's slope said 0.6 could not fit; the line through
    the two ratios measured there says it does, and a trial confirms it."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from gpu_sim.scenarios import SCENARIOS
    from search_quality import run_scenario

    row = run_scenario(next(s for s in SCENARIOS if s.name == "boundary-between-powers-fixed-batch"))
    assert row["autotune"]["quality"] >= 0.99, row["autotune"]["tried"]
    assert row["autotune"]["quality"] >= row["ds_autotuning"]["quality"]
    # the benchmark's breakdown accounts for every launch once, by why it happened
    breakdown = row["autotune"]["launch_breakdown"]
    why = [name for name in breakdown if not name.startswith("could")]
    assert sum(breakdown[name] for name in why) == row["autotune"]["launches"]["fresh"]


def test_a_config_holding_no_less_device_memory_than_one_that_did_not_fit_is_never_launched() -> None:
    """The truth's activations are 1.5 GiB a sample, the model's 1: the classic optimizer offload at micro-batch 8
    runs out of memory (4 + 12 GiB > 14). A partial offload keeps more on the device than the classic one at the
    same micro-batch, so no ratio is tried at micro-batch 8 (the model alone would have said 0.85 fits there)."""
    machine = LinearMachine(memory_bytes=14 * GIB, activation_gib=1.5)
    outcome = mode_search(
        machine, LinearMemory(), {Rung.Z3_OFFLOAD_OPT: [_partial()]}, [Rung.Z3_OFFLOAD_OPT]
    ).run_search()
    classic_8 = Candidate(Rung.Z3_OFFLOAD_OPT, 8, False)
    assert classic_8 in machine.launched and machine.run(classic_8)[0].status == "oom_gpu"
    partial = [c for c in machine.launched if is_ratio_mode(c.mode) and not c.grad_checkpointing]
    assert partial and all(c.micro_batch < 8 for c in partial)
    assert outcome.best is not None


def test_holding_at_least_the_memory_of_follows_micro_batch_checkpointing_and_the_device_share() -> None:
    z3_offload = Rung.Z3_OFFLOAD_OPT
    measured = Candidate(z3_offload, 8, True)  # classic offload, with checkpointing
    assert holds_at_least_the_memory_of(Candidate(z3_offload, 8, True), measured)
    assert holds_at_least_the_memory_of(Candidate(z3_offload, 9, False), measured)  # more activations kept
    assert holds_at_least_the_memory_of(Candidate(z3_offload, 8, True, Mode(offload_ratio=0.5)), measured)
    assert not holds_at_least_the_memory_of(Candidate(z3_offload, 7, True), measured)
    assert not holds_at_least_the_memory_of(Candidate(Rung.Z3, 8, True), measured)  # another rung: no claim
    partial = Candidate(z3_offload, 8, False, Mode(offload_ratio=0.5))
    assert not holds_at_least_the_memory_of(Candidate(z3_offload, 8, False), partial)  # ratio 1 keeps less
    assert holds_at_least_the_memory_of(Candidate(z3_offload, 8, False, Mode(offload_ratio=0.3)), partial)
    assert not holds_at_least_the_memory_of(
        Candidate(z3_offload, 8, True, Mode(offload_ratio=0.3)),
        partial.__class__(z3_offload, 8, False, Mode(offload_ratio=0.5)),
    )  # checkpointing keeps less than without
    hpz = Candidate(Rung.Z3, 8, False, Mode(hpz_partition_size=8))
    assert not holds_at_least_the_memory_of(hpz, Candidate(Rung.Z3, 8, False))  # no claim across other modes


def test_modes_that_cannot_run_here_are_planned_listed_and_never_picked() -> None:
    """A mode the backend cannot run is predicted (and would be twice as fast): it is listed as planned, never
    launched, never the pick; the same mode when verifiable is launched and wins on its measured speed."""
    fast = Mode(hpz_partition_size=2)
    option = ModeOption(fast, "hpz", True, "secondary partition", trial_verifiable=False)
    machine = LinearMachine(memory_bytes=40 * GIB, fast_modes=(fast,))
    outcome = mode_search(machine, LinearMemory(), {Rung.Z3: [option]}, [Rung.Z3]).run_search()
    assert all(c.mode.is_classic for c in machine.launched)
    assert outcome.best is not None and outcome.best.candidate.mode.is_classic
    record = outcome.modes[0]
    assert record.status == "planned" and record.predicted_peak_bytes and record.samples_per_s is None

    verifiable = ModeOption(fast, "hpz", True, "secondary partition", trial_verifiable=True)
    machine = LinearMachine(memory_bytes=40 * GIB, fast_modes=(fast,))
    outcome = mode_search(machine, LinearMemory(), {Rung.Z3: [verifiable]}, [Rung.Z3]).run_search()
    assert outcome.best is not None and outcome.best.candidate.mode == fast
    assert outcome.modes[0].status == "measured"


def test_modes_take_only_the_budget_the_classic_ladder_left() -> None:
    machine = LinearMachine(memory_bytes=16 * GIB)
    rungs = [Rung.Z3, Rung.Z3_OFFLOAD_OPT]
    alone = LinearMachine(memory_bytes=16 * GIB)
    mode_search(alone, LinearMemory(), {}, rungs, max_trials=3).run_search()
    outcome = mode_search(
        machine, LinearMemory(), {Rung.Z3_OFFLOAD_OPT: [_partial()]}, rungs, max_trials=3
    ).run_search()
    assert machine.launched == alone.launched  # the classic ladder spent the budget: no mode trial displaced it
    assert len(machine.launched) == 3
    record = outcome.modes[0]
    assert record.status == "not tried" and "budget" in record.detail


@pytest.mark.parametrize("nodes", [1, 2])
def test_report_rows_applicable_modes_and_the_json_keeps_every_reason(nodes: int) -> None:
    """The markdown has a row per applicable mode and points to the JSON for the reasons (with their sources) and
    the modes that do not apply: the default report stays short."""
    facts = ModeFacts(nodes=nodes, gpus_per_node=4, device="cuda", allow_approximate=True)
    machine = LinearMachine(memory_bytes=16 * GIB)
    search = mode_search(machine, LinearMemory(), {}, [Rung.Z2_OFFLOAD_OPT, Rung.Z3, Rung.Z3_OFFLOAD_OPT])
    search.modes = lambda rung: considered_modes(rung, facts)
    search.memory = LinearMemory().model()
    outcome = search.run_search()
    report = _report(outcome.to_dict())
    text = render_markdown(report)
    data = report.to_json()
    assert "## Modern modes" in text
    considered = [(r.value, option) for r in search.rungs for option in considered_modes(r, facts)]
    lines = text.splitlines()
    for rung, option in considered:
        assert any(m["rung"] == rung and m["reason"] == option.reason for m in data["modes"])
        if not option.applies:
            assert option.reason not in text  # in the JSON, with its source
    for m in data["modes"]:
        assert any(line.startswith(f"| {m['rung']} | {m['label']} |") for line in lines) is m["applies"], m
    inapplicable = sum(not option.applies for _, option in considered)
    assert f"the {inapplicable} that do not: `modes` in the JSON" in text
    zero_pp = [m for m in data["modes"] if m["rung"] == "z3" and "hpZ" in m["label"]]
    assert zero_pp and all(m["applies"] is (nodes > 1) for m in zero_pp)
    if nodes == 1:
        assert any("on one node" in m["reason"] for m in zero_pp)


def _report(outcome: dict) -> TuneReport:
    """The search's outcome in a real report (tests/data/report), as tuner.report_of states it."""
    best = outcome["best"]
    choice = None
    if best:
        measured = {"samples_per_s": best["result"]["samples_per_s"], "tokens_per_s": None, "peak_bytes": None}
        details = {"description": "the choice", **measured, "predicted_peak_bytes": best["predicted_peak_bytes"]}
        choice = Choice.from_json({**best["candidate"], **details})
    return replace(
        golden_report(),
        model={"name": "gpt2"},
        verified=True,
        target_description="a fake GPU",
        seq_len=128,
        precision="bf16",
        world_size=1,
        headroom=1.0,
        limit_bytes=16 * GIB,
        device="cuda",
        trials_launched=len(outcome["trials"]),
        elapsed_s=0.0,
        stop_reason=StopReason(outcome["stop_reason"]),
        choice=choice,
        config_path="ds_config.json",
        launch=None,
        verdict=None,
        host_need=None,
        trials=tuple(TrialEntry.from_json(t) for t in outcome["trials"]),
        skipped=tuple(Skipped.from_json(s) for s in outcome["skipped"]),
        modes=tuple(ModeEntry.from_json(m) for m in outcome["modes"]),
    )


def test_mode_record_names_the_ratio_only_once_settled() -> None:
    record = ModeRecord(
        Rung.Z3_OFFLOAD_OPT, Mode(offload_ratio=0.5), True, "why", trial_verifiable=True, status="not tried"
    )
    assert record.to_dict()["label"] == "partial offload (offload ratio searched)"
    record.status, record.mode = "measured", Mode(offload_ratio=0.35)
    assert record.to_dict()["label"] == "offload ratio 0.35"


@pytest.mark.parametrize(
    ("name", "mode_part"), [("partial-offload-beats-neighbours", "ratio"), ("zeropp-wins-across-nodes", "hpz")]
)
def test_simulated_cluster_where_a_mode_is_the_answer_and_the_search_finds_it(monkeypatch, name, mode_part) -> None:
    """benchmarks/gpu_sim: its own physics of partial offload and ZeRO++ (not autotune's memory model); the
    exhaustive reference includes every mode setting, and the classic ladder alone is measurably slower."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from gpu_sim.scenarios import SCENARIOS
    from search_quality import run_scenario

    row = run_scenario(next(s for s in SCENARIOS if s.name == name))
    exhaustive, ours = row["exhaustive"], row["autotune"]
    assert exhaustive["samples_per_s"] > 1.05 * exhaustive["classic_best"]["samples_per_s"]
    assert mode_part in exhaustive["pick"] and mode_part in ours["pick"]
    assert ours["quality"] >= 0.999, ours["tried"]
    # the budget holds the search's own trials; the pick's fresh confirmation is outside it (Pick.confirm_fresh)
    assert ours["points"]["warm"] <= ours["budget"]
    assert ours["trials"] == ours["points"]["warm"] + len(ours["fresh_confirmations"])


def _tune_request(tmp_path, **overrides):
    from autotune.tuner import TuneRequest

    base = dict(
        model="tiny-gpt2",
        device="cpu",
        memory_budget="2GiB",
        seq_len=64,
        precision="fp32",
        micro_batches=(2, 4),
        rungs=(Rung.Z3_OFFLOAD_OPT,),
        out=str(tmp_path / "ds_config.json"),
        use_cache=False,
        allow_approximate=True,  # a partial offload ratio changes the update (autotune.modes.applies.approximation)
    )
    return TuneRequest.of(**{**base, **overrides})


def test_tune_passes_the_modes_to_the_search_and_writes_the_winning_ratio(tmp_path) -> None:
    """tune() asks autotune.modes.applies, trials carry DeepSpeed's ratio field, the winner's config keeps it, and the
    report's Modern modes section names what was not applicable on one CPU rank and why."""
    import json

    from autotune import tune

    launcher = RatioSpeedLauncher()
    result = tune(_tune_request(tmp_path), launcher=launcher)
    ratios = [c["zero_optimization"]["offload_optimizer"].get("ratio") for c in launcher.configs]
    assert any(r is not None and r < 1.0 for r in ratios)
    assert result.candidate is not None and is_ratio_mode(result.candidate.mode)
    written = json.loads(result.config_path.read_text())
    assert written["zero_optimization"]["offload_optimizer"]["ratio"] == result.candidate.mode.offload_ratio
    modes = result.report.to_json()["modes"]
    assert any(m["status"] == "measured" for m in modes)
    assert any(not m["applies"] and "one node" in m["reason"] for m in modes)
    text = result.report_path.read_text()
    assert "## Modern modes" in text and "A mode won" in text
    changed = [note for note in result.report.notes if note.startswith("changes the training:")]
    assert len(changed) == 1 and "partial offload" in changed[0]  # one line says what the picked mode changes
    from autotune.report.plot import _trial_rows

    assert any("ratio" in row["label"] for row in _trial_rows(result.report))  # the chart names the mode too


@pytest.mark.slow
def test_partial_offload_tuned_for_real_on_the_cpu_backend(tmp_path) -> None:
    """Real DeepSpeed trials (DS_ACCELERATOR=cpu): the search runs partial offload, DeepSpeed accepts the ratio and
    the sub_group_size that makes it act, and the trial comes back within the budget. Speeds are not compared
    (a shared CPU's timing is noise); only that the mode ran and was reported."""
    from autotune import tune

    result = tune(_tune_request(tmp_path, max_trials=4))
    partial = [t for t in result.report.trials if not t.candidate.mode.is_classic]
    assert partial and all(t.result.ok for t in partial), partial
    assert any(m.status == "measured" and m.trial_verifiable for m in result.report.modes)


def test_mode_trials_come_back_from_the_results_cache_and_bad_modes_do_not(tmp_path, caplog) -> None:
    """A cached mode trial is replayed (not measured again); a stored mode with a wrong field is skipped."""
    import json
    import logging
    import sqlite3

    from autotune.search.cache import ResultsCache

    cache = ResultsCache(tmp_path / "results.sqlite")
    partial = Candidate(Rung.Z3_OFFLOAD_OPT, 4, False, Mode(offload_ratio=0.35))
    result = TrialResult(
        status="ok", ranks=[RankMetrics(0, device_used_bytes=GIB)], step_times_s=[1.0], samples_per_s=3.0
    )
    cache.put_trial("k", partial, result)
    bad = {**partial.to_dict(), "mode": {**partial.mode.to_dict(), "offload_ratio": "0.35"}}
    with sqlite3.connect(cache.path) as db:
        row = cache.trial_row("k", json.dumps(bad), json.dumps(result.to_dict()))  # signed: only the mode is wrong
        db.execute("INSERT INTO signed_trials VALUES (?, ?, ?, ?, ?)", row)
    with caplog.at_level(logging.WARNING):
        assert cache.trials("k") == {partial: result}
    assert caplog.text.count("skipped a malformed cached trial") == 1


def test_plan_only_lists_the_modes_as_predictions(tmp_path) -> None:
    """No trials on this machine (a GPU type named, none here): the modes are still considered and predicted,
    every one not trial-verified, and the pick stays the classic recommendation."""
    from autotune import tune
    from autotune.tuner import TuneRequest

    request = TuneRequest.of(
        model="llama-2-7b", gpus=4, gpu_type="a10g", seq_len=256, out=str(tmp_path / "ds.json"), allow_approximate=True
    )
    result = tune(request)
    assert not result.verified and result.candidate is not None and result.candidate.mode.is_classic
    modes = result.report.to_json()["modes"]
    assert modes and not any(m["trial_verifiable"] for m in modes)
    partial = next(m for m in modes if m["rung"] == "z3+offload_opt" and m["mode"]["offload_ratio"] != 1.0)
    assert partial["status"] == "planned" and partial["predicted_peak_bytes"] and partial["micro_batch"] > 0
    assert "Plan only: every mode below is a prediction" in result.report_path.read_text()


def test_mode_summary_lists_predictions_groups_reasons_and_names_a_fit_when_nothing_classic_does() -> None:
    from autotune.modes.mode_summary import ModeSummary

    planned = ModeRecord(
        Rung.Z3_OFFLOAD_OPT,
        Mode(offload_ratio=0.7),
        True,
        "why",
        trial_verifiable=False,
        status="planned",
        micro_batch=2,
        grad_checkpointing=True,
        predicted_peak_bytes=3 << 30,
    )
    no_fit = ModeRecord(Rung.Z2_OFFLOAD_OPT, Mode(zenflow=True), True, "why", trial_verifiable=False, status="no fit")
    reason = "ZeRO++ cuts inter-node traffic; on one node there is none to cut"
    hpz = [
        ModeRecord(r, Mode(hpz_partition_size=8), False, reason, trial_verifiable=False)
        for r in (Rung.Z3, Rung.Z3_OFFLOAD_OPT)
    ]
    quantized = ModeRecord(
        Rung.Z3, Mode(quantized_weights=True, quantized_gradients=True), False, reason, trial_verifiable=False
    )
    summary = ModeSummary.from_records([planned, no_fit, *hpz, quantized])
    lines = summary.lines()
    assert "not trial-verified" in lines[0] and "never recommended over the pick" in lines[0]
    expected = "z3+offload_opt: offload ratio 0.7 fits at micro-batch 2, checkpointing on, predicted peak 3.0 GiB"
    assert expected in lines[1]
    assert "ZenFlow: predicted not to fit" in lines[2]
    assert lines[3:] == ["Modes that do not apply:", f"  ZeRO++ (on z3, z3+offload_opt): {reason}"]
    assert "never recommended" not in summary.lines(picked=False)[0]
    assert summary.nothing_fits_hint() == (
        "ZeRO-3 + optimizer->cpu at offload ratio 0.7 is predicted to fit at micro-batch 2 with checkpointing"
        " (not trial-verified here)"
    )
    assert ModeSummary.from_records([no_fit, *hpz]).nothing_fits_hint() == ""
    assert summary.to_dict()["predicted"][0]["fits"] is True

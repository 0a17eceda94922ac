"""The tuner end to end: real CPU trials where it matters, an injected launcher where only logic is tested."""

import json

import pytest
from tests.conftest import run_cli
from tests.fakes.launchers import CountingLauncher
from tests.fakes.requests import tune_request

from autotune import tune
from autotune.core.ladder import Candidate, Rung
from autotune.dsconfig.build_config import validate_with_deepspeed
from autotune.errors import NothingFitsError, UserError
from autotune.request.context import TuneContext
from autotune.search.records import SearchEvent
from autotune.trial.launch.chooser import TrialLaunchers
from autotune.tuner import TuneRequest
from autotune.tuning.trials import _replaced_note

MIB = 2**20


def test_global_batch_is_kept_and_the_config_is_valid(tmp_path) -> None:
    launcher = CountingLauncher()
    result = tune(
        tune_request(tmp_path, global_batch=12, gpus=2, micro_batches=None, max_micro_batch=16), launcher=launcher
    )
    config = json.loads(result.config_path.read_text())
    assert config["train_batch_size"] == 12
    assert config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"] * 2 == 12
    assert {s.ds_config["train_micro_batch_size_per_gpu"] for s in launcher.specs} <= {1, 2, 3, 6}
    validate_with_deepspeed(config, world_size=2)
    # where the launches went: every trial counted by why it ran; this launcher starts no processes of its own
    assert sum(result.report.launches_by_purpose.values()) == result.trials_launched == len(launcher.specs)
    assert result.report.process_starts is None


def test_the_pick_confirmed_in_a_fresh_process_is_the_memory_the_report_states(tmp_path) -> None:
    """The GPU default's shape (warm trials, the pick once more fresh: tuning/trials.py launcher_for) through the
    whole tuner: the fresh trial runs last, of the pick, and its peak (here 30 MiB over the warm ones) is the
    report's; a fresh peak over the limit would have moved the pick (tests/test_search_fresh_confirmation.py)."""
    warm, fresh = CountingLauncher(), CountingLauncher(base_mib=430)
    result = tune(tune_request(tmp_path, micro_batches=(1, 2, 4)), launcher=TrialLaunchers(warm, fresh))
    report = result.report
    assert report is not None and report.choice is not None and len(fresh.specs) == 1
    assert fresh.specs[0].ds_config == json.loads(result.config_path.read_text())  # the pick, as emitted
    # the walk's trials time the half micro-batch too (the lines' second point); the confirmation, after the walk,
    # does not (TuneContext.confirmation_spec)
    assert fresh.specs[0].smaller_micro_batch is None
    assert any(s.smaller_micro_batch for s in warm.specs)
    mb = report.choice.candidate.micro_batch
    assert report.choice.peak_bytes == (430 + mb) * 2**20 and report.choice.peak_in_fresh_process is True
    assert report.trials[-1].purpose == "fresh-process confirmation"
    assert report.launches_by_purpose["fresh-process confirmation"] == 1
    assert result.trials_launched == len(warm.specs) + 1
    assert "measured peak (in a fresh process, as your job starts)" in result.report_path.read_text()


def test_global_batch_that_no_micro_batch_divides_is_bad_input(tmp_path) -> None:
    with pytest.raises(UserError, match="not a multiple of the world size"):
        tune(tune_request(tmp_path, global_batch=7, gpus=2), launcher=CountingLauncher())
    with pytest.raises(UserError, match="no micro-batch"):
        tune(tune_request(tmp_path, global_batch=12, micro_batches=(5, 7)), launcher=CountingLauncher())


def test_interrupted_run_resumes_from_finished_trials(tmp_path) -> None:
    request = tune_request(tmp_path, micro_batches=(1, 2, 4, 8, 16, 32), memory_budget="1GiB")
    first = CountingLauncher(interrupt_after=1, mib_per_sample=40)  # heavier than predicted: several trials
    with pytest.raises(KeyboardInterrupt):
        tune(request, launcher=first)
    assert len(first.specs) == 1 and not (tmp_path / "ds_config.json").exists()  # nothing half-written
    second = CountingLauncher(mib_per_sample=40)
    result = tune(request, launcher=second)
    assert first.specs[0] not in second.specs  # the finished trial came from the cache
    assert any(t.from_cache for t in result.report.trials)
    third = CountingLauncher(mib_per_sample=40)
    hit = tune(request, launcher=third)
    assert hit.from_cache and not third.specs  # latency: benchmarks/cache_hit.py
    assert hit.config_path.read_bytes() == result.config_path.read_bytes()
    assert tune(request.updated(use_cache=False), launcher=CountingLauncher()).from_cache is False


def test_nothing_fits_exits_3_with_the_shortfall(tmp_path) -> None:
    with pytest.raises(NothingFitsError, match="shortfall"):
        tune(
            TuneRequest.of(
                model="llama-2-70b", gpus=1, gpu_type="t4", rungs=(Rung.Z0, Rung.Z2), out=str(tmp_path / "x.json")
            )
        )
    args = ("--model", "llama-2-70b", "--gpus", "1", "--gpu-type", "t4", "--rungs", "z0,z1,z2", "--out")
    done = run_cli(*args, str(tmp_path / "x.json"))
    assert done.returncode == 3 and "smallest shortfall" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "x.json").exists()


def test_plan_only_recommendation_is_labelled_and_valid(tmp_path) -> None:
    out = tmp_path / "t5" / "ds_config.json"
    done = run_cli("--model", "t5-3b", "--gpus", "8", "--gpu-type", "a100-80gb", "--out", str(out), "--hf")
    assert done.returncode == 0, done.stderr
    assert "PLAN ONLY: not verified by trials" in done.stdout
    report = json.loads((out.parent / "autotune-report.json").read_text())
    assert report["verified"] is False and report["trials"] == []
    config = json.loads(out.read_text())
    validate_with_deepspeed(config, world_size=8)
    assert (out.parent / "ds_config.hf.json").exists()
    assert "PLAN ONLY" in (out.parent / "autotune-report.md").read_text()


@pytest.mark.slow
def test_real_search_decides_from_what_it_measured_with_fewer_trials(tmp_path) -> None:
    """Real DeepSpeed trials on the CPU backend; asserts what the search decides, never a race between timings.

    Which config is faster on a loaded 2-core machine is noise (36.5 vs 189.8 samples/s seen for one config),
    so the comparison with an exhaustive grid lives in benchmarks/compare_tuners.py. Here: the choice is the
    fastest trial the search itself measured within headroom unless a tie or an interleaved re-measure decided
    otherwise (close_call), the largest micro-batch that fitted in its group,
    every group of the grid is accounted for (tried, or skipped with a reason), and fewer trials ran than the grid.
    """
    request = tune_request(tmp_path, micro_batches=(1, 8, 32), use_cache=False)
    result = tune(request)
    assert result.verified and result.candidate is not None
    trials = result.report.to_json()["trials"]
    grid_size = len(request.search.rungs or ()) * 2 * 3
    assert 0 < result.trials_launched == len(trials)
    assert len({json.dumps(t["candidate"], sort_keys=True) for t in trials}) < grid_size  # re-measures repeat some
    fitted = [t for t in trials if t["within_headroom"]]
    fastest = max(fitted, key=lambda t: t["result"]["samples_per_s"] or 0.0)
    if Candidate.from_dict(fastest["candidate"]) != result.candidate:  # only a tie or an interleaved re-measure
        assert result.report.verdict.tie or result.report.verdict.remeasured  # overrules the fastest
    group = [
        Candidate.from_dict(t["candidate"]).micro_batch
        for t in fitted
        if Candidate.from_dict(t["candidate"]).rung is result.candidate.rung
        and Candidate.from_dict(t["candidate"]).grad_checkpointing == result.candidate.grad_checkpointing
    ]
    assert result.candidate.micro_batch == max(group)
    tried = {(t["candidate"]["rung"], t["candidate"]["grad_checkpointing"]) for t in trials}
    skipped = {(s.rung, s.grad_checkpointing) for s in result.report.skipped if s.reason}
    assert tried | skipped == {(r.value, ck) for r in request.search.rungs or () for ck in (False, True)}


@pytest.mark.slow
def test_real_cache_hit_answers_without_trials(tmp_path) -> None:
    request = tune_request(tmp_path, micro_batches=(2,), rungs=(Rung.Z0,))
    first = tune(request)
    # with and without checkpointing, plus any close-call re-measurement: how many is the search's business
    assert first.trials_launched >= 1 and first.verified
    second = tune(request)
    assert second.from_cache and second.trials_launched == 0
    assert second.config_path.read_bytes() == first.config_path.read_bytes()


@pytest.mark.slow
def test_real_tune_ends_between_powers_of_two_on_a_boundary_a_trial_confirmed(tmp_path) -> None:
    """Real DeepSpeed trials on the CPU backend, default (integer) grid, a budget whose boundary falls between powers
    of two: tiny-gpt2 at 256 tokens measured about 11 MiB a sample over a 405-455 MiB process without checkpointing
    (a CI run at 660 MiB: 526 MiB at micro-batch 11, 582-592 at 16, 17 over: a boundary at 16 that run; here at
    800 MiB: 695-716 at 22-23, 24 over), so 90% of 800 MiB ends near 22-28, between 16 and 32 with room either
    side for warm workers' growth (up to 64 MiB, about 6 micro-batches). The largest micro-batch
    of the pick's group that ran within the budget is between powers of two, and a larger one is a trial that did
    not: the boundary is measured, not predicted. The pick itself is decided by speed: it may sit below the boundary
    where a smaller micro-batch measured as fast (a tie goes to the smaller, safer one).
    Several minutes on a loaded 2-core machine (one run: 10 trials, 16 min at load average 14)."""
    request = tune_request(
        tmp_path, seq_len=256, memory_budget="800MiB", rungs=(Rung.Z0,), max_micro_batch=64, use_cache=False
    )
    result = tune(request)
    pick = result.candidate
    assert result.verified and pick is not None
    group = [
        (Candidate.from_dict(t["candidate"]), t)
        for t in result.report.to_json()["trials"]
        if Candidate.from_dict(t["candidate"]).rung is pick.rung
        and Candidate.from_dict(t["candidate"]).grad_checkpointing == pick.grad_checkpointing
    ]
    assert any(c == pick and t["within_headroom"] for c, t in group)
    boundary = max(c.micro_batch for c, t in group if t["within_headroom"])
    assert boundary & (boundary - 1) != 0, (pick.key, boundary)  # not a power of two
    # the memory boundary was a trial, not a prediction: something larger in the pick's group did not fit
    assert any(c.micro_batch > boundary and not t["within_headroom"] for c, t in group)
    # CPU trials run in warm workers: fewer process starts than trials, a new one only after a failure
    assert 1 <= result.report.process_starts <= result.trials_launched


@pytest.mark.parametrize("workers_busy_before", [True, False], ids=["pick-after-other-trials", "pick-first"])
def test_real_tune_with_the_gpu_defaults_launchers_confirms_its_pick_in_a_fresh_process(
    tmp_path, workers_busy_before: bool
) -> None:
    """The GPU default's launchers (warm workers, then the pick once more in a process of its own after they stop:
    tuning/trials.py launcher_for) driving real DeepSpeed trials on the CPU backend, where `auto` confirms nothing
    (warm and fresh measured equal there): the pieces a GPU tune runs, end to end. Workers that ran a trial before
    the tune's (one of another micro-batch, here) leave every trial of it warm: the pick is launched once more; fresh
    workers make the tune's first trial, the pick here, the first its process ran: its own confirmation."""
    from autotune.trial import FreshAfterWarm, LocalLauncher, WarmWorkerPool, run_trial
    from autotune.trial.launch.ops import prebuild_ops

    prebuild_ops("cpu")  # an injected launcher gets no op preparation from the tuner
    env = {"MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}
    request = tune_request(tmp_path, seq_len=64, rungs=(Rung.Z0,), micro_batches=(1, 2), use_cache=False)
    with WarmWorkerPool(env=env) as pool:
        if workers_busy_before:
            other = TuneContext.build(request, outputs=False).spec(Candidate(Rung.Z0, 1))
            assert run_trial(other, pool).status == "ok"
        confirm = FreshAfterWarm(pool, LocalLauncher(env=env))
        result = tune(request, launcher=TrialLaunchers(pool, confirm))
    report = result.report
    assert report is not None and report.choice is not None and report.choice.peak_in_fresh_process
    picked = [t for t in report.trials if t.candidate == report.choice.candidate]
    assert confirm.launches == (1 if workers_busy_before else 0)
    confirmation = picked[-1]
    assert confirmation.within_headroom and confirmation.result.first_in_process
    assert report.choice.peak_bytes == confirmation.result.peak_memory_bytes
    if workers_busy_before:
        assert confirmation.purpose == "fresh-process confirmation" and not picked[0].result.first_in_process
    else:
        assert len(picked) == 1 and report.trials[0] is confirmation  # the workers' first trial, not run again
    assert report.process_starts == pool.restarts + confirm.launches


def test_replaced_warm_workers_get_a_progress_line() -> None:
    events: list[SearchEvent] = []
    note = _replaced_note(events.append)
    assert note is not None and _replaced_note(None) is None
    note(96 * 2**20, "device memory")
    assert [e.kind for e in events] == ["prepare"]  # the kind the progress printer shows as a plain line
    assert "device memory grew 96.0 MiB since their first trial" in events[0].message


def test_narrower_rungs_or_grid_reuse_the_trials_already_measured(tmp_path) -> None:
    """The trials' cache key leaves out what only chooses candidates (the rung list, the micro-batch grid): a re-run
    with a narrower `--rungs` or `--micro-batches` launches no trial for a candidate already measured, while the
    final answer (its own key) is searched again for the narrower question."""
    request = tune_request(tmp_path, micro_batches=(1, 2, 4), rungs=(Rung.Z0, Rung.Z1, Rung.Z3))
    first = CountingLauncher()
    tune(request, launcher=first)
    measured = {json.dumps(spec.ds_config, sort_keys=True) for spec in first.specs}
    for narrower_request in (request.updated(rungs=(Rung.Z0, Rung.Z1)), request.updated(micro_batches=(2, 4))):
        narrower = CountingLauncher()
        result = tune(narrower_request, launcher=narrower)
        assert not result.from_cache  # another question: the narrower search is decided again ...
        relaunched = [s for s in narrower.specs if json.dumps(s.ds_config, sort_keys=True) in measured]
        assert relaunched == []  # ... from the trials already measured
        assert result.report is not None and any(t.from_cache for t in result.report.trials)
    # what makes a trial valid stays in the key: another sequence length measures again
    other = CountingLauncher()
    tune(request.updated(rungs=(Rung.Z0,), micro_batches=(1,), seq_len=32), launcher=other)
    assert len(other.specs) == 1

"""How trials are run (`--trial-workers`): warm workers by default, on GPUs with the pick confirmed in a fresh
process, fresh processes when asked, and the warm pool's watch on the device memory a GPU worker keeps between
trials."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from tests.conftest import run_cli

from autotune.core.units import MiB
from autotune.errors import UserError
from autotune.request.tune_request import TuneRequest, confirms_pick_in_fresh_process, uses_warm_workers
from autotune.request.validation import validate
from autotune.trial import FreshAfterWarm, LocalLauncher, WarmWorkerPool
from autotune.trial.launch.warm import WARM_DEVICE_GROWTH_LIMIT_BYTES, WARM_GROWTH_LIMIT_BYTES, _Workers
from autotune.trial.rank_report import RankReport
from autotune.tuning.trials import launcher_for


@pytest.mark.parametrize(
    ("device", "asked", "warm", "confirmed"),
    [
        ("cpu", "auto", True, False),  # warm and fresh peaks measured equal on the CPU backend
        ("cuda", "auto", True, True),  # not yet compared on a GPU: the pick is confirmed in a fresh process
        ("cuda", "warm", True, False),  # asked for: warm only
        ("cuda", "fresh", False, False),
        ("cpu", "fresh", False, False),
    ],
)
def test_warm_workers_by_default_and_on_gpus_the_pick_confirmed_fresh(
    device: str, asked: str, warm: bool, confirmed: bool
) -> None:
    request = TuneRequest.of(model="tiny-gpt2", device=device, trial_workers=asked)
    validate(request, outputs=False)
    assert uses_warm_workers(request) is warm
    assert confirms_pick_in_fresh_process(request) is confirmed


@pytest.mark.parametrize("overrides", [{"nodes": 1}, {"nodes": 2}])
def test_an_own_command_starts_a_fresh_process_per_trial(overrides: dict) -> None:
    request = TuneRequest.of(model="tiny-gpt2", device="cuda", command=("python", "train.py"), **overrides)
    assert not uses_warm_workers(request) and not confirms_pick_in_fresh_process(request)


@pytest.mark.parametrize(
    ("device", "asked", "warm", "confirmed"),
    [
        ("cpu", "auto", True, True),  # warm == fresh measured on one CPU node only: across nodes, confirmed
        ("cuda", "auto", True, True),
        ("cuda", "warm", True, False),
        ("cpu", "fresh", False, False),
    ],
)
def test_several_nodes_run_warm_workers_and_confirm_the_pick_in_a_fresh_launch(
    device: str, asked: str, warm: bool, confirmed: bool
) -> None:
    request = TuneRequest.of(model="tiny-gpt2", device=device, nodes=2, trial_workers=asked)
    assert uses_warm_workers(request) is warm and confirms_pick_in_fresh_process(request) is confirmed


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_tuner_starts_the_launcher_the_request_asks_for(device: str) -> None:
    """No process starts here: the pool starts its workers at its first trial."""
    for asked, kind in (("warm", WarmWorkerPool), ("fresh", LocalLauncher), ("auto", WarmWorkerPool)):
        with launcher_for(TuneRequest.of(model="tiny-gpt2", device=device, trial_workers=asked), None) as chosen:
            assert isinstance(chosen.trials, kind)
            assert chosen.trials.env == ({"MALLOC_MMAP_THRESHOLD_": "65536"} if device == "cpu" else {})
            if asked == "auto" and device == "cuda":
                assert isinstance(chosen.confirm, FreshAfterWarm) and chosen.confirm.pool is chosen.trials
                assert isinstance(chosen.confirm.fresh, LocalLauncher)
            else:
                assert chosen.confirm is None
            assert chosen.process_starts == (None if kind is LocalLauncher else 0)


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"trial_workers": "sometimes"}, "--trial-workers must be one of auto, warm, fresh"),
        ({"trial_workers": "warm", "command": ("python", "train.py")}, "own command starts fresh"),
    ],
)
def test_warm_workers_refused_where_they_cannot_run(overrides: dict, words: str) -> None:
    with pytest.raises(UserError, match=words):
        validate(TuneRequest.of(model="tiny-gpt2", **overrides), outputs=False)


def test_warm_workers_across_nodes_are_a_valid_request() -> None:
    """Several nodes run warm workers too (trial/launch/warm_nodes.py); where they cannot start is the chooser's."""
    validate(TuneRequest.of(model="tiny-gpt2", trial_workers="warm", nodes=2), outputs=False)


def test_a_worker_still_holding_zeropp_groups_is_replaced_after_any_trial_even_its_first() -> None:
    """The groups' floor is the worker's count before its first trial (none): one left by that trial already
    replaces it (its next hpZ build would fail DeepSpeed's assertion, or reuse a group of another size)."""
    floor = {"host_rss_after_bytes": 900 * MiB, "zeropp_groups_after": 0}
    released = {0: RankReport(rank=0, status="ok", host_rss_after_bytes=900 * MiB, zeropp_groups_after=0, floor=floor)}
    assert _workers().growth(released) is None
    held = {1: RankReport(rank=1, status="ok", host_rss_after_bytes=900 * MiB, zeropp_groups_after=1, floor=floor)}
    assert _workers().growth(held) == ("ZeRO++ process groups", 1)


def test_a_bad_choice_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = run_cli("tune", "--model", "tiny-gpt2", "--trial-workers", "sometimes", "--out", str(tmp_path / "c.json"))
    assert done.returncode == 2, done.stderr
    assert "--trial-workers must be one of" in done.stderr and "Traceback" not in done.stderr
    assert not list(tmp_path.iterdir())


def _workers() -> _Workers:
    return _Workers((1, "cuda"), subprocess.Popen(["true"]), "tag", Path("/nonexistent"), gpus_before=None)


def _after(host: int, device: int | None) -> dict[int, RankReport]:
    return {0: RankReport(rank=0, status="ok", host_rss_after_bytes=host, device_after_bytes=device)}


def test_a_gpu_worker_whose_device_memory_grew_past_one_allocator_segment_is_replaced() -> None:
    workers = _workers()
    base = 900 * MiB
    assert workers.growth(_after(2000 * MiB, base)) is None  # the first trial sets the floors
    assert workers.growth(_after(2000 * MiB, base + WARM_DEVICE_GROWTH_LIMIT_BYTES)) is None  # within one segment
    assert workers.growth(_after(2000 * MiB, base + 64 * MiB)) == ("device memory", 64 * MiB)
    # host memory keeps its own, measured limit (larger: glibc's arenas move by more than the allocator's segments)
    assert workers.growth(_after(2000 * MiB + WARM_GROWTH_LIMIT_BYTES, base)) is None
    assert workers.growth(_after(2100 * MiB, base)) == ("host memory", 100 * MiB)


def test_cpu_workers_report_no_device_memory_and_are_judged_on_host_memory_alone() -> None:
    workers = _workers()
    assert workers.growth(_after(1000 * MiB, None)) is None
    assert workers.growth(_after(1010 * MiB, None)) is None
    assert workers.growth(_after(1100 * MiB, None)) == ("host memory", 100 * MiB)

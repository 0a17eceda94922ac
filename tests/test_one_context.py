"""plan, tune, hook and check answer one question: the same request gives the same context and the same answer."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from tests.conftest import run_cli
from tests.fakes.launchers import CountingLauncher

from autotune import tune
from autotune.cli import main
from autotune.core.ladder import Candidate, Rung
from autotune.errors import NothingFitsError
from autotune.tuner import TuneRequest

# (model, GPUs per node, nodes, GPU type): small and large models, tight and roomy cards, one and many nodes.
CASES = [
    ("gpt2-xl", 1, 1, "t4"),
    ("llama-2-7b", 1, 1, "a100-40gb"),
    ("llama-2-7b", 8, 1, "a100-80gb"),
    ("t5-3b", 8, 1, "a100-80gb"),
    ("t5-large", 1, 1, "v100-16gb"),
    ("llama-3-8b", 4, 1, "h100-80gb"),
    ("llama-2-70b", 8, 2, "h100-80gb"),
    ("opt-1.3b", 2, 1, "rtx-4090"),
    ("mistral-7b", 2, 1, "l40s"),
    ("gpt2", 1, 1, "l4"),
    ("falcon-7b", 8, 1, "a10g"),
    ("qwen2.5-7b", 1, 1, "h200"),
]


def _plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    with pytest.raises(SystemExit) as exited:
        main(["plan", *args, "--json"])
    return int(exited.value.code or 0), json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("model,gpus,nodes,gpu_type", CASES)
def test_plan_and_plan_only_tune_recommend_the_same_config(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, model: str, gpus: int, nodes: int, gpu_type: str
) -> None:
    shape = ["--model", model, "--gpus", str(gpus), "--nodes", str(nodes), "--gpu-type", gpu_type]
    code, planned = _plan_json(capsys, *shape)
    request = TuneRequest.of(model=model, gpus=gpus, nodes=nodes, gpu_type=gpu_type, out=str(tmp_path / "ds.json"))
    if planned["recommended"] is None:
        assert code == 3
        return
    assert code == 0
    result = tune(request)
    assert not result.verified
    assert result.candidate == Candidate.from_dict(planned["recommended"])
    assert result.report.seq_len == planned["settings"]["seq_len"]


def test_tune_leaves_the_callers_environment_and_deepspeed_accelerator_as_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's process that calls tune() and later deepspeed.initialize must get its own accelerator."""
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    import deepspeed.accelerator.real_accelerator as real_accelerator

    cached_before = real_accelerator.ds_accelerator
    before = dict(os.environ)
    common = {"model": "tiny-gpt2", "seq_len": 64, "cache_dir": str(tmp_path / "cache")}
    tune(
        TuneRequest.of(device="cpu", memory_budget="2GiB", rungs=(Rung.Z0,), out=str(tmp_path / "cpu.json"), **common),
        launcher=CountingLauncher(),
    )
    tune(TuneRequest.of(gpu_type="a100-80gb", out=str(tmp_path / "plan.json"), **common))  # validated by DeepSpeed
    assert dict(os.environ) == before
    assert "DS_ACCELERATOR" not in os.environ
    assert real_accelerator.ds_accelerator is cached_before
    assert "deepspeed.runtime.config" in sys.modules  # DeepSpeed really was imported in this process


def _check_json(capsys: pytest.CaptureFixture[str], config: Path) -> tuple[int, dict]:
    """`autotune check CONFIG --json` in this process (DeepSpeed is imported once for the whole module)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(["check", str(config), "--json"])
    return int(exited.value.code or 0), json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    "model,args",
    [
        ("t5-3b", ["--gpus", "8", "--gpu-type", "a100-80gb"]),
        ("llama-3-8b", ["--gpus", "8", "--gpu-type", "a100-80gb"]),
        ("llama-3-8b", ["--gpus", "1", "--gpu-memory", "24"]),  # bare number: GiB, recorded as given
    ],
)
def test_check_passes_on_the_plan_only_config_autotune_wrote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], model: str, args: list[str]
) -> None:
    out = tmp_path / "ds_config.json"
    with pytest.raises(SystemExit) as exited:
        main(["--model", model, *args, "--out", str(out)])
    assert exited.value.code == 0, capsys.readouterr().err
    recorded = json.loads((tmp_path / "ds_config.autotune.json").read_text())
    assert recorded["model"] == model and recorded["seq_len"] > 0 and recorded["grad_checkpointing"] is not None
    code, report = _check_json(capsys, out)
    assert code == 0, report
    assert report["fit"] and report["fit"]["fits"], report["fit"]


def test_check_reads_the_recorded_request_back_with_request_defaults_for_what_the_record_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:

    from autotune.cli.check import request_as_recorded

    out = tmp_path / "ds_config.json"
    with pytest.raises(SystemExit) as exited:
        main(["--model", "gpt2", "--gpus", "2", "--gpu-type", "a100-40gb", "--headroom", "0.8",
              "--attention", "eager", "--optimizer", "adafactor", "--out", str(out)])  # fmt: skip
    assert exited.value.code == 0, capsys.readouterr().err
    recorded = json.loads((tmp_path / "ds_config.autotune.json").read_text())
    request = request_as_recorded(recorded, seq_len=None)
    asked = (
        request.model.name,
        request.hardware.gpus,
        request.hardware.gpu_type,
        request.search.headroom,
        request.model.attention,
        request.training.optimizer,
    )
    assert asked == ("gpt2", 2, "a100-40gb", 0.8, "eager", "adafactor")
    assert (
        request.model.seq_len == recorded["seq_len"] and request_as_recorded(recorded, seq_len=64).model.seq_len == 64
    )
    # An older record with only its model: every other field is TuneRequest's own default, restated nowhere.
    assert request_as_recorded({"model": "gpt2"}, seq_len=None) == TuneRequest.of(model="gpt2")
    cpu = request_as_recorded({"model": "gpt2", "device": "cpu", "memory_bytes_per_rank": 2**30}, seq_len=None)
    assert cpu == TuneRequest.of(model="gpt2").updated(device="cpu", memory_budget=f"{2**30}B")


def test_check_passes_on_a_cpu_tune(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ds_config.json"
    request = TuneRequest.of(
        model="tiny-gpt2", device="cpu", memory_budget="1GiB", seq_len=64, rungs=(Rung.Z0, Rung.Z3), out=str(out),
        cache_dir=str(tmp_path / "cache"),
    )  # fmt: skip
    result = tune(request, launcher=CountingLauncher())
    assert result.verified
    code, report = _check_json(capsys, out)
    assert code == 0, report
    assert report["fit"]["fits"]


def _jittery_ram(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The real CPU target, with the available RAM a run sees set by the test (it moves between real runs)."""
    import autotune.request.context as context_module

    available = [2 * 2**30]
    real_target = context_module.cpu_target

    def jittery(request: TuneRequest):
        from dataclasses import replace

        target = real_target(request)
        budget = available[0]
        return replace(target, gpu=replace(target.gpu, memory_bytes=budget), free_memory_bytes=budget)

    monkeypatch.setattr(context_module, "cpu_target", jittery)
    return available


def test_a_repeat_cpu_tune_without_a_budget_is_a_cache_hit_despite_jitter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CPU budget defaults to the RAM available now, which moves between runs. Memory did not bind this
    search (the largest micro-batch fitted easily), so any limit the stored choice still fits gets the hit."""
    available = _jittery_ram(monkeypatch)
    request = TuneRequest.of(
        model="tiny-gpt2", device="cpu", seq_len=64, rungs=(Rung.Z0,), micro_batches=(1, 2),
        out=str(tmp_path / "ds.json"), cache_dir=str(tmp_path / "cache"),
    )  # fmt: skip
    first = tune(request, launcher=CountingLauncher())
    assert not first.from_cache
    for scale in (0.97, 1.03, 0.6, 2.0):
        available[0] = int(2 * 2**30 * scale)  # at most 4 GiB: within the RAM of the machine running the test
        launcher = CountingLauncher()
        again = tune(request, launcher=launcher)
        assert again.from_cache and again.candidate == first.candidate and not launcher.specs, scale
    available[0] = 300 * 2**20  # below the stored choice's measured peak: not a hit; tuned again, nothing fits
    with pytest.raises(NothingFitsError):
        tune(request, launcher=CountingLauncher())


def test_when_memory_bound_the_search_more_memory_means_a_new_search(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    available = _jittery_ram(monkeypatch)
    available[0] = 2**30
    request = TuneRequest.of(
        model="tiny-gpt2", device="cpu", seq_len=64, rungs=(Rung.Z0,), micro_batches=(1, 2, 4, 8, 16, 32),
        out=str(tmp_path / "ds.json"), cache_dir=str(tmp_path / "cache"),
    )  # fmt: skip
    first = tune(request, launcher=CountingLauncher(mib_per_sample=40))  # mb 16+ runs over 90% of 1 GiB
    assert first.candidate is not None and first.candidate.micro_batch < 32
    available[0] = int(2**30 * 1.03)  # jitter: same answer
    assert tune(request, launcher=CountingLauncher(mib_per_sample=40)).from_cache
    available[0] = 4 * 2**30  # memory bound the first search: with 4x the memory, search again
    bigger = tune(request, launcher=CountingLauncher(mib_per_sample=40))
    assert not bigger.from_cache and bigger.candidate.micro_batch > first.candidate.micro_batch


@pytest.mark.slow
def test_check_passes_on_a_real_cpu_tune_through_the_cli(tmp_path: Path) -> None:
    """Real DeepSpeed trials on the CPU backend, no --memory-budget (the RAM available now), then `check`."""
    out = tmp_path / "ds_config.json"
    tuned = run_cli(
        "--model", "tiny-gpt2", "--device", "cpu", "--seq-len", "32", "--rungs", "z0", "--micro-batches", "1,2",
        "--out", str(out), "--cache-dir", str(tmp_path / "cache"), timeout=900,
    )  # fmt: skip
    assert tuned.returncode == 0, tuned.stderr
    assert "started trial 1" in tuned.stderr  # piped: a timestamped line when each trial starts
    checked = run_cli("check", str(out), "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert json.loads(checked.stdout)["fit"]["fits"]


def test_piped_progress_is_plain_timestamped_lines_with_a_line_when_a_trial_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import io
    import re

    from rich.console import Console

    from autotune.cli.tune import TrialProgress
    from autotune.search.records import SearchEvent

    progress = TrialProgress(Console(file=io.StringIO(), stderr=True), max_trials=12, enabled=True)
    progress(SearchEvent("trial_start", Candidate(Rung.Z2, 8, True)))
    progress(SearchEvent("prepare", message="building DeepSpeed ops once"))
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2
    assert all(re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ autotune: ", line) for line in lines), lines
    assert "started trial 1 (budget 12): ZeRO-2" in lines[0]

"""The request each command builds from its options: the same `TuneRequest` as the commands built before the
mapping moved into one place (cli/request.py), and every field reachable from each command or declared absent."""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field, fields
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.cli.request import NOT_OFFERED, offered_fields, recorded_options, source_of, unwired_fields
from autotune.core.ladder import Rung
from autotune.hook import HookRequest, JobOverrides
from autotune.request.asks import SearchAsk
from autotune.request.tune_request import CPU_TUNE_TIME_BUDGET_S, SECTION, TuneRequest, flat_fields


class Captured(Exception):
    """Raised by the stand-ins below with what the command handed on, so nothing after the request runs."""

    def __init__(self, request: object) -> None:
        super().__init__("captured")
        self.request = request


def _raise_with(request: object, *_: object, **__: object) -> None:
    raise Captured(request)


def built_request(monkeypatch: pytest.MonkeyPatch, *argv: str) -> object:
    """What `autotune ARGV` hands to tune() (tune), TuneContext.build (plan) or run_hook (hook)."""
    import autotune.hook
    import autotune.request.context
    import autotune.tuner

    monkeypatch.setattr(autotune.tuner, "tune", _raise_with)
    monkeypatch.setattr(autotune.hook, "run_hook", _raise_with)
    monkeypatch.setattr(autotune.request.context.TuneContext, "build", staticmethod(_raise_with))
    with pytest.raises(Captured) as captured:
        main(list(argv))
    return captured.value.request


@pytest.fixture
def base(tmp_path: Path) -> Path:
    path = tmp_path / "base.json"
    path.write_text(json.dumps({"train_batch_size": "auto", "gradient_clipping": 1.0}))
    return path


def test_tune_with_no_options_asks_for_the_request_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    # on GPUs tune asks for the request's defaults, no time budget included (request/tune_request.py)
    defaults = TuneRequest.of(model="gpt2")
    assert built_request(monkeypatch, "--model", "gpt2") == defaults
    assert built_request(monkeypatch, "tune", "-m", "gpt2") == defaults


def test_tune_with_every_option(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, base: Path) -> None:
    argv = [
        "tune", "--model", "gpt2", "--gpus", "2", "--nodes", "1", "--gpu-memory", "24", "--seq-len", "128",
        "--decoder-seq-len", "64", "--global-batch", "16", "--precision", "fp16", "--attention", "eager",
        "--headroom", "0.8", "--max-trials", "5", "--time-budget", "60", "--max-micro-batch", "32",
        "--micro-batches", "4,1,2,2", "--rungs", "z0, z2+offload_opt", "--nvme-path", str(tmp_path),
        "--gpu-memory-fraction", "0.5", "--trial-timeout", "100", "--out", str(tmp_path / "ds.json"),
        "--report-dir", str(tmp_path / "report"), "--hf", "--no-cache", "--cache-dir", str(tmp_path / "cache"),
        "--script", "train.py", "--optimizer", "adafactor", "--lora-rank", "8", "--lora-targets", "q_proj, v_proj",
        "--kernels", "liger", "--host-memory", "64", "--trust-remote-code", "--allow-approximate",
        "--config", str(base), "--trial-workers", "fresh", "--json", "-v", "--", "torchrun", "train.py", "--deepspeed",
        "{ds_config}",
    ]  # fmt: skip
    assert built_request(monkeypatch, *argv) == TuneRequest.of(
        model="gpt2", gpus=2, nodes=1, gpu_memory="24", seq_len=128, decoder_seq_len=64, global_batch=16,
        precision="fp16", attention="eager", headroom=0.8, max_trials=5, time_budget_s=60.0, max_micro_batch=32,
        micro_batches=(1, 2, 4), rungs=(Rung.Z0, Rung.Z2_OFFLOAD_OPT), nvme_path=str(tmp_path),
        gpu_memory_fraction=0.5, trial_timeout_s=100.0, out=str(tmp_path / "ds.json"),
        report_dir=str(tmp_path / "report"), hf=True, use_cache=False, cache_dir=str(tmp_path / "cache"),
        script="train.py", optimizer="adafactor", lora_rank=8, lora_targets=("q_proj", "v_proj"), kernels="liger",
        host_memory="64", trust_remote_code=True, allow_approximate=True, base_config=str(base), trial_workers="fresh",
        command=("torchrun", "train.py", "--deepspeed", "{ds_config}"),
    )  # fmt: skip


def test_tune_on_the_cpu_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["--model", "tiny-gpt2", "--device", "cpu", "--gpus", "2", "--memory-budget", "2GiB", "-s", "32"]
    budget = CPU_TUNE_TIME_BUDGET_S  # tune's stated default time budget on the CPU backend
    expected = TuneRequest.of(
        model="tiny-gpt2", device="cpu", gpus=2, memory_budget="2GiB", seq_len=32, time_budget_s=budget
    )
    assert built_request(monkeypatch, *argv) == expected
    argv = ["--model", "gpt2", "--gpu-type", "a100-80gb", "--tokens-per-step", "4096", "--rungs", "", "--", "x"]
    expected = TuneRequest.of(model="gpt2", gpu_type="a100-80gb", tokens_per_step=4096, command=("x",))
    assert built_request(monkeypatch, *argv) == expected


def test_plan_with_no_options_and_with_every_option(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert built_request(monkeypatch, "plan", "--model", "gpt2") == TuneRequest.of(model="gpt2")
    argv = [
        "plan", "-m", "gpt2", "-g", "4", "-n", "2", "--gpu-type", "a100-80gb", "--gpu-memory-fraction", "0.5",
        "-s", "256", "--global-batch", "64", "--precision", "bf16", "--headroom", "0.7", "--attention", "flash",
        "--max-micro-batch", "16", "--micro-batches", "8,2", "--rungs", "z3", "--nvme-path", str(tmp_path),
        "--trust-remote-code", "--allow-approximate", "--micro-batch", "2", "--optimizer", "torch-adamw",
        "--lora-rank", "4", "--lora-targets", "c_attn", "--kernels", "flash-attn-fused", "--host-memory", "128GiB",
        "--decoder-seq-len", "32", "--config", "user.json", "--grad-checkpointing", "-v", "--json",
    ]  # fmt: skip
    assert built_request(monkeypatch, *argv) == TuneRequest.of(
        model="gpt2", gpus=4, nodes=2, gpu_type="a100-80gb", gpu_memory_fraction=0.5, seq_len=256, global_batch=64,
        precision="bf16", headroom=0.7, attention="flash", max_micro_batch=16, micro_batches=(2, 8),
        rungs=(Rung.Z3,), nvme_path=str(tmp_path), trust_remote_code=True, allow_approximate=True, micro_batch=2,
        optimizer="torch-adamw", lora_rank=4, lora_targets=("c_attn",), kernels="flash-attn-fused",
        host_memory="128GiB", decoder_seq_len=32, config="user.json",
    )  # fmt: skip
    argv = ["plan", "-m", "tiny-gpt2", "--device", "cpu", "--memory-budget", "1", "--micro-batches", ""]
    expected = TuneRequest.of(model="tiny-gpt2", device="cpu", memory_budget="1")
    assert built_request(monkeypatch, *argv) == expected


def test_hook_keeps_the_jobs_shape_and_shared_directory_out_of_the_tuning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, base: Path
) -> None:
    out = str(tmp_path / "ds.json")
    minimal = built_request(monkeypatch, "hook", "--model", "gpt2", "--out", out)
    assert minimal == HookRequest(
        tuning=TuneRequest.of(model="gpt2", out=out), shared_dir=None, overrides=JobOverrides()
    )
    shared = str(tmp_path / "shared")
    argv = [
        "hook", "-m", "tiny-gpt2", "--out", out, "--cache-dir", shared, "--time-budget", "120", "--strict",
        "--wait-timeout", "600", "--device", "cpu", "-g", "2", "-n", "1", "--nodelist", "node[01-02]",
        "--memory-budget", "2", "-s", "64", "--decoder-seq-len", "16", "--global-batch", "8", "--precision", "fp32",
        "--attention", "eager", "--headroom", "0.5", "--max-trials", "3", "--max-micro-batch", "8",
        "--micro-batches", "2,4", "--rungs", "z0,z3", "--nvme-path", str(tmp_path), "--trial-timeout", "50",
        "--report-dir", str(tmp_path / "report"), "--trust-remote-code", "--allow-approximate", "--config",
        str(base), "--optimizer", "adafactor", "--lora-rank", "2", "--lora-targets", "c_attn,c_proj", "-v",
        "--trial-workers", "fresh",
        "--", "torchrun", "--nproc-per-node", "{gpus}", "train.py", "--deepspeed", "{ds_config}",
    ]  # fmt: skip
    tuning = TuneRequest.of(
        model="tiny-gpt2", out=out, time_budget_s=120.0, device="cpu", memory_budget="2", seq_len=64,
        decoder_seq_len=16, global_batch=8, precision="fp32", attention="eager", headroom=0.5, max_trials=3,
        max_micro_batch=8, micro_batches=(2, 4), rungs=(Rung.Z0, Rung.Z3), nvme_path=str(tmp_path),
        trial_timeout_s=50.0, report_dir=str(tmp_path / "report"), trust_remote_code=True, allow_approximate=True,
        base_config=str(base), optimizer="adafactor", lora_rank=2, lora_targets=("c_attn", "c_proj"),
        trial_workers="fresh",
        command=("torchrun", "--nproc-per-node", "{gpus}", "train.py", "--deepspeed", "{ds_config}"),
    )  # fmt: skip
    assert built_request(monkeypatch, *argv) == HookRequest(
        tuning=tuning,
        shared_dir=shared,
        overrides=JobOverrides(gpus=2, nodes=1, nodelist="node[01-02]"),
        wait_timeout_s=600.0,
        strict=True,
    )


def _parameters(command: str) -> set[str]:
    from autotune.cli.hook import hook_command
    from autotune.cli.plan import plan_command
    from autotune.cli.tune import tune_command

    function = {"tune": tune_command, "plan": plan_command, "hook": hook_command}[command]
    return set(inspect.signature(function).parameters)


# What each command's options do besides asking for a tuning: output, the plan's --config question, the job.
_NOT_IN_THE_REQUEST = {
    "tune": {"as_json", "verbose"},
    "plan": {"as_json", "verbose", "grad_checkpointing"},
    "hook": {"as_json", "verbose", "strict", "wait_timeout", "print_env", "gpus", "nodes", "nodelist", "cache_dir"},
}


@pytest.mark.parametrize("command", ["tune", "plan", "hook"])
def test_every_request_field_is_an_option_of_each_command_or_declared_absent(command: str) -> None:
    parameters = _parameters(command)
    assert unwired_fields(command, parameters) == []
    # no stale declaration: each names a field (flat) or a whole section
    assert set(NOT_OFFERED[command]) <= {*flat_fields(), *(item.name for item in fields(TuneRequest))}
    read = {source_of(name).parameter for name in offered_fields(command)}
    assert parameters - read == _NOT_IN_THE_REQUEST[command]  # and no option the request forgets to read


def test_a_new_request_field_without_an_option_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a new TuneRequest field without CLI wiring does: every command names it, here and when it runs."""
    import autotune.cli.request

    @dataclass(frozen=True, kw_only=True)
    class WiderSearch(SearchAsk):
        new_knob: int = 0

    @dataclass(frozen=True, kw_only=True)
    class WiderRequest(TuneRequest):
        search: WiderSearch = field(default_factory=WiderSearch, metadata={SECTION: WiderSearch})

    monkeypatch.setattr(autotune.cli.request, "TuneRequest", WiderRequest)
    for command in ("tune", "plan", "hook"):
        assert unwired_fields(command, _parameters(command)) == ["new_knob"]
    with pytest.raises(TypeError, match="new_knob"):
        main(["plan", "--model", "gpt2"])


def test_check_reads_every_recorded_option_through_the_commands_mapping() -> None:
    from autotune.cli.check import request_as_recorded

    recorded = {
        "model": "gpt2", "gpus_per_node": 2, "nodes": 1, "gpu_type": "a100-40gb", "gpu_memory": None,
        "device": "cuda", "seq_len": 256, "precision": "bf16", "attention": "eager", "headroom": 0.8,
        "trust_remote_code": True, "optimizer": "adafactor", "lora_rank": 4, "lora_targets": ["c_attn"],
        "decoder_seq_len": None, "memory_bytes_per_rank": 40 * 2**30, "kernels": "liger", "grad_checkpointing": True,
    }  # fmt: skip
    assert request_as_recorded(recorded, seq_len=None) == TuneRequest.of(
        model="gpt2", gpus=2, nodes=1, gpu_type="a100-40gb", seq_len=256, precision="bf16", attention="eager",
        headroom=0.8, trust_remote_code=True, optimizer="adafactor", lora_rank=4, lora_targets=("c_attn",),
        kernels="liger",
    )  # fmt: skip
    assert set(recorded_options(recorded)) <= {source_of(name).parameter for name in flat_fields()}

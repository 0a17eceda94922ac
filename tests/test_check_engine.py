"""What DeepSpeed really does with the configs `autotune check` calls silently wrong: real engines on CPU.

One subprocess runs every case (tests/data/check/engine_cases.py) so DeepSpeed starts once; each test
then matches autotune's finding against the engine's behaviour.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autotune.check import CheckContext, Severity, config_findings, fix_config, load_config

# Real DeepSpeed engines for every case (one subprocess, ~80 s on a loaded 2-core machine): run with -m slow.
pytestmark = pytest.mark.slow

DATA = Path(__file__).parent / "data" / "check"
BASE: dict[str, Any] = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
ONE_GPU = CheckContext(1, "test", consumer="deepspeed")  # these cases are about DeepSpeed used directly


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Fix chat_answer.json with autotune, then run every engine case, the fixed config included."""
    work = tmp_path_factory.mktemp("engine")
    fixed = work / "fixed.json"
    # "auto" in batch keys, lr and clipping needs values chosen for the user: --fix-training
    result = fix_config(load_config(DATA / "chat_answer.json").config, ONE_GPU, fixed, allow_training_changes=True)
    assert result.written, result.rejected_by_deepspeed
    completed = subprocess.run(
        [sys.executable, str(DATA / "engine_cases.py"), str(fixed), str(work / "nvme")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "DS_ACCELERATOR": "cpu"},
        check=False,
    )
    lines = [line for line in completed.stdout.splitlines() if line.startswith("ENGINE_RESULTS ")]
    assert lines, completed.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("ENGINE_RESULTS "))


def severity_at(config: dict[str, Any], path: str) -> Severity:
    found = [f for f in config_findings(config, ONE_GPU) if f.path == path]
    assert found, f"no finding at {path}"
    return max((f.severity for f in found), key=[Severity.INFO, Severity.WARNING, Severity.ERROR].index)


def test_offload_param_is_ignored_at_stage_2(engine: dict[str, Any]) -> None:
    case = engine["offload_param_at_stage2"]
    assert case["stage"] == 2 and not case["params_partitioned"]
    assert case["optimizer"] == case["optimizer_without_offload_param"] == "DeepSpeedZeroOptimizer"
    assert case["cpu_offload"] == case["cpu_offload_without_offload_param"]
    config = {**BASE, "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}
    assert severity_at(config, "zero_optimization.offload_param") is Severity.WARNING


def test_nvme_optimizer_offload_runs_as_cpu_at_stage_2(engine: dict[str, Any]) -> None:
    case = engine["nvme_optimizer_at_stage2"]
    assert case["cpu_offload"] and not case["has_nvme_swapper"] and not case["nvme_dir_written"]
    config = {**BASE, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/x"}}}
    assert severity_at(config, "zero_optimization.offload_optimizer.device") is Severity.WARNING


def test_top_level_memory_efficient_linear_is_dropped(engine: dict[str, Any]) -> None:
    case = engine["top_level_memory_efficient_linear"]
    assert case == {"top_level": True, "under_zero_optimization": False}
    config = {**BASE, "memory_efficient_linear": False, "zero_optimization": {"stage": 3}}
    assert severity_at(config, "memory_efficient_linear") is Severity.WARNING


def test_unknown_top_level_key_is_dropped(engine: dict[str, Any]) -> None:
    from deepspeed.runtime.constants import GRADIENT_CLIPPING_DEFAULT

    assert engine["unknown_top_level_key"]["gradient_clipping"] == GRADIENT_CLIPPING_DEFAULT
    assert severity_at({**BASE, "gradient_clip": 0.25}, "gradient_clip") is Severity.WARNING


def test_auto_in_a_zero_field_falls_back_to_the_default(engine: dict[str, Any]) -> None:
    assert engine["auto_in_zero_field"]["reduce_bucket_size"] == 500_000_000
    config = {**BASE, "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}}
    assert severity_at(config, "zero_optimization.reduce_bucket_size") is Severity.WARNING


def test_auto_in_gradient_clipping_fails_at_the_first_step(engine: dict[str, Any]) -> None:
    case = engine["auto_in_gradient_clipping"]
    assert case["initialize"] == "ok" and case["step"]["error"] == "TypeError"
    assert severity_at({**BASE, "gradient_clipping": "auto"}, "gradient_clipping") is Severity.ERROR


def test_auto_in_optimizer_params_fails(engine: dict[str, Any]) -> None:
    assert engine["auto_in_optimizer_params"]["error"] == "TypeError"
    config = {**BASE, "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}
    assert severity_at(config, "optimizer.params.lr") is Severity.ERROR


def test_string_numbers_in_zero_fields(engine: dict[str, Any]) -> None:
    case = engine["string_number_in_zero_field"]
    assert case["1e9"]["error"] == "ValidationError" and case["1000000000"] == 10**9
    zero = {"stage": 2, "reduce_bucket_size": "1e9", "allgather_bucket_size": "1000000000"}
    assert severity_at({**BASE, "zero_optimization": zero}, "zero_optimization.reduce_bucket_size") is Severity.ERROR


def test_the_fixed_config_trains(engine: dict[str, Any]) -> None:
    assert engine["fixed_config_trains"] == {"result": "ok", "stage": 1}

"""Optimizer offload with no "optimizer" section, as LLaMA-Factory, FastChat, ms-swift and axolotl publish it.

Through the HF Trainer or accelerate the script's torch optimizer reaches accelerate's prepare(), which replaces it
by DeepSpeedCPUAdam (accelerate/accelerator.py, map_pytorch_optim_to_deepspeed): these configs train, so `check`
says so in a note and raises no error. Code calling deepspeed.initialize directly with a torch optimizer gets
ZeRORuntimeException: a warning there. The slow tests build the engine both ways for real (--init-check).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autotune.check import CheckContext, Severity, check_config, config_findings
from autotune.check.init_probe import run_init_check
from autotune.dsconfig.consumer import Consumer, fill_like_consumer

OFFLOAD = "zero_optimization.offload_optimizer"
HF_BATCH = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"}
# The shapes the projects publish (patterns; tests/data/check/corpus/README.md names the files they follow).
PUBLISHED_STYLE: dict[str, dict[str, Any]] = {
    "llamafactory_ds_z2_offload": {
        **HF_BATCH,
        "gradient_clipping": "auto",
        "zero_allow_untested_optimizer": True,
        "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16},
        "bf16": {"enabled": "auto"},
        "zero_optimization": {
            "stage": 2,
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
            "overlap_comm": False,
            "contiguous_gradients": True,
            "round_robin_gradients": True,
        },
    },
    "llamafactory_ds_z3_offload": {
        **HF_BATCH,
        "gradient_clipping": "auto",
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": "auto"},
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
            "offload_param": {"device": "cpu", "pin_memory": True},
            "stage3_gather_16bit_weights_on_model_save": True,
        },
    },
    "fastchat_s2": {
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}, "contiguous_gradients": True},
        "bf16": {"enabled": "auto"},
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
    },
    "msswift_zero2_offload": {
        **HF_BATCH,
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}},
        "steps_per_print": 2000,
        "wall_clock_breakdown": False,
    },
    "axolotl_zero2": {
        **HF_BATCH,
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}, "contiguous_gradients": True},
        "bf16": {"enabled": "auto"},
        "gradient_clipping": "auto",
    },
}


def _findings_at_offload(config: dict[str, Any], consumer: str) -> list[Any]:
    findings = config_findings(config, CheckContext(8, "test", consumer=consumer))
    assert not [f for f in findings if f.severity is Severity.ERROR], [f.message for f in findings]
    return [f for f in findings if f.path == OFFLOAD]


@pytest.mark.parametrize("name", sorted(PUBLISHED_STYLE))
@pytest.mark.parametrize("consumer", ["hf-trainer", "accelerate"])
def test_hf_and_accelerate_offload_without_optimizer_trains_with_a_note(name: str, consumer: str) -> None:
    (note,) = _findings_at_offload(PUBLISHED_STYLE[name], consumer)
    assert note.severity is Severity.INFO and note.fix is None
    assert "DeepSpeedCPUAdam" in note.message and "betas (0.9, 0.999), eps 1e-08" in note.message
    assert "lr, betas, eps and weight_decay carry over" in note.message  # what the mapping below keeps
    assert "become its defaults" not in note.message


@pytest.mark.slow
def test_accelerates_swap_keeps_the_users_betas_and_eps() -> None:
    """The note's claim, run: accelerate's own mapping of a torch AdamW (betas (0.5, 0.6), eps 1e-3, weight decay
    0.1, lr 2e-4) gives a DeepSpeedCPUAdam whose groups, which its step reads, hold the user's values. Builds
    DeepSpeed's CPU Adam op (cached in TORCH_EXTENSIONS_DIR)."""
    code = (
        "import json, torch\n"
        "from accelerate.utils.deepspeed import map_pytorch_optim_to_deepspeed\n"
        "p = [torch.nn.Parameter(torch.zeros(4))]\n"
        "user = torch.optim.AdamW(p, lr=2e-4, betas=(0.5, 0.6), eps=1e-3, weight_decay=0.1)\n"
        "mapped = map_pytorch_optim_to_deepspeed(user)\n"
        "g = mapped.param_groups[0]\n"
        "print('MAPPED ' + json.dumps({'cls': type(mapped).__name__, 'lr': g['lr'], 'betas': list(g['betas']),"
        " 'eps': g['eps'], 'weight_decay': g['weight_decay'], 'adamw': mapped.adam_w_mode}))\n"
    )
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("MAPPED "))
    mapped = json.loads(line.removeprefix("MAPPED "))
    assert mapped == {"cls": "DeepSpeedCPUAdam", "lr": 2e-4, "betas": [0.5, 0.6], "eps": 1e-3, "weight_decay": 0.1,
                      "adamw": True}  # fmt: skip


def test_deepspeed_directly_is_warned_with_a_fix_that_keeps_training() -> None:
    zero = {"stage": 2, "offload_optimizer": {"device": "cpu"}}
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero}
    (warning,) = _findings_at_offload(config, "deepspeed")
    assert warning.severity is Severity.WARNING and "ZeRORuntimeException" in warning.message
    assert warning.fix is not None and not warning.fix.changes_training


def test_an_accelerate_without_the_mapping_gets_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("autotune.check.initialize.accelerate_maps_client_optimizer", lambda: False)
    findings = config_findings(PUBLISHED_STYLE["axolotl_zero2"], CheckContext(8, "test", consumer="hf-trainer"))
    assert [f.severity for f in findings if f.path == OFFLOAD] == [Severity.ERROR]


def test_the_installed_accelerate_maps_the_optimizer() -> None:
    from autotune.check.initialize import accelerate_maps_client_optimizer

    assert accelerate_maps_client_optimizer()  # accelerate >= 1.15 is a dependency


def test_check_without_accelerate_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """An environment that lacks accelerate (installed with --no-deps): a one-line error, not a traceback."""
    blocker = tmp_path / "blocker" / "accelerate"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text('raise ModuleNotFoundError("no accelerate here", name="accelerate")')
    config = tmp_path / "ds_config.json"
    config.write_text('{"train_batch_size": "auto", "zero_optimization": {"stage": 2}}')
    pythonpath = os.pathsep.join([str(blocker.parent), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "autotune", "check", str(config)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": pythonpath},
        timeout=300,
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("autotune: error:")]
    assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "accelerate" in errors[0] and "--consumer deepspeed" in errors[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    "consumer,expected", [(Consumer.HF_TRAINER, "ok"), (Consumer.ACCELERATE, "ok"), (Consumer.DEEPSPEED, "failed")]
)
def test_init_check_builds_the_engine_as_the_consumer_does(consumer: Consumer, expected: str) -> None:
    """The same offload config trains through accelerate (DeepSpeedCPUAdam) and fails at deepspeed.initialize."""
    config = {**PUBLISHED_STYLE["axolotl_zero2"], "bf16": {"enabled": False}}
    if consumer is Consumer.DEEPSPEED:
        config = {**config, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1}
        config = {key: value for key, value in config.items() if value != "auto"}
    outcome = fill_like_consumer(config, consumer, world_size=8)
    assert not outcome.refusal and not outcome.unfilled
    result = run_init_check(outcome.filled, 8, consumer.value)
    assert result.status == expected, result
    if expected == "ok":
        assert "DeepSpeedCPUAdam" in result.detail
    else:
        assert "client provided optimizer" in result.detail or "ZeRO" in result.detail


@pytest.mark.slow
def test_init_check_on_a_llamafactory_offload_config_has_no_error(tmp_path: Path) -> None:
    path = tmp_path / "ds_z2_offload_config.json"
    path.write_text(json.dumps(PUBLISHED_STYLE["llamafactory_ds_z2_offload"]))
    report = check_config(path, CheckContext(8, "test"), init_check=True)
    assert report.consumer == "hf-trainer" and report.exit_code() == 0, [f.message for f in report.findings]
    (init,) = [f for f in report.findings if f.rule == "init"]
    assert "ok" in init.message and "DeepSpeedCPUAdam" in init.message

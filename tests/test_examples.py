"""examples/torchrun/run.sh and the SLURM example's training step (examples/slurm/train-step.sh, what every node of
train.sbatch runs after `eval "$(autotune hook ... --print-env)"`) train an HF Trainer script and a plain DeepSpeed
script on the CPU backend, two ranks, with the config the hook wrote. What is asserted is what the DeepSpeed engine
reports from inside the script (examples/training/common.py, `engine_facts`), against the values the hook's summary
names: batch, clipping, lr, betas (autotune.training.job_defaults for what the config leaves out). The SLURM job
itself runs under the `slurm` marker (tests/cluster/test_slurm.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from autotune.training.job_defaults import job_defaults

REPO = Path(__file__).resolve().parents[1]
HOOK_ARGS = "--micro-batches 1 --rungs z0 --max-trials 1"
USER_LR = 5e-5  # the HF script's own --learning_rate: the .hf.json's "auto" must hand it to DeepSpeed's optimizer
TRAIN_ARGS = {
    "hf": "--model tiny-gpt2 --seq_len 32 --max_steps 2 --use_cpu --report_to none --save_strategy no"
    f" --learning_rate {USER_LR}",
    "deepspeed": "--model tiny-gpt2 --seq_len 32 --steps 2",
}
SCRIPTS = {"hf": "examples/training/train_hf.py", "deepspeed": "examples/training/train_deepspeed.py"}


def _env(tmp_path: Path, kind: str, **extra: str) -> dict[str, str]:
    report = tmp_path / f"{kind}.json"
    out_dir = f" --output_dir {tmp_path / 'hf-out'}" if kind == "hf" else ""
    return {
        **{k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"},
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")])),
        "TOKENIZERS_PARALLELISM": "false",
        "AUTOTUNE_DEVICE": "cpu",
        "GPUS_PER_NODE": "2",
        "MODEL": "tiny-gpt2",
        "SEQ_LEN": "32",
        "AUTOTUNE_SHARED": str(tmp_path.parent / "shared"),
        "AUTOTUNE_OUT": str(tmp_path / "out" / "ds_config.json"),
        "AUTOTUNE_HOOK_ARGS": HOOK_ARGS,
        "TRAIN_SCRIPT": SCRIPTS[kind],
        "SCRIPT_KIND": kind,
        "TRAIN_ARGS": TRAIN_ARGS[kind] + out_dir + f" --report_json {report}",
        **extra,
    }


def _facts(tmp_path: Path, kind: str, done: subprocess.CompletedProcess[str]) -> dict:
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    return json.loads((tmp_path / f"{kind}.json").read_text())


def _assert_as_summarised(facts: dict, kind: str, config: dict, summary: str) -> None:
    """The engine's values are the config's and, where the config leaves them out, the ones the summary names."""
    micro, steps = config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]
    assert (facts["world_size"], facts["micro_batch"], facts["accumulation"]) == (2, micro, steps)
    assert facts["train_batch_size"] == config["train_batch_size"] == 2 * micro * steps
    assert "valid for world size 2" in summary
    defaults = job_defaults()
    assert "gradient_clipping" not in config and defaults.clipping is not None
    assert f"clips the gradient norm at its default {defaults.clipping.value}" in summary
    assert facts["gradient_clipping"] == defaults.clipping.value
    adam = {key: value.value for key, value in defaults.fused_adam.items()}
    assert f"lr {adam['lr']}, betas {adam['betas']}" in summary
    if kind == "deepspeed":  # ds_config.json: DeepSpeed's own defaults, as the placeholder note says
        assert (facts["lr"], facts["betas"], facts["eps"]) == (adam["lr"], list(adam["betas"]), adam["eps"])
    else:  # the .hf.json: the script's --learning_rate and TrainingArguments' betas/eps
        trainer = {key: value.value for key, value in defaults.trainer.items()}
        assert facts["lr"] == USER_LR
        assert facts["betas"] == [trainer["adam_beta1"], trainer["adam_beta2"]]
        assert facts["eps"] == trainer["adam_epsilon"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["hf", "deepspeed"])
def test_torchrun_example_trains_each_script_kind_as_summarised(tmp_path: Path, kind: str) -> None:
    done = subprocess.run(
        ["bash", "examples/torchrun/run.sh"], cwd=REPO, env=_env(tmp_path, kind), capture_output=True, text=True,
        timeout=1800,
    )  # fmt: skip
    facts = _facts(tmp_path, kind, done)
    config = json.loads((tmp_path / "out" / "ds_config.json").read_text())
    _assert_as_summarised(facts, kind, config, done.stderr)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["hf", "deepspeed"])
def test_slurm_training_step_runs_the_hooks_exports(tmp_path: Path, kind: str) -> None:
    """train.sbatch's steps 2-3 without SLURM: the hook's exports, then train-step.sh as each node runs it."""
    env = _env(tmp_path, kind)
    out = env["AUTOTUNE_OUT"]
    hook = (
        f"DS_ACCELERATOR=cpu autotune hook --model tiny-gpt2 --seq-len 32 --device cpu --gpus 2 --memory-budget 2GiB"
        f" --cache-dir {env['AUTOTUNE_SHARED']} --out {out} {HOOK_ARGS} --print-env"
    )
    step = (
        f'set -e; hook_env=$({hook}); eval "$hook_env"; export DS_ACCELERATOR=cpu'
        " AUTOTUNE_DS_CONFIG AUTOTUNE_HF_CONFIG AUTOTUNE_HF_ARGS AUTOTUNE_WORLD_SIZE;"
        " bash examples/slurm/train-step.sh"
    )
    env.update(NNODES="1", RANKS_PER_NODE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RDZV_ID="t")
    done = subprocess.run(["bash", "-c", step], cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    facts = _facts(tmp_path, kind, done)
    _assert_as_summarised(facts, kind, json.loads(Path(out).read_text()), done.stderr)


def test_the_training_step_refuses_another_world_size(tmp_path: Path) -> None:
    env = {**os.environ, "AUTOTUNE_WORLD_SIZE": "2", "NNODES": "1", "RANKS_PER_NODE": "4", "AUTOTUNE_HF_ARGS": ""}
    done = subprocess.run(["bash", "examples/slurm/train-step.sh"], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 2 and "valid for world size 2" in done.stderr


@pytest.mark.slow
def test_own_hf_trainer_command_trains_with_its_own_lr(tmp_path: Path) -> None:
    """Own-command mode with an HF Trainer command: its trials and the printed line get the .hf.json, so the
    user's --learning_rate is what the engine trains with (given ds_config.json it trained at DeepSpeed's 1e-3)."""
    import sys

    from tests.conftest import run_cli

    command = [sys.executable, SCRIPTS["hf"], "--deepspeed", "{ds_config}", "--per_device_train_batch_size",
               "{micro_batch}", "--gradient_accumulation_steps", "{grad_accum}", "--bf16", "{bf16}",  # HF matches them
               "--model", "tiny-gpt2", "--seq_len",
               "{seq_len}", "--max_steps", "40", "--use_cpu", "--report_to", "none", "--save_strategy", "no",
               "--output_dir", str(tmp_path / "hf-out"), "--learning_rate", str(USER_LR)]  # fmt: skip
    done = run_cli("--model", "tiny-gpt2", "--gpus", "1", "--device", "cpu", "--seq-len", "32", "--memory-budget",
                   "2GiB", "--micro-batches", "2", "--rungs", "z0", "--no-cache", "-o",
                   str(tmp_path / "out" / "ds_config.json"), "--json", "--", *command, timeout=1500)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    line = report["own_command"]["train_command"]
    assert str(tmp_path / "out" / "ds_config.hf.json") in line
    env = {k: v for k, v in os.environ.items() if k not in ("DS_ACCELERATOR", "RANK", "WORLD_SIZE", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))
    trained = subprocess.run(
        ["bash", "-c", f"{line} --max_steps 2 --report_json {tmp_path / 'facts.json'}"], cwd=REPO, env=env,
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-3000:]
    facts = json.loads((tmp_path / "facts.json").read_text())
    assert facts["lr"] == USER_LR and facts["micro_batch"] == report["choice"]["micro_batch"] == 2
    trainer = {key: value.value for key, value in job_defaults().trainer.items()}
    assert facts["gradient_clipping"] == trainer["max_grad_norm"]
    assert facts["betas"] == [trainer["adam_beta1"], trainer["adam_beta2"]]
    notes = " ".join(report["notes"])
    assert f"--max_grad_norm (default {trainer['max_grad_norm']})" in notes

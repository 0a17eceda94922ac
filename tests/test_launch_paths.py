"""Every launch path autotune emits trains the example scripts on the CPU backend with the tuned values.

The commands are run as printed (through bash); only the CPU-only and length flags are appended. What is
asserted is what the DeepSpeed engine reports from inside the script (examples/training/common.py,
`engine_facts`), not what our files say.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from autotune.core.ladder import Candidate, Rung
from autotune.dsconfig.build_config import TrainSettings, build_ds_config
from autotune.dsconfig.emit import emit_launchers, write_configs
from autotune.dsconfig.launchers import LaunchCommands
from autotune.trial.launch.shm import remove_segments

REPO = Path(__file__).resolve().parents[1]
PLAIN = "examples/training/train_deepspeed.py"
HF = "examples/training/train_hf.py"
# Appended to the emitted commands: a short run of a tiny model, HF's CPU switch, no checkpoints.
PLAIN_EXTRA = " --model tiny-gpt2 --seq_len 32 --steps 2"
HF_EXTRA = " --model tiny-gpt2 --seq_len 32 --max_steps 2 --use_cpu --report_to none --save_strategy no"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def emitted(
    tmp_path: Path,
    candidate: Candidate,
    world: int,
    global_batch: int,
    optimizer: str = "adamw",
    lora_rank: int | None = None,
) -> LaunchCommands:
    settings = TrainSettings(world_size=world, global_batch=global_batch, hidden_size=64, optimizer=optimizer)
    config = build_ds_config(candidate, settings)
    config_path, _ = write_configs(config, world, tmp_path / "ds_config.json", hf=True)
    return emit_launchers(
        config,
        candidate,
        config_path,
        world,
        nodes=1,
        script=PLAIN,
        optimizer=optimizer,
        lora_rank=lora_rank,
        hf_script=HF,
        device="cpu",
    )


def run_path(command: str, tmp_path: Path) -> dict:
    """Run one emitted command; return the ENGINE facts rank 0 printed."""
    port = str(_free_port())
    command = command.replace("deepspeed --num_gpus", f"deepspeed --master_port {port} --num_gpus")
    command = command.replace("torchrun --nproc-per-node", f"torchrun --master-port {port} --nproc-per-node")
    env = {  # no DS_ACCELERATOR: a command tuned on the CPU backend says so itself
        **{k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"},
        "TOKENIZERS_PARALLELISM": "false",
        "MASTER_PORT": port,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")])),
    }
    extra = HF_EXTRA + f" --output_dir {tmp_path / 'out'}" if HF in command else PLAIN_EXTRA
    started = time.time()
    try:
        done = subprocess.run(
            ["bash", "-c", command + extra], cwd=REPO, capture_output=True, text=True, env=env, timeout=900
        )
    finally:
        remove_segments([int(port)], since=started)  # what DeepSpeed's CPU all-reduce leaves (trial/launch/shm.py)
    assert done.returncode == 0, (command, (done.stdout + done.stderr)[-4000:])
    lines = [line for line in done.stdout.splitlines() if line.startswith("ENGINE ")]
    assert lines, done.stdout[-2000:]
    return json.loads(lines[-1].removeprefix("ENGINE "))


def test_commands_use_each_launchers_own_conventions(tmp_path: Path) -> None:
    launch = emitted(tmp_path, Candidate(Rung.Z3, 2, True), 2, 8)
    assert f"{PLAIN} --deepspeed --deepspeed_config {tmp_path / 'ds_config.json'}" in launch.deepspeed
    assert launch.torchrun.startswith("DS_ACCELERATOR=cpu OMP_NUM_THREADS=$(( $(nproc) / 2 )) torchrun --standalone")
    assert "deepspeed --master_port $(python3 -c " in launch.deepspeed  # a free port, not 29500 for every job
    assert "--main_process_port $(python3 -c " in launch.accelerate
    printed = (launch.deepspeed, launch.hf_trainer, launch.accelerate)
    assert all(command.startswith("DS_ACCELERATOR=cpu ") for command in printed)
    assert f"--deepspeed {tmp_path / 'ds_config.hf.json'}" in launch.hf_trainer
    assert (
        launch.hf_flags
        == "--per_device_train_batch_size 2 --gradient_accumulation_steps 2 --bf16 --gradient_checkpointing"
    )
    yaml = (tmp_path / "ds_config.accelerate.yaml").read_text()
    assert f"deepspeed_config_file: {tmp_path / 'ds_config.hf.json'}" in yaml and "num_processes: 2" in yaml
    assert "zero3_init_flag: true" in yaml and "mixed_precision" not in yaml
    hf = json.loads((tmp_path / "ds_config.hf.json").read_text())
    tuned = [hf["train_micro_batch_size_per_gpu"], hf["gradient_accumulation_steps"], hf["bf16"]["enabled"]]
    assert tuned == [2, 2, True] and "auto" not in json.dumps(hf["zero_optimization"])


def test_client_optimizer_and_lora_reach_the_flags(tmp_path: Path) -> None:
    launch = emitted(tmp_path, Candidate(Rung.Z2, 1, False), 1, 1, optimizer="adafactor", lora_rank=8)
    assert launch.deepspeed.endswith("--optimizer adafactor --lora_rank 8")
    assert "--optim adafactor --lora_rank 8" in launch.hf_flags
    assert "optimizer" not in json.loads((tmp_path / "ds_config.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("path", ["deepspeed", "torchrun", "hf_trainer", "accelerate"])
def test_each_launch_path_trains_with_the_tuned_values(tmp_path: Path, path: str) -> None:
    launch = emitted(tmp_path, Candidate(Rung.Z2, 2, True), 1, 4)  # micro-batch 2 x accumulation 2
    facts = run_path(getattr(launch, path), tmp_path)
    assert (facts["micro_batch"], facts["accumulation"], facts["train_batch_size"]) == (2, 2, 4)
    assert (facts["precision"], facts["param_dtype"], facts["zero_stage"]) == ("bf16", "bfloat16", 2)
    assert facts["gradient_checkpointing"] is True
    assert facts["optimizer"] == "FusedAdam"  # DeepSpeed's AdamW, as the config names it
    assert facts["global_steps"] == 2


@pytest.mark.slow
def test_two_rank_torchrun_keeps_the_global_batch(tmp_path: Path) -> None:
    launch = emitted(tmp_path, Candidate(Rung.Z1, 1, False), 2, 4)
    facts = run_path(launch.torchrun, tmp_path)
    assert (facts["world_size"], facts["micro_batch"], facts["accumulation"], facts["train_batch_size"]) == (2, 1, 2, 4)


@pytest.mark.slow
@pytest.mark.parametrize("path", ["deepspeed", "hf_trainer"])
def test_adafactor_with_lora_trains_in_both_script_styles(tmp_path: Path, path: str) -> None:
    launch = emitted(tmp_path, Candidate(Rung.Z2, 2, False), 1, 2, optimizer="adafactor", lora_rank=4)
    facts = run_path(getattr(launch, path), tmp_path)
    assert facts["optimizer"] == "Adafactor" and facts["micro_batch"] == 2
    assert 0 < facts["trainable_params"] < 20_000  # adapters only (tiny-gpt2 has 182k parameters)

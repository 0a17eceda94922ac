"""The emitted --hf config trains with a real transformers.Trainer under DeepSpeed (CPU backend)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.dsconfig import TrainSettings, build_ds_config, hf_variant
from autotune.emit import write_configs
from autotune.ladder import Candidate, Rung

SCRIPT = Path(__file__).parent / "scripts" / "hf_trainer_steps.py"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("rung", [Rung.Z2, Rung.Z3])
def test_hf_variant_trains_three_steps_with_trainer(tmp_path: Path, rung: Rung) -> None:
    config = build_ds_config(Candidate(rung, 2, False), TrainSettings(world_size=1, hidden_size=64))
    config_path, hf_path = write_configs(config, 1, tmp_path / "ds_config.json", hf=True)
    assert config_path.exists() and hf_path is not None
    assert json.loads(hf_path.read_text())["train_micro_batch_size_per_gpu"] == "auto"
    env = {
        **os.environ, "DS_ACCELERATOR": "cpu", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
        "ACCELERATE_USE_DEEPSPEED": "true", "TOKENIZERS_PARALLELISM": "false",
    }
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(hf_path), str(tmp_path / "out"), "tiny-gpt2", "3", "2", "0"],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["global_step"] == 3 and result["loss"] > 0
    assert hf_variant(config)["zero_optimization"]["stage"] == rung.stage

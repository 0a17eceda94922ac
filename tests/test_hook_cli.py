"""`autotune hook` on the command line: stdout a script can consume, one-line errors, exit codes.

A result is published first with a stand-in tune() (same options as the command line's), so the CLI
runs the real hit path in a fraction of a second; misses with real trials are in test_hook_e2e.py.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from tests.conftest import run_cli
from tests.fakes.hook import FakeTune, hook_request, slurm_env, slurm_launcher_chooser

from autotune.hook import run_hook

OPTIONS = ["--device", "cpu", "--model", "tiny-gpt2", "--memory-budget", "1GiB", "--seq-len", "32"]


def publish_with_fake(shared: Path, env: dict[str, str], fake: FakeTune) -> None:
    request = hook_request(shared / "seed.json", shared)
    run_hook(request, environ=env, tune_fn=fake, launcher_chooser=slurm_launcher_chooser)


def test_print_env_is_safe_to_eval_and_points_at_the_config(tmp_path: Path) -> None:
    shared = tmp_path / "shared dir"
    publish_with_fake(shared, {}, FakeTune())
    out = tmp_path / "out dir" / "ds config.json"
    done = run_cli("hook", *OPTIONS, "--cache-dir", str(shared), "--out", str(out), "--print-env")
    assert done.returncode == 0, done.stderr
    names = [line.split("=", 1)[0] for line in done.stdout.splitlines()]
    assert names == [f"export AUTOTUNE_{n}" for n in ("DS_CONFIG", "HF_CONFIG", "HF_ARGS", "WORLD_SIZE")]
    shown = subprocess.run(
        ["bash", "-c", 'eval "$1"; cat "$AUTOTUNE_DS_CONFIG"; echo "#"; cat "$AUTOTUNE_HF_CONFIG"; echo "#";'
         ' echo "$AUTOTUNE_HF_ARGS|$AUTOTUNE_WORLD_SIZE"', "_", done.stdout],
        capture_output=True,
        text=True,
        check=True,
    )  # fmt: skip
    config = json.loads(out.read_text())
    ds_text, hf_text, rest = shown.stdout.split("\n#\n")
    assert ds_text + "\n" == out.read_text() == (shared / "seed.json").read_text()
    assert json.loads(hf_text)["train_micro_batch_size_per_gpu"] == config["train_micro_batch_size_per_gpu"]
    flags, world = rest.strip().split("|")
    micro, steps = config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]
    assert flags.startswith(f"--per_device_train_batch_size {micro} --gradient_accumulation_steps {steps}")
    assert int(world) == 1  # the seed config fixes no train_batch_size: the job's shape, one rank here
    assert "published result" in done.stderr
    assert f"valid for world size {world}" in done.stderr and "train: HF Trainer script:" in done.stderr


def test_plain_output_is_the_config_path_and_json_names_the_role(tmp_path: Path) -> None:
    publish_with_fake(tmp_path, {}, FakeTune())
    done = run_cli("hook", *OPTIONS, "--cache-dir", str(tmp_path), "--out", str(tmp_path / "a.json"))
    assert done.returncode == 0 and done.stdout.strip() == str(tmp_path / "a.json")
    second = run_cli("hook", *OPTIONS, "--cache-dir", str(tmp_path), "--json", "-o", str(tmp_path / "b.json"))
    data = json.loads(second.stdout)
    assert (data["role"], data["status"], data["verified"]) == ("hit", "complete", True)


def test_a_fallback_is_written_with_a_loud_warning_and_strict_refuses_it(tmp_path: Path) -> None:
    env = slurm_env("55")
    publish_with_fake(tmp_path, env, FakeTune(error=RuntimeError("worker crashed")))
    args = ["hook", *OPTIONS, "--cache-dir", str(tmp_path)]
    done = run_cli(*args, "--out", str(tmp_path / "ds.json"), env=env)
    assert done.returncode == 0, done.stderr
    assert "WARNING: fallback config (NOT VERIFIED: plan-only)" in done.stderr and "!!!!!!!!" in done.stderr
    strict = run_cli(*args, "--out", str(tmp_path / "strict.json"), "--strict", env=env)
    assert strict.returncode == 4 and not (tmp_path / "strict.json").exists()
    assert strict.stderr.strip().splitlines() == [strict.stderr.strip()]
    assert strict.stderr.startswith("autotune: error: --strict: no config written, because tuning failed")


def test_contradictory_environment_is_one_line_and_exit_2(tmp_path: Path) -> None:
    env = {**slurm_env(), "SLURM_GPUS_ON_NODE": "8", "CUDA_VISIBLE_DEVICES": "0,1"}
    done = run_cli("hook", "--model", "tiny-gpt2", "--cache-dir", str(tmp_path), env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert re.fullmatch(
        r"autotune: error: SLURM_GPUS_ON_NODE=8 says 8 GPU\(s\) per node but [012] are visible .*", done.stderr.strip()
    )
    missing = run_cli("hook", "--model", "tiny-gpt2", "--device", "cpu", env={"SLURM_JOB_ID": "3"})
    assert missing.returncode == 2 and "neither SLURM_JOB_NUM_NODES nor SLURM_NNODES" in missing.stderr


def test_the_hook_asks_the_question_tune_asks(tmp_path: Path, monkeypatch) -> None:
    """Optimizer, LoRA, kernels and the decoder length reach the hook's tuning request as they reach tune's."""
    import pytest

    import autotune.hook
    from autotune.cli import main

    seen = []

    def capture(request, **callbacks):
        seen.append(request.tuning)
        raise SystemExit(0)

    monkeypatch.setattr(autotune.hook, "run_hook", capture)
    args = ["--optimizer", "adafactor", "--lora-rank", "8", "--lora-targets", "c_attn", "--kernels", "stock"]
    with pytest.raises(SystemExit):
        main(["hook", *OPTIONS, "--cache-dir", str(tmp_path), *args])
    (tuning,) = seen
    assert (tuning.training.optimizer, tuning.model.lora_rank, tuning.model.lora_targets, tuning.model.kernels) == (
        "adafactor",
        8,
        ("c_attn",),
        "stock",
    )
    bad = run_cli("hook", *OPTIONS, "--cache-dir", str(tmp_path), "--lora-rank", "-1")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0, bad.stderr

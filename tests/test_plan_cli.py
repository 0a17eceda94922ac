"""`autotune plan` as users run it: table, JSON, errors, and how fast it answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from tests.conftest import run_cli

from autotune.cli import main
from autotune.models import resolve_model, summarize


def run_in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(["plan", *args])
    captured = capsys.readouterr()
    return int(exited.value.code or 0), captured.out, captured.err


def test_table_has_a_row_per_rung_and_checkpointing(capsys):
    code, out, _ = run_in_process(capsys, "--model", "gpt2", "--gpus", "2", "--gpu-type", "a100-80gb", "-s", "1024")
    assert code == 0
    for rung in ("z0", "z1", "z2", "z3", "z3+nvme"):
        assert rung in out
    assert "Fastest predicted to fit" in out
    assert out.count(" off ") >= 9 and out.count(" on ") >= 9


def test_verbose_lists_components(capsys):
    code, out, _ = run_in_process(capsys, "--model", "gpt2", "--gpu-memory", "24GiB", "-v")
    assert code == 0
    for name in ("model states", "activations", "logits", "cuda context", "reduce buckets"):
        assert name in out


def test_json_output(capsys):
    code, out, _ = run_in_process(
        capsys, "--model", "gpt2", "--gpus", "4", "--gpu-type", "a100-40gb", "--global-batch", "64", "--json"
    )
    assert code == 0
    data = json.loads(out)
    assert len(data["rows"]) == 18
    assert data["settings"]["seq_len"] == 1024  # min(2048, GPT-2's 1024 positions)
    assert data["fastest_fit"]["micro_batch"] in (1, 2, 4, 8, 16)
    first = data["rows"][0]
    assert {"rung", "grad_checkpointing", "micro_batch", "estimate", "verdict"} <= set(first)
    assert first["estimate"]["gpu_components"]["model_states"] > 0


def test_nothing_fits_shows_the_table_and_exits_3(capsys):
    code, out, err = run_in_process(capsys, "--model", "gpt2-xl", "--gpu-memory", "1GiB", "--seq-len", "1024")
    assert code == 3  # like `autotune` itself: a script can tell "nothing fits" from a plan
    assert "Nothing fits" in out and "nothing fits" in err


@pytest.mark.parametrize(
    "args,message",
    [
        (["--model", "gpt2", "--gpu-memory", "80GiB", "--seq-len", "0"], "--seq-len must be positive"),
        (["--model", "gpt2", "--gpu-memory", "80GiB", "--seq-len", "4096"], "exceeds the model's 1024 positions"),
        (["--model", "gpt2", "--gpu-memory", "80GiB", "--headroom", "1.5"], "--headroom"),
        (["--model", "gpt2", "--gpu-memory", "80GiB", "--attention", "xformers"], "--attention"),
        (["--model", "gpt2", "--gpu-memory", "80GiB", "--precision", "int8"], "--precision"),
        (["--model", "no-such-model", "--gpu-memory", "80GiB"], "unknown model"),
        (["--model", "gpt2", "--gpu-type", "a100-80gb", "--gpu-memory", "80GiB"], "not both"),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys, args, message):
    code, _, err = run_in_process(capsys, *args)
    assert code == 2
    assert message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_no_gpu_here_and_no_profile_is_a_clear_error():
    result = run_cli("plan", "--model", "tiny-gpt2", env={"CUDA_VISIBLE_DEVICES": ""})
    if "NVIDIA" in result.stdout:  # pragma: no cover - a GPU machine would plan for its own GPUs
        pytest.skip("this machine has a GPU")
    assert result.returncode == 2
    assert "--gpu-type" in result.stderr and "Traceback" not in result.stderr


def test_70b_plan_is_fast_and_imports_neither_torch_nor_deepspeed():
    """Warm summary cache: the CLI process must answer well under 5 s and never load torch or DeepSpeed."""
    summarize(resolve_model("llama-2-70b"))  # fills this test's cache dir (AUTOTUNE_CACHE_DIR)
    probe_imports = (
        "import sys; from autotune.cli import main\n"
        "try:\n main(['plan','--model','llama-2-70b','--gpus','8','--gpu-type','a100-80gb','--json'])\n"
        "except SystemExit: pass\n"
        "print('HEAVY', [m for m in ('torch', 'deepspeed', 'transformers') if m in sys.modules], file=sys.stderr)"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe_imports], capture_output=True, text=True, env=dict(os.environ), timeout=60
    )
    assert result.returncode == 0, result.stderr
    # What makes a plan fast is that it imports none of the heavy libraries; its latency is measured by
    # benchmarks/plan_latency.py, not asserted here (a timed test fails on a loaded machine).
    assert "HEAVY []" in result.stderr
    assert json.loads(result.stdout)["fastest_fit"]["rung"].startswith("z3")


@pytest.mark.parametrize(
    "batch,arithmetic",
    [
        (
            {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4},
            "train_batch_size 64 != train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 4 x world size 2"
            " = 32",
        ),
        (
            {"train_batch_size": 60, "train_micro_batch_size_per_gpu": 4},
            "train_batch_size 60 is not a multiple of train_micro_batch_size_per_gpu 4 x world size 2 = 8 "
            "(gradient_accumulation_steps unset)",
        ),
        (
            {"train_batch_size": 7},
            "train_batch_size 7 is not a multiple of world size 2 = 2 "
            "(train_micro_batch_size_per_gpu and gradient_accumulation_steps unset)",
        ),
    ],
)
def test_config_whose_batch_does_not_add_up_names_the_arithmetic(capsys, tmp_path, batch, arithmetic):
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({**batch, "zero_optimization": {"stage": 2}}))
    args = ("--model", "tiny-gpt2", "--gpus", "2", "--gpu-memory", "24GiB", "--config", str(config))
    code, _, err = run_in_process(capsys, *args)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"batch sizes do not add up, so DeepSpeed refuses to start: {arithmetic}" in err
    assert "--micro-batch" not in err  # the file states what it states; giving another micro-batch is not the fix


def test_config_without_a_micro_batch_is_asked_for_one(capsys, tmp_path):
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_batch_size": "auto", "zero_optimization": {"stage": 2}}))
    code, _, err = run_in_process(capsys, "--model", "tiny-gpt2", "--gpu-memory", "24GiB", "--config", str(config))
    assert code == 2 and err.strip().endswith("give --micro-batch")


@pytest.mark.parametrize("native_bf16,precision", [(False, "fp32"), (True, "bf16")])
def test_plan_on_the_cpu_backend_and_its_precision_default(capsys, monkeypatch, native_bf16, precision):
    monkeypatch.setattr("autotune.hardware.machine_probe.cpu_has_native_bf16", lambda: native_bf16)
    args = ("--model", "tiny-gpt2", "--device", "cpu", "--memory-budget", "2GiB", "--seq-len", "64")
    code, out, _ = run_in_process(capsys, *args, "--json")
    assert code == 0
    data = json.loads(out)
    assert data["settings"]["precision"] == precision and data["target"]["free_memory_bytes"] == 2 * 2**30
    code, out, _ = run_in_process(capsys, *args)
    assert code == 0 and "peak/rank" in out and "per CPU rank." in out and "\n  .\n" not in out


def test_precision_help_says_what_the_default_is(capsys):
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "bf16 where the device computes it natively, else fp16 on GPUs and fp32 on the CPU backend" in help_text


def test_plan_takes_tunes_model_hardware_and_training_options():
    """What docs/commands.md says about the two commands' options (Useful options)."""
    import inspect

    from autotune.cli.plan import plan_command
    from autotune.cli.tune import tune_command

    plan, tune = (set(inspect.signature(command).parameters) for command in (plan_command, tune_command))
    assert plan - tune == {"config", "micro_batch", "grad_checkpointing"}  # -v: both (plan: memory components)
    trial_and_output = {"max_trials", "time_budget", "trial_timeout", "trial_workers", "out", "report_dir", "cache_dir",
                        "no_cache"}  # fmt: skip
    tune_only = {"tokens_per_step", "hf", "script", "base_config", "command", "consumer", *trial_and_output}
    assert tune - plan == tune_only


def test_plan_config_on_the_cpu_backend_says_host_ram_not_gpu(capsys, tmp_path):
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 1}}))
    args = ("--model", "tiny-gpt2", "--device", "cpu", "--memory-budget", "2GiB", "--seq-len", "64")
    code, out, _ = run_in_process(capsys, *args, "--config", str(config))
    assert code == 0
    assert "  per rank (host RAM, CPU backend): peak" in out and "GPU:" not in out


def test_a_plan_only_note_does_not_say_the_tuning_measured():
    from autotune.dsconfig.base_config import placeholder_notes

    config = {"optimizer": {"type": "AdamW", "params": {}}}
    assert "the tuning measured" in placeholder_notes(config, None)[0]
    planned = placeholder_notes(config, None, measured=False)[0]
    assert "the plan assumed" in planned and "measured" not in planned

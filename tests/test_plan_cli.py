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

"""`autotune check --fix`, the env-file check, the fit mapping, and the command's output and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.check import CheckContext, Severity, check_config, fix_config, load_config
from autotune.check.envvars import env_findings, parse_env_file
from autotune.check.fit import effective_rung
from autotune.cli import main
from autotune.core.ladder import Rung
from autotune.dsconfig.build_config import validate_with_deepspeed

DATA = Path(__file__).parent / "data" / "check"


def context(world_size: int, bf16: bool | None = None) -> CheckContext:
    return CheckContext(world_size, "test", bf16_capable=bf16, consumer="deepspeed")


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(args)
    captured = capsys.readouterr()
    return int(exited.value.code), captured.out, captured.err


# ---- --fix ---------------------------------------------------------------------------------------------


def test_fixed_blog_post_config_is_accepted_and_every_change_listed(tmp_path: Path) -> None:
    from deepspeed.runtime.constants import GRADIENT_CLIPPING_DEFAULT

    original = load_config(DATA / "blog_post.json").config
    output = tmp_path / "fixed.json"
    result = fix_config(original, context(2, bf16=True), output, allow_training_changes=True)
    assert result.written and result.rejected_by_deepspeed == "", result
    fixed = json.loads(output.read_text())
    validate_with_deepspeed(fixed, world_size=2)  # raises if DeepSpeed refuses it
    assert not [f for f in result.remaining if f.severity is Severity.ERROR]
    zero = fixed["zero_optimization"]
    assert "offload_param" not in zero and "stage3_max_live_parameters" not in zero
    assert zero["offload_optimizer"] == {"device": "cpu"}  # what DeepSpeed ran anyway
    assert zero["memory_efficient_linear"] is False and "memory_efficient_linear" not in fixed
    # "auto" becomes the installed DeepSpeed's own default (runtime/constants.py): 1.0 in 0.19.8, 0. in 0.17.6
    assert fixed["train_batch_size"] == 16 and fixed["gradient_clipping"] == GRADIENT_CLIPPING_DEFAULT
    assert fixed["bf16"] == {"enabled": True} and "fp16" not in fixed
    assert fixed["activation_checkpointing"]["cpu_checkpointing"] is True
    changed = "\n".join(result.changes)
    for path in ("offload_param", "train_batch_size: 30 -> 16", "reduce_bucket_size", "optimizer.params.lr"):
        assert path in changed


def test_fix_refuses_to_write_what_deepspeed_still_rejects(tmp_path: Path) -> None:
    both = {"train_batch_size": 2, "fp16": {"enabled": True}, "bf16": {"enabled": True}}
    result = fix_config(both, context(1, bf16=None), tmp_path / "out.json")  # GPU unknown: no precision fix
    assert not result.written and "cannot be simultaneously enabled" in result.rejected_by_deepspeed
    assert not (tmp_path / "out.json").exists()


# ---- env file ------------------------------------------------------------------------------------------


def test_env_file_flags_variables_nobody_reads() -> None:
    assignments = parse_env_file(DATA / "job.sh")
    names = [a.name for a in assignments]
    assert names[:2] == ["NCCL_DEBUG", "NCCL_SOCKET_IFNAM"]  # #SBATCH --export, then export
    assert {"CUDA_DEVICE_MAX_CONNECTIONS", "OMP_NUM_THREADS", "MASTER_PORT"} <= set(names)
    found = {f.path: f for f in env_findings(assignments)}
    assert "NCCL_SOCKET_IFNAME?" in found["$NCCL_SOCKET_IFNAM"].message
    assert "PYTORCH_CUDA_ALLOC_CONF?" in found["$PYTORCH_CUDA_ALOC_CONF"].message
    assert found["$DEEPSPEED_ZERO_STAGE"].severity is Severity.WARNING
    assert found["$HF_HOME"].severity is Severity.INFO
    for known in ("NCCL_DEBUG", "CUDA_DEVICE_MAX_CONNECTIONS", "OMP_NUM_THREADS", "MASTER_PORT"):
        assert f"${known}" not in found


def test_env_names_read_by_deepspeed_python_code_are_known(tmp_path: Path) -> None:
    env = tmp_path / "env"
    env.write_text("DS_ACCELERATOR=cuda\nexport TORCH_DISTRIBUTED_DEBUG=DETAIL\nnot an assignment\n")
    assert env_findings(parse_env_file(env)) == []


# ---- fit mapping ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("zero", "rung"),
    [
        ({"stage": 2, "offload_param": {"device": "cpu"}}, Rung.Z2),  # ignored below stage 3
        ({"stage": 2, "offload_optimizer": {"device": "nvme"}}, Rung.Z2_OFFLOAD_OPT),  # runs as cpu
        ({"stage": 3, "offload_optimizer": {"device": "cpu"}}, Rung.Z3_OFFLOAD_OPT),
        ({"stage": 3, "offload_optimizer": {"device": "nvme"}, "offload_param": {"device": "nvme"}}, Rung.Z3_NVME_ALL),
    ],
)
def test_config_maps_to_the_rung_deepspeed_really_runs(zero: dict, rung: Rung) -> None:
    assert effective_rung({"zero_optimization": zero})[0] is rung


def test_fit_prediction_uses_the_memory_model() -> None:
    from autotune.check import resolve_context
    from autotune.models import resolve_model, summarize

    summary = summarize(resolve_model("gpt2-small-demo", False))
    a100 = resolve_context(2, 1, "a100-80gb", None)
    report = check_config(DATA / "clean.json", a100, model=summary, seq_len=512)
    assert report.fit is not None and report.fit.fits and report.fit.gpu_peak_bytes > 0
    assert "ZeRO-3 + optimizer->cpu, micro-batch 4" in report.fit.candidate
    tiny = resolve_context(2, 1, None, "64MiB")
    report = check_config(DATA / "clean.json", tiny, model=summary, seq_len=512)
    assert not report.fit.fits and report.has_errors


# ---- the command ---------------------------------------------------------------------------------------


def test_clean_config_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["check", str(DATA / "clean.json"), "--gpus", "2", "--gpu-type", "a100-80gb"], capsys)
    assert code == 0
    assert "no findings" in out


def test_errors_exit_1_and_json_lists_them(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        ["check", str(DATA / "blog_post.json"), "--gpus", "2", "--json", "--consumer", "deepspeed"], capsys
    )
    assert code == 1
    report = json.loads(out)  # DeepSpeed's own log lines must not leak into stdout
    assert report["world_size"] == 2 and report["counts"]["error"] > 0
    rules = {f["rule"] for f in report["findings"]}
    assert {"unknown-key", "no-effect", "batch", "auto", "string-value", "deepspeed"} <= rules


def test_fix_writes_the_file_and_exits_0_when_nothing_is_left(tmp_path: Path, capsys) -> None:
    out_path = tmp_path / "fixed.json"
    args = [
        "check",
        str(DATA / "chat_answer.json"),
        "--consumer",
        "deepspeed",
        "--fix",
        str(out_path),
        "--fix-training",
    ]
    code, out, _ = run(args, capsys)
    assert code == 0, out
    assert "gradient_accumulation_steps: 2 -> 4" in out  # the global batch (8) and micro-batch (2) are kept
    validate_with_deepspeed(json.loads(out_path.read_text()), world_size=1)


@pytest.mark.parametrize("content", [None, "{not json"])
def test_unreadable_input_exits_2_with_one_line(tmp_path: Path, capsys, content: str | None) -> None:
    path = tmp_path / "ds.json"
    if content is not None:
        path.write_text(content)
    code, out, err = run(["check", str(path)], capsys)
    assert code == 2 and out == ""
    assert err.startswith("autotune: error: ") and err.count("\n") == 1

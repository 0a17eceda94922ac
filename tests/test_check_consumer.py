"""Who reads the config (DeepSpeed, HF Trainer, accelerate), their own "auto" filling, and what the report says."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from autotune.check import CheckContext, Severity, check_config, config_findings, load_config
from autotune.check.initialize import deepspeed_version
from autotune.cli import main
from autotune.dsconfig.consumer import Consumer, detect_consumer, fill_like_consumer

CORPUS = Path(__file__).parent / "data" / "check" / "corpus"
HF_BASE = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "zero_optimization": {"stage": 2},
}


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(args)
    captured = capsys.readouterr()
    return int(exited.value.code), captured.out, captured.err


def errors_at(config: dict, consumer: str, world_size: int = 2) -> set[str]:
    findings = config_findings(config, CheckContext(world_size, "test", consumer=consumer))
    return {f.path or "(config)" for f in findings if f.severity is Severity.ERROR}


def test_consumer_is_detected_and_can_be_named() -> None:
    assert detect_consumer(load_config(CORPUS / "hf_zero2.json"), None)[0] is Consumer.HF_TRAINER
    assert detect_consumer(load_config(CORPUS / "dse_gpt2_zero2.json"), None)[0] is Consumer.DEEPSPEED
    assert detect_consumer(load_config(CORPUS / "accelerate_inline.yaml"), None)[0] is Consumer.ACCELERATE
    consumer, reason = detect_consumer(load_config(CORPUS / "hf_zero2.json"), "deepspeed")
    assert consumer is Consumer.DEEPSPEED and "--consumer deepspeed" in reason


def test_hf_fill_uses_the_installed_libraries_and_leaves_no_trace() -> None:
    from transformers.integrations import deepspeed as hf_deepspeed

    before = (hf_deepspeed._hf_deepspeed_config_weak_ref, dict(os.environ))
    config = {**HF_BASE, "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto"}}}
    outcome = fill_like_consumer(config, Consumer.HF_TRAINER, world_size=4)
    assert (hf_deepspeed._hf_deepspeed_config_weak_ref, dict(os.environ)) == before
    assert config["optimizer"]["params"]["lr"] == "auto"  # the caller's dict is untouched
    filled = outcome.filled
    assert not outcome.unfilled and not outcome.refusal
    assert filled["train_batch_size"] == 4 * filled["train_micro_batch_size_per_gpu"]
    assert isinstance(filled["optimizer"]["params"]["lr"], float) and len(filled["optimizer"]["params"]["betas"]) == 2
    assert filled["steps_per_print"] == float("inf")  # accelerate's DeepSpeedPlugin overwrites it


def test_accelerate_without_trainer_fills_fewer_keys_than_hf() -> None:
    """accelerate's prepare() fills lr and weight_decay; betas and eps only the HF Trainer fills."""
    config = {**HF_BASE, "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto"}}}
    assert not errors_at(config, "hf-trainer")
    assert errors_at(config, "accelerate") == {"optimizer.params.betas", "optimizer.params.eps"}


def test_auto_outside_what_hf_fills_is_an_error_only_there() -> None:
    config = {**HF_BASE, "zero_optimization": {"stage": 3, "sub_group_size": "auto", "reduce_bucket_size": "auto"}}
    assert errors_at(config, "hf-trainer") == {"zero_optimization.sub_group_size"}
    assert "steps_per_print" in errors_at({**HF_BASE, "steps_per_print": "auto"}, "deepspeed")
    assert not errors_at({**HF_BASE, "steps_per_print": "auto"}, "hf-trainer")


def test_hf_consistency_check_runs_on_concrete_values() -> None:
    config = {**HF_BASE, "train_batch_size": 32, "gradient_accumulation_steps": 3}  # no per-device batch makes 32
    assert errors_at(config, "hf-trainer", world_size=2) == {"(config)"}
    assert not errors_at({**config, "train_batch_size": 36}, "hf-trainer", world_size=2)


def test_strict_json_matters_only_where_json_load_reads_it() -> None:
    for name in ("hf_bom.json", "hf_comments.json"):
        hf = check_config(CORPUS / name, CheckContext(8, "test"))
        assert {f.rule for f in hf.findings if f.severity is Severity.ERROR} == {"strict-json"}
        direct = check_config(CORPUS / name, CheckContext(8, "test", consumer="deepspeed"))
        assert "strict-json" not in {f.rule for f in direct.findings}


def test_every_report_names_the_deepspeed_version_and_the_consumer(capsys) -> None:
    code, out, _ = run(["check", str(CORPUS / "hf_zero3.json"), "--gpus", "8", "--json"], capsys)
    report = json.loads(out)
    assert code == 0 and report["deepspeed_version"] == deepspeed_version()
    assert report["consumer"] == "hf-trainer" and "assumed" in report["consumer_reason"]
    # max_grad_norm in optimizer.params crashes deepspeed.initialize on every supported release (0.17.6
    # runtime/engine.py:1482); OneBitAdam, say, still trains on 0.17.6
    code, out, _ = run(["check", str(CORPUS / "dse_max_grad_norm.json"), "--gpus", "8"], capsys)
    text = " ".join(out.split())
    assert code == 1 and f"DeepSpeed {deepspeed_version()}" in text and "consumer: DeepSpeed directly" in text


def test_accelerate_yaml_reads_the_file_it_names(capsys) -> None:
    code, out, _ = run(["check", str(CORPUS / "accelerate_deepspeed_file.yaml"), "--json"], capsys)
    report = json.loads(out)
    assert code == 0 and report["consumer"] == "accelerate"
    assert report["world_size"] == 2  # num_processes in the YAML, since no --gpus


def test_fix_that_writes_nothing_exits_1_and_leaves_the_old_file(tmp_path: Path, capsys) -> None:
    output = tmp_path / "fixed.json"
    output.write_text('{"old": true}')
    code, out, _ = run(["check", str(CORPUS / "dse_fp16_and_bf16.json"), "--fix", str(output)], capsys)
    text = " ".join(out.split())  # rich wraps at the terminal width
    assert code == 1 and "Not written" in text and "left as it was" in text
    assert output.read_text() == '{"old": true}'


def test_fix_keeps_comment_keys_and_lists_withheld_training_changes(tmp_path: Path, capsys) -> None:
    output = tmp_path / "fixed.json"
    code, out, _ = run(["check", str(CORPUS / "dse_comment_in_zero.json"), "--fix", str(output)], capsys)
    fixed = json.loads(output.read_text())
    assert code == 0 and fixed["zero_optimization._comment"] == "stage 2 fits 7B on 8x80GB"
    assert "_comment" not in fixed["zero_optimization"]
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"_comment": "keep me", "train_batch_size": 30, "train_micro_batch_size_per_gpu": 4}))
    code, out, _ = run(["check", str(config), "--gpus", "2", "--fix", str(output)], capsys)
    text = " ".join(out.split())
    assert code == 1 and "not applied" in text and "--fix-training" in text
    code, out, _ = run(["check", str(config), "--gpus", "2", "--fix", str(output), "--fix-training"], capsys)
    fixed = json.loads(output.read_text())
    assert code == 0 and fixed["_comment"] == "keep me"
    assert fixed["train_batch_size"] == 4 * 3 * 2  # the micro-batch and the 3 steps DeepSpeed derived, kept


def test_checks_own_crash_is_one_line_and_exit_2_not_a_finding(monkeypatch, capsys) -> None:
    def crashing(*args, **kwargs):
        raise RuntimeError("boom inside check")

    monkeypatch.setattr("autotune.cli.check.check_config", crashing)
    code, out, err = run(["check", str(CORPUS / "hf_zero2.json"), "--gpus", "8"], capsys)
    assert code == 2 and out == "" and "Traceback" not in err, err
    assert err.strip().splitlines() == [
        "autotune: error: check itself failed (RuntimeError at test_check_consumer.py:"
        f"{crashing.__code__.co_firstlineno + 1}: boom inside check); this says nothing about the config"
    ]


def test_the_training_arguments_stand_in_carries_every_default_the_installed_transformers_has() -> None:
    """transformers 4.x's trainer_config_process reads fields (fp16_backend) 5.x dropped: none may be missing."""
    import dataclasses

    from transformers import TrainingArguments

    from autotune.dsconfig.consumer import _training_arguments

    args = _training_arguments({"train_micro_batch_size_per_gpu": 3, "bf16": {"enabled": True}}, world_size=2)
    for field in dataclasses.fields(TrainingArguments):
        if field.default is not dataclasses.MISSING:
            assert hasattr(args, field.name), field.name
    assert (args.per_device_train_batch_size, args.bf16, args.world_size) == (3, True, 2)

"""`autotune check` findings, each checked against DeepSpeed's own parser at the same world size."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import needs

from autotune.check import CheckContext, Finding, Severity, config_findings, load_config, schema
from autotune.check.verdict import deepspeed_rejection
from autotune.errors import UserError

DATA = Path(__file__).parent / "data" / "check"
BASE: dict[str, Any] = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}


def check(config: dict[str, Any], world_size: int = 1, bf16: bool | None = None, hf: bool = False) -> list[Finding]:
    consumer = "hf-trainer" if hf else "deepspeed"
    context = CheckContext(world_size, "test", bf16_capable=bf16, for_hf_trainer=hf, consumer=consumer)
    return config_findings(config, context)


def at(findings: list[Finding], path: str, rule: str | None = None) -> Finding:
    matches = [f for f in findings if f.path == path and (rule is None or f.rule == rule)]
    assert len(matches) == 1, f"expected one finding at {path!r} ({rule}), got {findings}"
    return matches[0]


def paths(findings: list[Finding]) -> set[str]:
    return {f.path for f in findings}


# ---- reading -------------------------------------------------------------------------------------------


def test_hjson_comments_and_trailing_commas_load_like_deepspeed() -> None:
    loaded = load_config(DATA / "chat_answer.json")
    assert loaded.config["zero_optimization"]["stage"] == 1
    assert loaded.duplicate_keys == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [("{stage: }", "not valid JSON or hjson"), ("[1, 2]", "JSON object at the top level")],
)
def test_unreadable_config_is_a_user_error(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "ds.json"
    path.write_text(text)
    with pytest.raises(UserError, match=expected):
        load_config(path)
    with pytest.raises(UserError, match="not found"):
        load_config(tmp_path / "missing.json")


def test_duplicate_keys_are_kept_last_and_reported(tmp_path: Path) -> None:
    path = tmp_path / "ds.json"
    path.write_text('{"train_batch_size": 8, "train_batch_size": 4}')
    loaded = load_config(path)
    assert loaded.config == {"train_batch_size": 4}
    assert loaded.duplicate_keys == ["train_batch_size"]


# ---- which keys exist comes from the installed DeepSpeed ------------------------------------------------


@needs("deepspeed", "0.19.8", "nebula: refused by 0.19.8, accepted by 0.17.6; releases between not bisected")
def test_known_keys_come_from_deepspeed() -> None:
    from deepspeed.runtime import constants
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    top = schema.top_level_keys()
    for key in (constants.TRAIN_BATCH_SIZE, constants.GRADIENT_CLIPPING, constants.OPTIMIZER, "zero_optimization"):
        assert key in top
    assert "nebula" not in top  # removed: DeepSpeed refuses it
    zero = {name: None for name in DeepSpeedZeroConfig.model_fields}
    zero.update({f.alias: None for f in DeepSpeedZeroConfig.model_fields.values() if f.alias})
    assert not [f for f in check({**BASE, "zero_optimization": zero}) if f.rule == "unknown-key"]


def test_unknown_top_level_key_is_silently_accepted_by_deepspeed() -> None:
    config = {**BASE, "gradient_clip": 0.5}
    finding = at(check(config), "gradient_clip")
    assert finding.severity is Severity.WARNING
    assert "gradient_clipping" in finding.message  # did you mean
    assert finding.fix is not None and finding.fix.edits[0].to == ("gradient_clipping",)
    assert deepspeed_rejection(config, 1) == ""


def test_misplaced_memory_efficient_linear_belongs_under_zero_optimization() -> None:
    config = {**BASE, "memory_efficient_linear": False, "zero_optimization": {"stage": 3}}
    finding = at(check(config), "memory_efficient_linear")
    assert "zero_optimization" in finding.message
    assert finding.fix.edits[0].to == ("zero_optimization", "memory_efficient_linear")
    assert deepspeed_rejection(config, 1) == ""


def test_unknown_key_in_a_pydantic_section_is_an_error_deepspeed_agrees() -> None:
    config = {**BASE, "zero_optimization": {"stage": 3, "stage3_max_live_parameter": 10}}
    finding = at(check(config), "zero_optimization.stage3_max_live_parameter", "unknown-key")
    assert finding.severity is Severity.ERROR
    assert "stage3_max_live_parameters" in finding.message
    assert "Extra inputs are not permitted" in deepspeed_rejection(config, 1)


def test_unknown_key_in_a_plain_section_is_silently_ignored() -> None:
    config = {**BASE, "activation_checkpointing": {"partition_activations": True, "cpu_checkpoint": True}}
    finding = at(check(config), "activation_checkpointing.cpu_checkpoint")
    assert finding.severity is Severity.WARNING and "cpu_checkpointing" in finding.message
    assert deepspeed_rejection(config, 1) == ""


@needs("deepspeed", "0.19.8", "nebula: refused by 0.19.8, accepted by 0.17.6; releases between not bisected")
def test_removed_top_level_key_is_an_error_with_deepspeeds_reason() -> None:
    finding = at(check({**BASE, "nebula": {"enabled": True}}), "nebula", "removed-key")
    assert finding.severity is Severity.ERROR and "removed" in finding.message


# ---- stage effects -------------------------------------------------------------------------------------


def test_offload_param_below_stage3_has_no_effect() -> None:
    zero = {"stage": 2, "offload_param": {"device": "cpu"}}
    assert (
        at(check({**BASE, "zero_optimization": zero}), "zero_optimization.offload_param").severity is Severity.WARNING
    )
    assert "zero_optimization.offload_param" not in paths(check({**BASE, "zero_optimization": {**zero, "stage": 3}}))


def test_stage_specific_keys() -> None:
    stage2 = {"stage": 2, "stage3_prefetch_bucket_size": 1000, "sub_group_size": 1000, "round_robin_gradients": True}
    found = paths(check({**BASE, "zero_optimization": stage2}))
    assert {"zero_optimization.stage3_prefetch_bucket_size", "zero_optimization.sub_group_size"} <= found
    assert "zero_optimization.round_robin_gradients" not in found
    stage3 = [f for f in check({**BASE, "zero_optimization": {**stage2, "stage": 3}}) if f.rule == "no-effect"]
    assert paths(stage3) == {"zero_optimization.round_robin_gradients"}
    finding = at(
        check({**BASE, "zero_optimization": {"allgather_partitions": True}}), "zero_optimization.allgather_partitions"
    )
    assert finding.severity is Severity.INFO


def test_nvme_optimizer_offload_below_stage3_runs_on_cpu() -> None:
    offload = {"device": "nvme", "nvme_path": "/nvme"}
    finding = at(
        check({**BASE, "zero_optimization": {"stage": 2, "offload_optimizer": offload}}),
        "zero_optimization.offload_optimizer.device",
    )
    assert "CPU" in finding.message
    assert finding.fix.edits[0].value == "cpu"
    stage3 = check({**BASE, "zero_optimization": {"stage": 3, "offload_optimizer": offload}})
    assert "zero_optimization.offload_optimizer.device" not in paths(stage3)


# ---- batch arithmetic ----------------------------------------------------------------------------------


def test_inconsistent_batch_shows_the_numbers_and_the_fix() -> None:
    config = {**BASE, "train_batch_size": 30, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}
    finding = at(check(config, world_size=2), "train_batch_size", "batch")
    assert finding.severity is Severity.ERROR
    assert "train_batch_size=30" in finding.message and "30 != 4 * 2 * 2" in finding.message
    assert ("train_batch_size",) in [e.path for e in finding.fix.edits if e.value == 16]
    assert "train_batch_size is not equal" in deepspeed_rejection(config, 2)
    consistent = {**config, "train_batch_size": 16}
    assert not [f for f in check(consistent, world_size=2) if f.rule in ("batch", "deepspeed")]
    assert at(check(consistent, world_size=4), "train_batch_size", "batch")  # same file, more GPUs


def test_micro_batch_derived_as_zero() -> None:
    config = {"train_batch_size": 4, "gradient_accumulation_steps": 8, "optimizer": BASE["optimizer"]}
    finding = at(check(config, world_size=2), "train_batch_size", "batch")
    assert "has to be greater than 0" in finding.message
    assert {e.path: e.value for e in finding.fix.edits}[("train_batch_size",)] == 16


# ---- leftover "auto", strings, precision, buckets --------------------------------------------------------


def test_auto_where_deepspeed_fails_late_is_an_error() -> None:
    config = {**BASE, "gradient_clipping": "auto", "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}
    found = check(config)
    assert at(found, "gradient_clipping", "auto").severity is Severity.ERROR
    lr = at(found, "optimizer.params.lr", "auto")
    assert lr.severity is Severity.ERROR and lr.fix.edits[0].value == pytest.approx(1e-3)  # FusedAdam's default
    assert deepspeed_rejection(config, 1) == ""  # the parser lets both through


def test_auto_where_deepspeed_drops_it_is_a_warning() -> None:
    config = {**BASE, "fp16": {"enabled": "auto"}, "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}}
    found = check(config)
    bucket = at(found, "zero_optimization.reduce_bucket_size", "auto")
    assert bucket.severity is Severity.WARNING and bucket.fix.edits[0].value == 500_000_000
    fp16 = at(found, "fp16.enabled", "auto").fix.edits[0]
    if importlib.util.find_spec("deepspeed.runtime.precision_config"):  # pydantic DeepSpeedFP16Config: its default
        assert fp16.value is False
    else:  # DeepSpeed 0.15.4 reads fp16 from the dict (no schema, no default to show): the key goes
        assert fp16.op == "remove"
    assert not [f for f in check(config, hf=True) if f.rule == "auto"]


def test_auto_batch_keys_fail_at_parse() -> None:
    config = {**BASE, "train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto"}
    found = check(config)
    assert at(found, "train_batch_size", "auto").severity is Severity.ERROR
    assert "TypeError" in deepspeed_rejection(config, 1)
    with_zero = {**config, "zero_optimization": {"stage": 0}}
    assert not [f for f in check(with_zero, hf=True) if f.severity is Severity.ERROR]
    refused = at(check(config, hf=True), "", "consumer")  # accelerate's DeepSpeedPlugin needs the section
    assert "ZeRO optimization config" in refused.message


def test_string_numbers() -> None:
    config = {
        **BASE,
        "optimizer": {"type": "AdamW", "params": {"lr": "1e-4"}},
        "zero_optimization": {"stage": 2, "reduce_bucket_size": "1e9", "allgather_bucket_size": "500000000"},
        "activation_checkpointing": {"partition_activations": "false"},
    }
    found = check(config)
    assert at(found, "zero_optimization.reduce_bucket_size", "string-value").severity is Severity.ERROR
    assert at(found, "zero_optimization.reduce_bucket_size", "string-value").fix.edits[0].value == 10**9
    assert at(found, "zero_optimization.allgather_bucket_size", "string-value").severity is Severity.INFO
    assert at(found, "optimizer.params.lr", "string-value").fix.edits[0].value == pytest.approx(1e-4)
    assert at(found, "activation_checkpointing.partition_activations").fix.edits[0].value is False
    assert "reduce_bucket_size" in deepspeed_rejection(config, 1)


def test_fp16_on_bf16_hardware() -> None:
    config = {**BASE, "fp16": {"enabled": True, "loss_scale": 0}}
    finding = at(check(config, bf16=True), "fp16.enabled", "precision")
    assert [e.op for e in finding.fix.edits] == ["remove", "set"]
    assert not [f for f in check(config, bf16=False) if f.rule == "precision"]
    assert not [f for f in check(config, bf16=None) if f.rule == "precision"]
    on_v100 = at(check({**BASE, "bf16": {"enabled": True}}, bf16=False), "bf16.enabled", "precision")
    assert on_v100.fix.description == "switch to fp16"


def test_bucket_sizes_are_elements_not_bytes() -> None:
    zero = {"stage": 2, "reduce_bucket_size": 500_000_000, "overlap_comm": True}
    finding = at(
        check({**BASE, "bf16": {"enabled": True}, "zero_optimization": zero}), "zero_optimization.reduce_bucket_size"
    )
    assert "500,000,000 elements" in finding.message
    assert "953.7 MiB" in finding.message  # 2 bytes each in bf16
    assert "1.9 GiB" in finding.message  # overlap_comm keeps a second buffer at stages 1-2
    fp32 = at(
        check({**BASE, "zero_optimization": {**zero, "overlap_comm": False}}), "zero_optimization.reduce_bucket_size"
    )
    assert "1.9 GiB per buffer in fp32" in fp32.message and "two" not in fp32.message

"""What the user's job gets for an omitted key is read from the installed libraries (autotune.training.job_defaults),
and every note names it with its value: the values are checked here against the libraries imported for real."""

from __future__ import annotations

import inspect

from autotune.check import CheckContext, config_findings
from autotune.dsconfig.base_config import placeholder_notes
from autotune.training.job_defaults import job_defaults

PLACEHOLDER = {"train_batch_size": 4, "optimizer": {"type": "AdamW", "params": {}}}


def test_the_defaults_are_the_installed_ones() -> None:
    from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam
    from deepspeed.runtime.constants import GRADIENT_CLIPPING_DEFAULT
    from transformers import TrainingArguments

    defaults = job_defaults()
    assert defaults.clipping is not None and defaults.clipping.value == GRADIENT_CLIPPING_DEFAULT
    assert defaults.clipping.source.startswith("deepspeed/runtime/constants.py:")
    for cls, read in ((FusedAdam, defaults.fused_adam), (DeepSpeedCPUAdam, defaults.cpu_adam)):
        signature = inspect.signature(cls.__init__).parameters
        assert {key: value.value for key, value in read.items()} == {
            key: signature[key].default for key in ("lr", "betas", "eps", "weight_decay")
        }
    args = TrainingArguments(output_dir="unused", report_to="none")
    for name in ("learning_rate", "adam_beta1", "adam_beta2", "adam_epsilon", "weight_decay", "max_grad_norm"):
        assert defaults.trainer[name].value == getattr(args, name), name
    assert defaults.trainer["lr_scheduler_type"].value == str(args.lr_scheduler_type.value)


def test_the_notes_name_each_default_with_its_value() -> None:
    defaults = job_defaults()
    notes = placeholder_notes(PLACEHOLDER, None)
    clipping = next(n for n in notes if n.startswith("no gradient_clipping written"))
    assert f"at its default {defaults.clipping.value} ({defaults.clipping.source})" in clipping  # type: ignore[union-attr]
    assert "clips nothing" not in clipping and "--max_grad_norm (default 1.0)" in clipping
    optimizer = next(n for n in notes if n.startswith("placeholder: optimizer AdamW"))
    assert "lr 0.001, betas (0.9, 0.999), eps 1e-08, weight_decay 0.0" in optimizer
    assert "--learning_rate (default 5e-05)" in optimizer
    assert any(n.startswith("no scheduler written") and "(default linear)" in n for n in notes)


def test_a_config_that_sets_them_gets_no_note() -> None:
    chosen = {**PLACEHOLDER, "gradient_clipping": 0.5, "scheduler": {"type": "WarmupLR"},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                                        "weight_decay": 0.1}}}  # fmt: skip
    assert placeholder_notes(chosen, None) == []
    base_without_clipping = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
    (note, _) = placeholder_notes({**base_without_clipping, "train_batch_size": 4}, base_without_clipping)
    assert note.startswith("no gradient_clipping written") and "--max_grad_norm" not in note  # the base's .hf.json


def test_check_sizes_no_bucket_at_stage_0() -> None:
    zero = {"stage": 0, "reduce_bucket_size": 500_000_000, "allgather_bucket_size": 500_000_000}
    findings = config_findings({"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero}, CheckContext(1, "t"))
    assert not [f for f in findings if f.rule == "bucket-size"]
    zero = {**zero, "stage": 2}
    findings = config_findings({"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero}, CheckContext(1, "t"))
    assert {f.path for f in findings if f.rule == "bucket-size"} == {
        "zero_optimization.reduce_bucket_size",
        "zero_optimization.allgather_bucket_size",
    }

"""--init-check: deepspeed.initialize and one step on a tiny model, CPU backend, world size 1.

The slow test is also the corpus's ground truth: every row labelled "crash" must fail for real (or be
refused by HF / accelerate before DeepSpeed), every row labelled "clean" or "defect" must train one step
(or say why the CPU backend cannot tell).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from autotune.check import CheckContext, Severity, check_config, load_config
from autotune.check.init_probe import run_init_check, scaled_to_one_rank
from autotune.dsconfig.consumer import Consumer, detect_consumer, fill_like_consumer

CORPUS = Path(__file__).parent / "data" / "check" / "corpus"
INDEX: list[dict[str, Any]] = json.loads((CORPUS / "index.json").read_text())
# One engine run per row is 10-40 s; CI runs these representative rows (one per way of passing or
# failing). AUTOTUNE_CHECK_GROUND_TRUTH=all runs every row (about 20 min on 2 cores), as done for the README.
_REPRESENTATIVE = {
    "hf_zero2.json",  # HF auto config, filled by transformers + accelerate, trains (CPU Adam offload)
    "megatron_ds_universal.json",  # DeepSpeed directly, client optimizer, trains
    "fastchat_s2.json",  # offload + the Trainer's torch AdamW: accelerate swaps in DeepSpeedCPUAdam, trains
    "dse_fused_adam.json",  # parser accepts, initialize refuses
    "dse_warmup_zero_steps.json",  # the scheduler refuses its params
    "dse_fp16_and_bf16.json",  # the parser refuses
    "hf_sub_group_auto.json",  # accelerate refuses an "auto" it does not fill
}
GROUND_TRUTH_ROWS = [
    entry
    for entry in INDEX
    if os.environ.get("AUTOTUNE_CHECK_GROUND_TRUTH") == "all"
    or (entry["file"] in _REPRESENTATIVE and "consumer" not in entry)
]


def test_batch_keys_are_scaled_to_one_rank_keeping_micro_batch_and_accumulation() -> None:
    config = {"train_batch_size": 512, "train_micro_batch_size_per_gpu": 4, "steps_per_print": float("inf")}
    scaled = scaled_to_one_rank(config, world_size=8)
    assert (scaled["train_micro_batch_size_per_gpu"], scaled["gradient_accumulation_steps"]) == (4, 16)
    assert scaled["train_batch_size"] == 64 and scaled["steps_per_print"] == 10**9
    assert config["train_batch_size"] == 512  # the caller's dict is untouched


@pytest.mark.slow
def test_init_check_reports_the_engines_refusal() -> None:
    report = check_config(CORPUS / "dse_fused_adam.json", CheckContext(8, "test"), init_check=True)
    init = [f for f in report.findings if f.rule == "init"]
    assert len(init) == 1 and init[0].severity is Severity.ERROR
    assert "FusedAdam is not a supported DeepSpeed Optimizer" in init[0].message


@pytest.mark.slow
@pytest.mark.parametrize(
    "entry", GROUND_TRUTH_ROWS, ids=lambda e: e["file"] + (f"@{e['consumer']}" if "consumer" in e else "")
)
def test_corpus_labels_hold_when_deepspeed_really_runs(entry: dict[str, Any]) -> None:
    loaded = load_config(CORPUS / entry["file"])
    consumer, _ = detect_consumer(loaded, entry.get("consumer"))
    if consumer.fills_auto and loaded.strict_json_problem:
        assert entry["expect"] == "crash"  # json.load refuses it before anything runs
        return
    precision = loaded.accelerate.mixed_precision if loaded.accelerate else None
    outcome = fill_like_consumer(loaded.config, consumer, entry["world_size"], precision)
    if outcome.refusal or outcome.unfilled:
        assert entry["expect"] == "crash", outcome  # the installed HF / accelerate code raised
        return
    result = run_init_check(outcome.filled, entry["world_size"], consumer.value)
    if result.status == "inconclusive":
        pytest.skip(result.detail)
    assert (result.status == "failed") == (entry["expect"] == "crash"), result
    assert consumer in Consumer

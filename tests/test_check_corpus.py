"""`autotune check` on a corpus shaped like what training repositories publish (tests/data/check/corpus/README.md).

`check` trusted on real-world configs, as tests: no error or warning on a config that trains as written, every
config that would crash is flagged, every --fix output passes DeepSpeed's parser at the target world size
(and HF / accelerate's own filling and consistency check where they are the consumer), and --fix
changes no training value unless asked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import needs

from autotune.check import CheckContext, Severity, check_config, load_config
from autotune.check.findings import TRAINING_KEYS
from autotune.dsconfig.build_config import validate_with_deepspeed
from autotune.dsconfig.consumer import Consumer, fill_like_consumer

CORPUS = Path(__file__).parent / "data" / "check" / "corpus"
INDEX: list[dict[str, Any]] = json.loads((CORPUS / "index.json").read_text())


def _id(entry: dict[str, Any]) -> str:
    return entry["file"] + (f"@{entry['consumer']}" if "consumer" in entry else "")


# Configs that crash only on newer DeepSpeed: older releases accept them, so `check` (which asks the installed
# DeepSpeed) rightly passes them there. Read in 0.17.6 (accepts) and 0.19.8 (refuses); releases between not bisected.
_REMOVED_BLOCK = "0.19.8 runtime/config.py _REMOVED_TOP_LEVEL_CONFIG_KEYS refuses it (DeepSpeed #8489); 0.17.6 accepts"
_ONEBIT = "0.19.8's engine refuses OneBitAdam; 0.17.6 builds it (runtime/engine.py:1528)"
REFUSED_SINCE: dict[str, str] = {
    "dse_amp.json": _REMOVED_BLOCK,
    "dse_bert_sparse_attention.json": _REMOVED_BLOCK,
    "megatron_curriculum.json": _REMOVED_BLOCK,
    "dse_elasticity.json": "0.19.8 refuses the elasticity block; 0.17.6 only its batch keys, flagged at the config",
    "dse_onebit_adam.json": _ONEBIT,
    "hf_onebit_adam.json": _ONEBIT,
    "dse_warmup_zero_steps.json": "WarmupLR's warmup_num_steps > 0 check (0.19.8 runtime/lr_schedules.py:734) is new",
    "hf_zero3_concrete_legacy.json": "reduce_bucket_size 0: gt=0 in 0.19.8 runtime/zero/config.py:113, ge=0 in 0.17.6",
}


def _by_release(entries: list[dict[str, Any]]) -> list[Any]:
    """Each entry as a test case, skipped below the DeepSpeed release that first refuses it."""
    return [
        pytest.param(e, id=_id(e), marks=[needs("deepspeed", "0.19.8", REFUSED_SINCE[e["file"]])])
        if e["file"] in REFUSED_SINCE
        else pytest.param(e, id=_id(e))
        for e in entries
    ]


def _context(entry: dict[str, Any]) -> CheckContext:
    return CheckContext(entry["world_size"], "corpus", consumer=entry.get("consumer"))


def _leaves(value: Any, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    if isinstance(value, dict):
        out: dict[tuple[str, ...], Any] = {}
        for key, item in value.items():
            out.update(_leaves(item, (*prefix, key)))
        return out
    return {prefix: value}


def training_values(config: dict[str, Any]) -> dict[tuple[str, ...], Any]:
    """Global batch, micro-batch, optimizer, schedule, precision, clipping. Gradient accumulation is left
    out: with the global and micro batch kept, it only restates them for the world size (the batch fix)."""
    return {
        path: value
        for path, value in _leaves(config).items()
        if path[0] in TRAINING_KEYS and path != ("gradient_accumulation_steps",)
    }


def test_the_corpus_is_indexed_and_cited() -> None:
    on_disk = {p.name for p in CORPUS.iterdir() if p.suffix in (".json", ".yaml") and p.name != "index.json"}
    assert on_disk == {entry["file"] for entry in INDEX}
    readme = (CORPUS / "README.md").read_text()
    assert all(entry["file"] in readme and entry["source"] for entry in INDEX)
    assert len(on_disk) >= 40


@pytest.mark.parametrize("entry", _by_release(INDEX))
def test_findings_match_what_the_config_does(entry: dict[str, Any]) -> None:
    report = check_config(CORPUS / entry["file"], _context(entry))
    errors = [f for f in report.findings if f.severity is Severity.ERROR]
    warnings = [f for f in report.findings if f.severity is Severity.WARNING]
    assert report.deepspeed_version and report.consumer_reason
    if entry["expect"] == "clean":
        assert not errors and not warnings, [f.message for f in errors + warnings]
    elif entry["expect"] == "defect":
        assert not errors, [f.message for f in errors]
        assert {f.path for f in warnings} == set(entry["paths"])
    else:
        assert errors, "a config that crashes passed"
        flagged = {f.path or "(config)" for f in errors}
        assert set(entry["paths"]) <= flagged, flagged


@pytest.mark.parametrize("entry", INDEX, ids=_id)
def test_fix_output_is_accepted_and_keeps_training(entry: dict[str, Any], tmp_path: Path) -> None:
    output = tmp_path / "fixed.json"
    report = check_config(CORPUS / entry["file"], _context(entry), fix_output=output)
    fix = report.fix
    assert fix is not None
    if not fix.written:
        assert report.exit_code() == 1 and fix.rejected_by_deepspeed and not output.exists()
        return
    fixed = json.loads(output.read_text())  # strict JSON, as HF and accelerate read it
    loaded = load_config(CORPUS / entry["file"])
    consumer = Consumer(report.consumer)
    outcome = fill_like_consumer(fixed, consumer, entry["world_size"])
    assert not outcome.refusal and not outcome.unfilled, outcome
    validate_with_deepspeed(outcome.filled, world_size=entry["world_size"])  # raises if DeepSpeed refuses it
    assert training_values(fixed) == training_values(loaded.config)
    assert all(key in fixed for key in loaded.config if key.startswith("_")), "a comment key was dropped"
    assert all(" [" in change for change in fix.changes), "every change carries its reason"


def test_training_fixes_are_withheld_until_asked(tmp_path: Path) -> None:
    entry = {"file": "dse_batch_mismatch.json", "world_size": 16}  # 32 = 4 x 2 x 16 is impossible: keep-batch fails
    context = _context(entry)
    kept = check_config(CORPUS / entry["file"], context, fix_output=tmp_path / "a.json")
    assert not kept.fix.written and kept.exit_code() == 1
    assert any("train_batch_size" in line for line in kept.fix.withheld)
    changed = check_config(CORPUS / entry["file"], context, fix_output=tmp_path / "b.json", allow_training_changes=True)
    assert changed.fix.written
    assert json.loads((tmp_path / "b.json").read_text())["train_batch_size"] == 4 * 2 * 16


def test_batch_fix_keeps_the_global_batch_when_accumulation_can(tmp_path: Path) -> None:
    report = check_config(
        CORPUS / "dse_batch_mismatch.json", _context({"world_size": 8}), fix_output=tmp_path / "f.json"
    )
    fixed = json.loads((tmp_path / "f.json").read_text())
    assert (fixed["train_batch_size"], fixed["train_micro_batch_size_per_gpu"]) == (32, 4)
    assert fixed["gradient_accumulation_steps"] == 1 and report.exit_code() == 0

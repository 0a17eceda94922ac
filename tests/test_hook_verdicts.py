"""A hook cache hit imports no DeepSpeed for a config this user already saw DeepSpeed accept, and believes
that memory only from a file of its own that nobody else can write."""

from __future__ import annotations

import json
import os
from pathlib import Path

from autotune.hook.coordinate import HookRecord
from autotune.hook.run import config_vetter
from autotune.hook.verdicts import KnownValid, verdict_key

GOOD = json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1}})
BAD = json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 9}})


def record(text: str) -> HookRecord:
    return HookRecord(
        "k", "complete", text, "tuned", verified=True, job_id=None, hardware="hw", leader="x", created=0.0
    )


def test_a_remembered_verdict_spares_deepspeed_and_a_new_config_is_still_parsed(tmp_path: Path) -> None:
    known = KnownValid(tmp_path / "v.json")
    known.add(verdict_key(BAD, 1))  # as if DeepSpeed had accepted it: the vetter must not ask again
    vet = config_vetter(1, known)
    assert vet(record(BAD)) is None
    assert "DeepSpeed rejects its config" in (config_vetter(2, known)(record(BAD)) or "")  # other world size
    assert vet(record(GOOD)) is None and verdict_key(GOOD, 1) in KnownValid(tmp_path / "v.json")  # remembered


def test_a_verdict_file_others_can_write_is_not_believed(tmp_path: Path) -> None:
    known = KnownValid(tmp_path / "v.json")
    known.add(verdict_key(BAD, 1))
    assert verdict_key(BAD, 1) in known
    os.chmod(tmp_path / "v.json", 0o666)
    assert verdict_key(BAD, 1) not in known
    assert "DeepSpeed rejects its config" in (config_vetter(1, known)(record(BAD)) or "")

"""A small real tuning request (tiny-gpt2 on the CPU backend, 2 GiB, ZeRO-0 and ZeRO-3), its outputs and cache in a
test's tmp_path: the base the end-to-end tune tests change one option of."""

from __future__ import annotations

from pathlib import Path

from autotune.core.ladder import Rung
from autotune.tuner import TuneRequest


def tune_request(tmp_path: Path, **overrides: object) -> TuneRequest:
    base = dict(
        model="tiny-gpt2",
        device="cpu",
        memory_budget="2GiB",
        seq_len=64,
        rungs=(Rung.Z0, Rung.Z3),
        out=str(tmp_path / "ds_config.json"),
        cache_dir=str(tmp_path / "cache.sqlite"),
    )
    return TuneRequest.of(**{**base, **overrides})

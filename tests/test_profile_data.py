"""Consistency checks for the bundled model and hardware profiles (profiles/*.json).

Model profiles are instantiated on the meta device (no memory, no weights) with the
installed transformers, and the parameter count is compared with the published figure.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

PROFILES = Path(__file__).resolve().parents[1] / "profiles"
MODEL_DIR = PROFILES / "models"
HARDWARE_DIR = PROFILES / "hardware"

MODEL_FILES = sorted(MODEL_DIR.glob("*.json"))
HARDWARE_FILES = sorted(HARDWARE_DIR.glob("*.json"))

EXPECTED_MODELS = {
    "t5-small", "t5-base", "t5-large", "t5-3b", "t5-11b",
    "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl",
    "opt-1.3b", "opt-6.7b", "opt-13b", "opt-30b",
    "llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "llama-3.2-1b", "llama-3.2-3b",
    "mistral-7b", "qwen2.5-7b", "falcon-7b", "bloom-7b1", "pythia-1.4b", "bert-large",
    "tiny-gpt2", "tiny-llama", "tiny-t5", "gpt2-small-demo",
}  # fmt: skip
EXPECTED_HARDWARE = {
    "a100-40gb", "a100-80gb", "h100-80gb", "h100-pcie", "h200", "gh200", "l40s", "a10g",
    "l4", "rtx-4090", "rtx-3090", "v100-16gb", "v100-32gb", "a6000", "mi250x", "mi300x", "t4",
}  # fmt: skip

MODEL_FIELDS = {
    "name", "hf_id", "description", "architecture", "config", "config_source",
    "published_params", "published_params_tolerance", "params_source",
}  # fmt: skip
HARDWARE_FIELDS = {
    "key", "name", "aliases", "memory_gib", "memory_bytes", "bf16", "compute_capability",
    "peak_dense_bf16_tflops", "peak_dense_fp16_tflops", "memory_bandwidth_gbs",
    "interconnect", "source",
}  # fmt: skip


def _load(path: Path) -> dict:
    with path.open(encoding="utf-8") as f:
        return json.load(f)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def count_params(profile: dict) -> int:
    """Build the model exactly as the tool does, on the meta device, and count parameters.

    ``model.parameters()`` de-duplicates shared (tied) tensors, so tied embeddings count once.
    """
    import torch
    import transformers

    config = copy.deepcopy(profile["config"])
    cfg = transformers.AutoConfig.for_model(config.pop("model_type"), **config)
    with torch.device("meta"):
        model = getattr(transformers, profile["architecture"])(cfg)
    return sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------- models


def test_expected_model_profiles_present():
    assert {p.stem for p in MODEL_FILES} == EXPECTED_MODELS


@pytest.mark.parametrize("path", MODEL_FILES, ids=lambda p: p.stem)
def test_model_profile_fields(path: Path):
    prof = _load(path)
    missing = MODEL_FIELDS - prof.keys()
    assert not missing, f"missing fields: {sorted(missing)}"
    assert prof["name"] == path.stem
    assert isinstance(prof["description"], str) and prof["description"]
    assert isinstance(prof["architecture"], str) and prof["architecture"]
    cfg = prof["config"]
    assert isinstance(cfg, dict) and isinstance(cfg.get("model_type"), str)
    for junk in ("torch_dtype", "dtype", "transformers_version", "task_specific_params", "_name_or_path"):
        assert junk not in cfg, f"config should not carry {junk!r}"

    published, tol = prof["published_params"], prof["published_params_tolerance"]
    if published is None:
        # Synthetic test/demo models: nothing published, so no tolerance or sources either.
        assert tol is None
        assert "synthetic" in prof["description"].lower()
    else:
        assert isinstance(published, int) and not isinstance(published, bool) and published > 0
        assert _is_number(tol) and 0 <= tol < 0.1
        assert isinstance(prof["hf_id"], str) and "/" in prof["hf_id"]
        for field in ("config_source", "params_source"):
            assert isinstance(prof[field], str) and "http" in prof[field], field


@pytest.mark.parametrize("path", MODEL_FILES, ids=lambda p: p.stem)
def test_model_builds_on_meta_and_matches_published_count(path: Path):
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    prof = _load(path)
    assert hasattr(transformers, prof["architecture"]), prof["architecture"]

    n = count_params(prof)
    assert n > 0

    published, tol = prof["published_params"], prof["published_params_tolerance"]
    if published is None:
        return
    if tol == 0:
        assert n == published, f"{path.stem}: computed {n:,} != published {published:,}"
    else:
        rel = abs(n - published) / published
        assert rel <= tol, (
            f"{path.stem}: computed {n:,} vs published {published:,} (rel diff {rel:.5f} > tolerance {tol})"
        )


# ------------------------------------------------------------------------- hardware


def test_expected_hardware_profiles_present():
    assert {p.stem for p in HARDWARE_FILES} == EXPECTED_HARDWARE


@pytest.mark.parametrize("path", HARDWARE_FILES, ids=lambda p: p.stem)
def test_hardware_profile_fields(path: Path):
    hw = _load(path)
    missing = HARDWARE_FIELDS - hw.keys()
    assert not missing, f"missing fields: {sorted(missing)}"
    assert hw["key"] == path.stem
    assert isinstance(hw["name"], str) and hw["name"]
    assert isinstance(hw["aliases"], list)
    assert all(isinstance(a, str) and a and a == a.strip() for a in hw["aliases"])
    assert isinstance(hw["bf16"], bool)
    assert isinstance(hw["compute_capability"], str) and hw["compute_capability"]
    assert isinstance(hw["interconnect"], str) and hw["interconnect"]
    assert isinstance(hw["source"], str) and "http" in hw["source"]

    for field in ("memory_gib", "memory_bytes", "peak_dense_fp16_tflops", "memory_bandwidth_gbs"):
        assert _is_number(hw[field]) and hw[field] > 0, field
    assert isinstance(hw["memory_bytes"], int)
    # memory_gib and memory_bytes must describe the same capacity.
    assert math.isclose(hw["memory_bytes"] / 2**30, hw["memory_gib"], rel_tol=0.01)

    if hw["bf16"]:
        assert _is_number(hw["peak_dense_bf16_tflops"]) and hw["peak_dense_bf16_tflops"] > 0
    else:
        assert hw["peak_dense_bf16_tflops"] is None


def test_hardware_keys_and_aliases_unique():
    seen: dict[str, str] = {}
    for path in HARDWARE_FILES:
        hw = _load(path)
        for name in [hw["key"], *hw["aliases"]]:
            norm = name.lower()
            assert norm not in seen, f"{name!r} used by both {seen[norm]} and {hw['key']}"
            seen[norm] = hw["key"]

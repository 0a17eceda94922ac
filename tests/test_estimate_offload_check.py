"""Stages 1-2 with an offloaded optimizer: the temporaries DeepSpeed makes of each gradient on its way to the host
(fp64 norm, overflow check, fp32 copy), sized by the DeepSpeed version, and the moment they exist (on top of the
activations for an untied output layer, at the end of backward for a tied embedding). Hand-built summaries."""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from tests.fakes.models import summary, target

from autotune.core.ladder import Candidate, Rung
from autotune.core.units import GiB
from autotune.estimate import EstimateSettings, check_fit, estimate
from autotune.estimate.buffers import (
    deepspeed_buffers,
    offload_gradient_check_bytes,
    stage3_offload_grad_transient,
)
from autotune.estimate.runtime import RuntimeStack

REPO = Path(__file__).resolve().parents[1]
LARGEST = 400_000_000  # an output layer the size of deepseek-math-7b's (102400 x 4096 = 419,430,400)
SEVEN_B = {"total_params": 7_000_000_000, "trainable_params": 7_000_000_000}


def _settings(deepspeed_version: str | None, seq_len: int = 512) -> EstimateSettings:
    return EstimateSettings(seq_len=seq_len, stack=RuntimeStack(deepspeed_version=deepspeed_version))


@pytest.mark.parametrize(
    ("version", "per_element"),
    [
        ("0.3.13", 8),  # `float(x.float().sum())`: the fp64 norm is the largest temporary
        ("0.13.2", 8),
        ("0.13.3", 11),  # elementwise isnan/isinf check: 4 + 1 + 1 + 1 + 4 B
        ("0.17.5", 11),
        ("0.19.5", 11),
        ("0.19.6", 8),  # amax/amin check: the fp64 norm again
        ("0.19.8", 8),
    ],
)
def test_offload_check_follows_the_deepspeed_version(version: str, per_element: int):
    assert offload_gradient_check_bytes(1000, RuntimeStack(deepspeed_version=version)) == (per_element * 1000, 0)


def test_an_unknown_deepspeed_version_keeps_the_elementwise_check_as_margin():
    assert offload_gradient_check_bytes(1000, RuntimeStack()) == (8000, 3000)


def test_an_untied_output_layer_adds_the_check_on_top_of_its_gradient():
    model = summary(largest_layer_params=LARGEST, embedding_params=LARGEST, tied_embeddings=False, **SEVEN_B)
    where = target(gpus=2)
    unknown = deepspeed_buffers(model, where, Rung.Z2_OFFLOAD_OPT, _settings(None))
    assert unknown.device_components["weight_grad_transient"] == (2 + 8) * LARGEST  # bf16 gradient + fp64 norm
    assert unknown.device_uncertainty == {"offload_gradient_check_version": 3 * LARGEST}
    assert unknown.end_of_backward_bytes == 0
    old = deepspeed_buffers(model, where, Rung.Z2_OFFLOAD_OPT, _settings("0.17.5"))
    assert old.device_components["weight_grad_transient"] == (2 + 11) * LARGEST
    assert old.device_uncertainty == {}
    # the margin reaches the verdict
    margin = estimate(model, where, Candidate(Rung.Z2_OFFLOAD_OPT, 1), _settings(None)).gpu_uncertainty
    assert margin["offload_gradient_check_version"] == 3 * LARGEST
    # without offload, and at stage 3 (its own offload path, not read here), the terms are as before
    plain = deepspeed_buffers(model, where, Rung.Z2, _settings(None))
    assert plain.device_components["weight_grad_transient"] == 2 * LARGEST and not plain.device_uncertainty
    z3 = deepspeed_buffers(model, where, Rung.Z3_OFFLOAD_OPT, _settings(None))
    assert z3.device_components["weight_grad_transient"] == stage3_offload_grad_transient(model, where, _settings(None))
    assert not z3.device_uncertainty and not z3.end_of_backward_bytes


def test_a_tied_embedding_check_competes_with_the_activations():
    model = summary(largest_layer_params=LARGEST, embedding_params=LARGEST, tied_embeddings=True, **SEVEN_B)
    where = target(gpus=2)
    buffers = deepspeed_buffers(model, where, Rung.Z2_OFFLOAD_OPT, _settings("0.19.8"))
    assert buffers.device_components["weight_grad_transient"] == 2 * LARGEST
    assert buffers.end_of_backward_bytes == 8 * LARGEST and buffers.end_of_backward_uncertainty == 0
    candidate = Candidate(Rung.Z2_OFFLOAD_OPT, 1)
    short = estimate(model, where, candidate, _settings("0.19.8", seq_len=16))
    backward = sum(short.gpu_components.get(name, 0) for name in ("activations", "logits", "backward_window"))
    assert backward < 8 * LARGEST  # the end of backward is the larger moment: the check shows in the peak
    assert short.gpu_components["phase_overlap"] == 8 * LARGEST - backward
    unknown = estimate(model, where, candidate, _settings(None, seq_len=16))
    assert unknown.gpu_uncertainty["offload_gradient_check_version"] == 3 * LARGEST
    # long sequences: the activations are the larger moment, the check adds nothing and needs no margin
    long = estimate(model, where, Candidate(Rung.Z2_OFFLOAD_OPT, 64), _settings(None, seq_len=2048))
    assert long.gpu_components.get("phase_overlap", 0) <= 0
    assert "offload_gradient_check_version" not in long.gpu_uncertainty


def test_local_stack_reads_the_deepspeed_version(monkeypatch: pytest.MonkeyPatch):
    from autotune.estimate import runtime

    monkeypatch.setattr(runtime, "_installed", {"torch": "2.13.0+cpu", "deepspeed": "0.19.8"}.get)
    assert runtime.local_stack().deepspeed_version == "0.19.8"


def test_the_deepseek_math_offload_point_no_longer_fits():
    """The published false fit (benchmarks/published/points.json): 2 x 24 GB, OOM while allocating 1.56 GiB."""
    spec = importlib.util.spec_from_file_location("published_accuracy", REPO / "benchmarks" / "published_accuracy.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules.setdefault("published_accuracy", module)
    spec.loader.exec_module(module)
    points = json.loads(module.POINTS.read_text())["points"]
    point = next(p for p in points if p["id"] == "dszero-dsmath7b-case5-z2-offload-gc")
    outcome = module.run_point(point)
    assert not outcome.fits
    assert outcome.components_gib["weight_grad_transient"] == pytest.approx(10 * 102400 * 4096 / GiB, abs=1e-3)
    # the verdict rests on the elementwise check of the versions a 2025 run used (0.13.3-0.19.5), carried as
    # margin while the version is unknown: 0.19.8 makes 3 B per element less of the same gradient
    model = module._model(point["model"])
    where = target(gpus=2, memory=round(point["gpu_memory_gib"] * GiB))
    settings = module._settings(point, model)
    candidate = Candidate(Rung.Z2_OFFLOAD_OPT, 1, True)

    def with_deepspeed(version: str):
        stack = replace(settings.stack, deepspeed_version=version)
        return estimate(model, where, candidate, replace(settings, stack=stack))

    older, newest = with_deepspeed("0.17.5"), with_deepspeed("0.19.8")
    assert not check_fit(older, where, headroom=1.0).fits
    difference = older.gpu_components["weight_grad_transient"] - newest.gpu_components["weight_grad_transient"]
    assert difference == 3 * 102400 * 4096


@pytest.mark.slow
def test_installed_deepspeed_makes_the_temporary_the_model_counts(tmp_path: Path):
    """Real DeepSpeed on the CPU backend (benchmarks/offload_gradient_check_cpu.py, about 2-3 min on 2 cores): the
    backward's peak less the two reduce buffers, per element of the largest gradient, is the model's figure."""
    import subprocess

    out = tmp_path / "measured.json"
    subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "offload_gradient_check_cpu.py"), "--out", str(out)],
        check=True,
        capture_output=True,
        timeout=900,
    )
    measured = json.loads(out.read_text())
    central, _ = offload_gradient_check_bytes(1, RuntimeStack(deepspeed_version=measured["deepspeed"]))
    assert measured["transient_bytes_per_element"][-1] == pytest.approx(central, abs=0.05)

"""Fast checks of the memory-model benchmarks: they parse, and their comparison figures are computed
right, without launching a trial or a CLI timing loop."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import needs

from autotune.core.ladder import Rung
from autotune.hardware.specs import Target, generic_gpu
from autotune.models import resolve_model, summarize

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(autouse=True)
def _benchmarks_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))


@pytest.mark.parametrize("script", ["estimate_accuracy.py", "plan_latency.py"])
def test_scripts_show_help(script: str) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "usage" in done.stdout


@needs(
    "transformers",
    "5.0",
    "4.51.3's GPT-2 registers bias/masked_bias buffers (models/gpt2/modeling_gpt2.py:162,169), which accelerate counts",
)
def test_accelerate_figure_is_its_adam_row() -> None:
    import estimate_accuracy

    summary = summarize(resolve_model("tiny-gpt2"))
    accelerate = estimate_accuracy.accelerate_estimate(summary, None)
    assert accelerate["training_bytes"] == 8 * summary.total_params  # 2 x the fp32 model: its Adam "step" row


def test_comparison_figures() -> None:
    import estimate_accuracy

    summary = summarize(resolve_model("tiny-gpt2"))
    one = Target(generic_gpu(2**40), gpus_per_node=1, nodes=1, free_memory_bytes=2**40)
    params = summary.total_params
    assert estimate_accuracy.deepspeed_alone(summary, one, Rung.Z2) == 2 * params + 18 * params
    offload = estimate_accuracy.deepspeed_alone(summary, one, Rung.Z2_OFFLOAD_OPT)
    assert offload == 2 * params + int(16 * params * 1.5)  # DeepSpeed's default additional_buffer_factor
    rows = [
        {
            "malloc": "mmap64k",
            "measured_bytes": 100,
            "predicted_error_pct": -4.0,
            "deepspeed_alone_error_pct": -90.0,
            "accelerate_error_pct": -95.0,
        },
        {
            "malloc": "mmap64k",
            "measured_bytes": 100,
            "predicted_error_pct": 6.0,
            "deepspeed_alone_error_pct": -80.0,
            "accelerate_error_pct": -99.0,
        },
    ]
    summary_row = estimate_accuracy._summary(rows)["mmap64k"]
    assert summary_row["predicted"] == {
        "median_abs_error_pct": 5.0,
        "worst_abs_error_pct": 6.0,
        "median_signed_error_pct": 1.0,
    }

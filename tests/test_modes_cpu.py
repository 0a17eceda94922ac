"""The modern memory modes run for real on the CPU backend: which run, and partial offload measured against the model.

Slow: each case is a real DeepSpeed trial (about 20-60 s on 2 shared cores).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.estimate.mode_terms import partial_offload_device_elements
from autotune.models import resolve_model, summarize
from autotune.modes.applies import CPU_BACKEND, RATIO_STEPS
from autotune.trial.launch.ops import prebuild_ops

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
# The CPU memory model's usual error on real trials with the mmap64k malloc setting: median 3.7%, worst 13.4%
# over 13 points (benchmarks/results/estimate_accuracy_cpu.json, benchmarks/README.md). A partial-offload point
# must stay inside the worst classic point's error.
USUAL_WORST_ERROR = 0.134


@pytest.fixture(autouse=True)
def _benchmarks_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))


@pytest.fixture(scope="module", autouse=True)
def cpu_ops_built() -> None:
    prebuild_ops("cpu")


@pytest.mark.slow
def test_the_cpu_backend_table_is_what_deepspeed_does() -> None:
    """Every mode runs, or fails with exactly the error autotune.modes.applies records for it."""
    import modes_cpu_backend

    for family, rung, mode, ranks in modes_cpu_backend.CASES:
        row = modes_cpu_backend.run_case(family, rung, mode, ranks)
        expected = CPU_BACKEND[family]
        assert row["runs"] == expected.runs, (family, row["error"])
        if expected.runs:
            facts = row["engine_facts"]
            assert facts["zero_stage"] == rung.stage
            if mode.offload_ratio != 1.0:
                assert facts["offload_ratio"] == mode.offload_ratio
            assert facts["zenflow"] == mode.zenflow
            assert facts["hpz_partition_size"] == mode.hpz_partition_size
        else:
            assert expected.error in row["error"], (family, row["error"])


@pytest.mark.slow
@pytest.mark.parametrize("ratio", [0.0, 0.5, 1.0])
def test_partial_offload_rss_matches_the_model_and_the_engine_runs_the_ratio(ratio: float) -> None:
    import estimate_accuracy

    point = next(
        p for p in estimate_accuracy.PARTIAL_OFFLOAD_POINTS if p.model == "gpt2-small-demo" and p.offload_ratio == ratio
    )
    row = estimate_accuracy.run_point(point, "cpu", "bf16")
    assert row["status"] == "ok", row["error"]
    assert abs(row["predicted_error_pct"]) <= 100 * USUAL_WORST_ERROR, row["predicted_error_pct"]
    facts = row["engine_facts"]
    assert facts["zero_stage"] == 3 and facts["offload_ratio"] == ratio
    # The CPU backend cannot show the split: stage3.py:1099-1108 places sub-groups on get_accelerator()._name, which
    # is 'cpu' there, so DeepSpeedCPUAdam steps every sub-group whatever the ratio.
    assert facts["sub_groups_on_accelerator"] == 0 and facts["device_stepped_elements"] == 0
    if ratio == 1.0:  # the classic rung: DeepSpeed's default sub_group_size, one sub-group
        assert facts["sub_groups"] == 1
        return
    # What it can show: the engine's real sub-groups, cut by the emitted sub_group_size, and the share DeepSpeed's
    # formula (stage3.py:1105) would keep on an accelerator, against the memory model's.
    sizes = facts["sub_group_elements"]
    assert 2 <= len(sizes) <= RATIO_STEPS
    deepspeed_device = sum(sizes[: int((1 - ratio) * len(sizes))])
    summary = summarize(resolve_model(point.model))
    mlp = summary.hidden_size * summary.intermediate_size
    modelled = partial_offload_device_elements(ratio, facts["elements"], summary.embedding_params, mlp)
    error = (modelled - deepspeed_device) / facts["elements"]
    assert -0.005 <= error <= 2.5 / RATIO_STEPS, (sizes, modelled, deepspeed_device)

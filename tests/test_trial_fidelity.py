"""A trial must be the user's job: training-dtype weights before DeepSpeed, CPU Adam with the launcher's threads."""

from __future__ import annotations

import pytest

from autotune.models import resolve_model, summarize
from autotune.trial.launch.processes import cpu_threads_per_rank, trial_env
from autotune.trial.trial_types import TrialSpec


def _spec(precision: dict) -> TrialSpec:
    source = resolve_model("tiny-llama")
    summary = summarize(source)
    return TrialSpec(
        model_config=source.config,
        architecture=summary.architecture,
        family=summary.family,
        ds_config={"train_micro_batch_size_per_gpu": 1, **precision},
        seq_len=16,
        device="cpu",
    )


@pytest.mark.parametrize(
    ("precision", "expected"),
    [({"bf16": {"enabled": True}}, "bfloat16"), ({"fp16": {"enabled": True}}, "float16"), ({}, "float32")],
)
def test_weights_reach_the_device_in_the_training_dtype(precision: dict, expected: str) -> None:
    torch = pytest.importorskip("torch")
    from autotune.trial.worker.train_steps import build_trial_model

    model = build_trial_model(_spec(precision), torch.device("cpu"))
    assert {str(p.dtype) for p in model.parameters()} == {f"torch.{expected}"}
    assert all(p.device.type == "cpu" for p in model.parameters())
    # Buffers stay fp32 as DeepSpeed keeps them (rotary inv_freq), and the weights were really initialised.
    assert {b.dtype for b in model.buffers() if b.is_floating_point()} <= {torch.float32}
    assert any(p.float().abs().sum().item() > 0 for p in model.parameters())


def test_cpu_threads_split_the_node_cores_between_ranks() -> None:
    assert cpu_threads_per_rank(1, cores=16) == 16
    assert cpu_threads_per_rank(8, cores=64) == 8
    assert cpu_threads_per_rank(4, cores=2) == 1  # never zero


def test_trial_env_sets_threads_per_rank_unless_the_user_did() -> None:
    env = trial_env({}, "tag", "cuda", ranks_per_node=2)
    assert env["OMP_NUM_THREADS"] == str(cpu_threads_per_rank(2))
    assert trial_env({"OMP_NUM_THREADS": "3"}, "tag", "cuda", ranks_per_node=2)["OMP_NUM_THREADS"] == "3"

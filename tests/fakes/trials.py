"""Real trials of tiny-gpt2 on the CPU backend: the spec (`tiny_spec`), a mark to find a trial's processes by
(`marked_env`, `survivors`), what a measured trial must show (`assert_measured`), and the fixture that builds
DeepSpeed's CPU ops once before any trial timeout runs (`cpu_ops_built`, autouse where imported)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import psutil
import pytest

from autotune.core.ladder import Candidate, Rung
from autotune.dsconfig.build_config import TrainSettings, build_ds_config
from autotune.trial import (
    TrialResult,
    TrialSpec,
    tagged_processes,
)
from autotune.trial.launch.ops import prebuild_ops

GENEROUS_TIMEOUT_S = 600.0  # other engineers share the 2 cores: only the hang test relies on a short timeout
MARK_ENV = "AUTOTUNE_TEST_MARK"
TINY_GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 1024, "n_positions": 256}


@pytest.fixture(scope="module", autouse=True)
def cpu_ops_built() -> None:
    """The first CPU trial on a machine JIT-builds DeepSpeed ops for minutes: do it outside any timeout."""
    prebuild_ops("cpu")


def tiny_spec(rung: Rung = Rung.Z0, nprocs: int = 1, nodes: int = 1, **overrides: object) -> TrialSpec:
    settings = TrainSettings(world_size=nprocs * nodes, precision="bf16", hidden_size=64)
    values: dict = dict(
        model_config=TINY_GPT2,
        architecture="GPT2LMHeadModel",
        family="decoder-only",
        ds_config=build_ds_config(Candidate(rung, micro_batch=2), settings),
        seq_len=64,
        device="cpu",
        nprocs_per_node=nprocs,
        nodes=nodes,
        warmup_steps=1,
        max_steps=4,
        timeout_s=GENEROUS_TIMEOUT_S,
    )
    values.update(overrides)
    return TrialSpec(**values)


def marked_env(**extra: str) -> tuple[str, dict[str, str]]:
    """A mark to find the trial's processes by; one OpenMP thread, as on a CPU shared with other tests
    more threads than free cores make each step several times slower."""
    mark = uuid.uuid4().hex
    return mark, {MARK_ENV: mark, "OMP_NUM_THREADS": "1", **extra}


def survivors(mark: str) -> list[psutil.Process]:
    return tagged_processes(mark, MARK_ENV)


def wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Poll `condition` every 0.1 s; whether it held within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def assert_measured(result: TrialResult, world_size: int = 1) -> None:
    assert result.status == "ok", result.error
    assert 3 <= len(result.step_times_s) <= 4 and all(t > 0 for t in result.step_times_s)
    assert result.samples_per_s and result.tokens_per_s == pytest.approx(result.samples_per_s * 64)
    assert result.tflops_per_gpu and result.tflops_per_gpu > 0
    assert len(result.ranks) == world_size
    assert all(r.host_rss_peak_bytes and r.host_rss_peak_bytes > 100 << 20 for r in result.ranks)

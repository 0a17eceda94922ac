"""DeepSpeed's module-level references to a finished ZeRO-3 engine, and the NVMe parameter swapper's page-locked
buffers, are dropped after a trial (trial/worker/deepspeed_globals.py), so a warm worker's next trial does not start on
top
of the last one's leftovers."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests.fakes.devices import FakeAioHandle
from tests.fakes.trials import tiny_spec

from autotune.core.ladder import Candidate, Rung
from autotune.dsconfig.build_config import TrainSettings, build_ds_config
from autotune.trial.launch.processes import one_rank_env
from autotune.trial.launch.warm import WARM_GROWTH_LIMIT_BYTES
from autotune.trial.trial_types import TrialSpec
from autotune.trial.worker.deepspeed_globals import lru_caches, release_nvme_param_buffers

# Runs a trial `count` times in one process the way a warm worker does; after each, what of it is still alive
# and the process's RSS.
_TRIALS_IN_ONE_PROCESS = """
import gc, json, os, sys, time
from autotune.trial.worker.memory import MemoryTracker, host_rss_bytes
from autotune.trial.worker.train_steps import PhaseClock, import_runtime, init_distributed, run_rank
from autotune.trial.trial_types import TrialSpec
from autotune.trial.launch.warm import WARM_GROWTH_LIMIT_BYTES
from autotune.trial.worker.main import placement_from_env
spec, count = TrialSpec(**json.loads(sys.argv[1])), int(sys.argv[2])
placement = placement_from_env(os.environ)
import_runtime("cpu")
memory = MemoryTracker("cpu", 0)
init_distributed("cpu", 0)
kept = ("GPT2LMHeadModel", "PeftModelForCausalLM", "DeepSpeedZeroOptimizer_Stage3", "PartitionedParameterCoordinator")
after = []
for _ in range(count):
    report = run_rank(spec, placement, PhaseClock(time.time()), memory)
    gc.collect()
    alive = sorted(type(o).__name__ for o in gc.get_objects() if type(o).__name__ in kept)
    after.append({"status": report.status, "error": report.error, "alive": alive, "rss": host_rss_bytes()})
print(json.dumps(after))
"""


def trials_in_one_process(spec: TrialSpec, count: int = 1) -> list[dict]:
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", **one_rank_env()}
    run = subprocess.run(
        [sys.executable, "-c", _TRIALS_IN_ONE_PROCESS, json.dumps(spec.to_dict()), str(count)],
        env=env, capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    after = json.loads(run.stdout.strip().splitlines()[-1])
    assert all(trial["status"] == "ok" for trial in after), after
    return after


LORA = {"rank": 8, "target_modules": [], "alpha": None, "model_type": "gpt2"}  # peft's default targets


def test_nothing_of_a_zero3_trial_outlives_it() -> None:
    for rung, lora in ((Rung.Z3, None), (Rung.Z3_OFFLOAD_ALL, None), (Rung.Z3, LORA)):
        (after,) = trials_in_one_process(tiny_spec(rung, lora=lora))  # the launcher tests' tiny GPT-2
        assert after["alive"] == [], (rung, lora)  # before: the model, its ZeRO-3 optimizer and coordinator stayed


def test_caches_are_found_behind_decorators_that_hide_them() -> None:
    @functools.cache
    def cached(x: int) -> int:
        return x

    def hiding(func):  # like DeepSpeed's instrument_w_nvtx: a closure, no functools.wraps
        def wrapped(*args: object) -> object:
            return func(*args)

        return wrapped

    @functools.wraps(cached)
    def exposing(*args: object) -> object:
        return cached(*args)

    def plain(x: int) -> int:
        return x

    assert list(lru_caches([hiding(cached)])) == [cached]
    assert list(lru_caches([exposing, hiding(cached)])) == [cached]  # each cache once
    assert list(lru_caches([plain, 3, hiding(plain)])) == []


def test_the_parameter_swappers_locked_buffers_are_freed_once_each() -> None:
    read_buffer, write_buffer, foreign = torch.empty(1000, dtype=torch.bfloat16), torch.empty(10), torch.empty(7)
    handles = FakeAioHandle({read_buffer.data_ptr(), write_buffer.data_ptr()})

    class Swapper:
        aio_read_handle = aio_write_handle = handles
        buffers, partitioned_swap_buffer = read_buffer, write_buffer

    class GpuDirect:  # GPUDirect buffers are pinned device memory, not the page-locked allocator's
        aio_read_handle = aio_write_handle = handles
        buffers, partitioned_swap_buffer = foreign, None

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    swapper = Swapper()
    for param in [*model[0].parameters(), *model[1].parameters()]:
        param.nvme_swapper = swapper  # as zero.Init does (partition_parameters.py:1317): many params, one swapper
    model[2].weight.nvme_swapper = GpuDirect()
    assert release_nvme_param_buffers(model) == 1000 * 2 + 10 * 4
    assert sorted(handles.freed) == sorted([read_buffer.data_ptr(), write_buffer.data_ptr()])
    assert swapper.buffers is None and swapper.partitioned_swap_buffer is None  # freed memory is not reachable
    assert release_nvme_param_buffers(model) == 0


@pytest.mark.slow
@pytest.mark.nvme
def test_an_nvme_parameter_trial_gives_its_locked_swap_buffers_back(tmp_path: Path) -> None:
    """Before: each such trial left its worker 957 MiB larger (5 x 1e8 16-bit swap elements, mlock'ed)."""
    settings = TrainSettings(world_size=1, precision="bf16", hidden_size=64, nvme_path=str(tmp_path))
    ds_config = build_ds_config(Candidate(Rung.Z3_NVME_ALL, micro_batch=2), settings)
    first, second = trials_in_one_process(tiny_spec(Rung.Z3_NVME_ALL, ds_config=ds_config), count=2)
    assert second["rss"] - first["rss"] < WARM_GROWTH_LIMIT_BYTES  # the warm pool's own limit

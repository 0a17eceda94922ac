"""DeepSpeed's module-level references to a finished ZeRO-3 engine are dropped after a trial
(trial/deepspeed_globals.py), so a warm worker's next trial does not start on top of the last one's model."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

from tests.test_trial_run import tiny_spec

from autotune.ladder import Rung
from autotune.trial.deepspeed_globals import lru_caches
from autotune.trial.processes import one_rank_env

# Runs one trial in this process the way a warm worker does, then lists what of it is still alive.
_ONE_TRIAL_THEN_COUNT = """
import gc, json, os, sys, time
from autotune.trial.memory import MemoryTracker
from autotune.trial.training import PhaseClock, import_runtime, init_distributed, run_rank
from autotune.trial.types import TrialSpec
from autotune.trial.worker import placement_from_env
spec = TrialSpec(**json.loads(sys.argv[1]))
placement = placement_from_env(os.environ)
import_runtime("cpu")
memory = MemoryTracker("cpu", 0)
init_distributed("cpu", 0)
report = run_rank(spec, placement, PhaseClock(time.time()), memory)
gc.collect()
kept = ("GPT2LMHeadModel", "PeftModelForCausalLM", "DeepSpeedZeroOptimizer_Stage3", "PartitionedParameterCoordinator")
alive = sorted(type(o).__name__ for o in gc.get_objects() if type(o).__name__ in kept)
print(json.dumps({"status": report.status, "error": report.error, "alive": alive}))
"""


LORA = {"rank": 8, "target_modules": [], "alpha": None, "model_type": "gpt2"}  # peft's default targets


def test_nothing_of_a_zero3_trial_outlives_it() -> None:
    for rung, lora in ((Rung.Z3, None), (Rung.Z3_OFFLOAD_ALL, None), (Rung.Z3, LORA)):
        env = {
            **os.environ,
            "DS_ACCELERATOR": "cpu",
            "OMP_NUM_THREADS": "1",
            **one_rank_env(),
        }
        spec = json.dumps(tiny_spec(rung, lora=lora).to_dict())  # the launcher tests' tiny GPT-2
        run = subprocess.run(
            [sys.executable, "-c", _ONE_TRIAL_THEN_COUNT, spec], env=env, capture_output=True, text=True, timeout=600
        )
        assert run.returncode == 0, run.stderr[-2000:]
        outcome = json.loads(run.stdout.strip().splitlines()[-1])
        assert outcome["status"] == "ok", outcome["error"]
        assert outcome["alive"] == [], (rung, lora)  # before: the model, its ZeRO-3 optimizer and coordinator stayed


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

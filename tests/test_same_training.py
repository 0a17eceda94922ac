"""Same training by default: modes that change the update rule or numerics only with --allow-approximate, and
every config the search can emit keeps engine.gradient_accumulation_steps() equal to the stated accumulation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import needs

from autotune.core.ladder import Candidate, Mode, Rung
from autotune.dsconfig.build_config import TrainSettings, build_ds_config
from autotune.modes.applies import (
    APPROXIMATE_FLAG,
    ModeFacts,
    approximation,
    considered_modes,
    mode_applies,
    ratio_mode,
)
from autotune.trial.launch.processes import one_rank_env

# A layout where every family applies somewhere: two nodes of two GPUs (ZeRO++), a GH200 (SuperOffload).
WIDE = {"nodes": 2, "gpus_per_node": 2, "superchip": True}
APPROXIMATE = (Mode(zenflow=True), Mode(quantized_weights=True, quantized_gradients=True), ratio_mode(0.5))
EXACT = (Mode(hpz_partition_size=2), Mode(super_offload=True))


def _applying(facts: ModeFacts) -> list[Mode]:
    return [option.mode for rung in Rung for option in considered_modes(rung, facts) if option.applies]


def test_default_search_holds_no_mode_that_changes_the_training() -> None:
    facts = ModeFacts(**WIDE)
    applying = _applying(facts)
    assert applying, "hpZ and SuperOffload are exact and stay in the default search"
    assert all(not approximation(mode, facts) for mode in applying)
    assert not any(m.zenflow or m.quantized_weights or m.quantized_gradients for m in applying)
    assert not any(m.offload_ratio != 1.0 for m in applying)
    for mode in EXACT:
        assert mode in applying
    refused = [o for r in Rung for o in considered_modes(r, facts) if o.mode in APPROXIMATE and not o.applies]
    assert any(APPROXIMATE_FLAG in option.reason for option in refused)
    assert not mode_applies(Rung.Z2_OFFLOAD_OPT, Mode(zenflow=True), facts)


def test_the_opt_in_brings_them_back_and_says_what_each_changes() -> None:
    facts = ModeFacts(**WIDE, allow_approximate=True)
    applying = _applying(facts)
    for mode in APPROXIMATE:
        assert any(m == mode or (mode.offload_ratio != 1.0 and m.offload_ratio != 1.0) for m in applying), mode
        assert approximation(mode, facts)
    assert mode_applies(Rung.Z2_OFFLOAD_OPT, Mode(zenflow=True), facts)
    assert "top-k" in approximation(Mode(zenflow=True), facts)


def test_super_offload_is_approximate_only_in_fp16() -> None:
    """fp16 without clipping: its asynchronous CPU step sees loss-scaled gradients (superoffload_stage3.py:169)."""
    assert not approximation(Mode(super_offload=True), ModeFacts(**WIDE, precision="bf16"))
    assert approximation(Mode(super_offload=True), ModeFacts(**WIDE, precision="fp16"))


def test_zenflow_update_interval_is_the_stated_accumulation() -> None:
    settings = TrainSettings(world_size=2, global_batch=16, precision="fp32")
    config = build_ds_config(Candidate(Rung.Z2_OFFLOAD_OPT, 2, mode=Mode(zenflow=True)), settings)
    assert config["gradient_accumulation_steps"] == 4
    assert config["zero_optimization"]["zenflow"]["update_interval"] == 4


# Every (rung, mode) the search can emit on one node that the CPU backend can build; NVMe rungs need libaio and a
# scratch path, hpZ needs two nodes, qwZ/qgZ and SuperOffload a GPU (autotune.modes.applies.CPU_BACKEND). DeepSpeed
# 0.19.8 changes gradient_accumulation_steps after parsing only in zenflow/engine.py:69 (and in the user-called
# set_train_batch_size, engine.py:1336), so ZenFlow is the mode that needs the engine to tell.
EMITTABLE = [
    *[(rung, Mode()) for rung in Rung if not rung.needs_nvme],
    (Rung.Z3_OFFLOAD_OPT, ratio_mode(0.5)),
    (Rung.Z2_OFFLOAD_OPT, Mode(zenflow=True)),
]
_MARK = "engine accumulations: "
TINY_PARAMS = 2 * 16 * 16  # engine_child's two linear layers


def _engine_accumulations(configs: list[dict]) -> list[int]:
    """Build each config's real engine (CPU backend, one rank, a tiny model) in one child and step it once."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu", **one_rank_env()}
    done = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r});"
         " import test_same_training as t; t.engine_child()"],
        input=json.dumps(configs), capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith(_MARK)]
    assert lines, done.stderr[-3000:]
    return json.loads(lines[-1][len(_MARK) :])


def engine_child() -> None:
    """In the child: deepspeed.initialize per config, one optimizer step over gradient_accumulation_steps()."""
    import deepspeed
    import torch

    answers = []
    for config in json.loads(sys.stdin.read()):
        # square weights without biases: ZenFlow selects gradient columns of 2-D weights (zenflow_stage_1_and_2.py)
        model = torch.nn.Sequential(
            torch.nn.Linear(16, 16, bias=False), torch.nn.ReLU(), torch.nn.Linear(16, 16, bias=False)
        )
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        steps = engine.gradient_accumulation_steps()
        for _ in range(steps):
            loss = engine(torch.randn(engine.train_micro_batch_size_per_gpu(), 16)).float().pow(2).mean()
            engine.backward(loss)
            engine.step()
        answers.append(steps)
        engine.destroy()
    sys.stdout.write(f"\n{_MARK}{json.dumps(answers)}\n")
    sys.stdout.flush()
    os._exit(0)


def _accumulations_kept(emitted: list[tuple[Rung, Mode]]) -> None:
    settings = TrainSettings(world_size=1, global_batch=3, precision="fp32", trainable_params=TINY_PARAMS)
    configs = [build_ds_config(Candidate(rung, 1, mode=mode), settings) for rung, mode in emitted]
    assert {c["gradient_accumulation_steps"] for c in configs} == {3}
    assert _engine_accumulations(configs) == [3] * len(configs)


def test_every_emittable_mode_keeps_the_engines_accumulation() -> None:
    _accumulations_kept([(rung, mode) for rung, mode in EMITTABLE if not mode.zenflow])


@needs(
    "deepspeed",
    "0.19.8",
    "0.17.6 asserts 'untested ZeRO Optimizer' on ZenFlowCPUAdam (runtime/zero/utils.py:43, engine.py:1384); "
    "0.19.8 lists it (runtime/zero/utils.py:46); releases between not bisected",
)
def test_zenflow_keeps_the_engines_accumulation() -> None:
    _accumulations_kept([(rung, mode) for rung, mode in EMITTABLE if mode.zenflow])


@pytest.mark.slow
def test_the_old_auto_update_interval_gave_zero() -> None:
    """The engine, not our reading of it: "auto" is what broke plain DeepSpeed loops (engine.py:48-50, 69)."""
    settings = TrainSettings(world_size=1, global_batch=3, precision="fp32")
    config = build_ds_config(Candidate(Rung.Z2_OFFLOAD_OPT, 1, mode=Mode(zenflow=True)), settings)
    config["zero_optimization"]["zenflow"]["update_interval"] = "auto"
    assert _engine_accumulations([config]) == [0]


def test_only_zenflow_rewrites_the_accumulation_after_parsing() -> None:
    """The modes a CPU engine cannot build (hpZ on one rank, qwZ/qgZ, SuperOffload) keep DeepSpeed's parsed
    accumulation: in DeepSpeed's runtime only ZenFlow (zenflow/engine.py:69) and the user-called
    set_train_batch_size (engine.py:1336) assign the engine config's gradient_accumulation_steps."""
    import re

    import deepspeed

    runtime = Path(deepspeed.__file__).parent / "runtime"
    assigning = re.compile(r"_config\.gradient_accumulation_steps\s*=[^=]")
    writers = sorted(
        str(path.relative_to(runtime)) for path in runtime.rglob("*.py") if assigning.search(path.read_text())
    )
    assert writers == ["engine.py", "zenflow/engine.py"], writers
    assert "def set_train_batch_size" in (runtime / "engine.py").read_text()


def test_plan_and_check_say_when_a_users_zenflow_makes_the_accumulation_zero() -> None:
    from autotune.modes.from_config import config_mode

    zero = {"stage": 2, "offload_optimizer": {"device": "cpu"}, "zenflow": {"topk_ratio": 0.1}}
    _, notes = config_mode(zero, Rung.Z2_OFFLOAD_OPT)
    assert any("gradient_accumulation_steps() 0" in note for note in notes)
    _, notes = config_mode({**zero, "zenflow": {"update_interval": 4}}, Rung.Z2_OFFLOAD_OPT)
    assert not any("gradient_accumulation_steps" in note for note in notes)

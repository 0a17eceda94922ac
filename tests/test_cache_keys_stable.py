"""The results cache's keys do not move when the request's shape does: a row an earlier autotune wrote is still hit.

The hex digests below were computed by autotune at 5f36582 (flat `TuneRequest`, before its sections) for the same
requests, with the library versions, the allocator settings and DS_PIN_MEMORY_BACKEND fixed, so that only the
request decides them. A change to what enters a key must be deliberate: it strands every cache row written before.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.fakes.hook import job_env

from autotune.core.ladder import Rung
from autotune.hook import run as hook_run
from autotune.request.context import TuneContext
from autotune.request.tune_request import section_flat_names
from autotune.tuner import TuneRequest

VERSIONS = {"deepspeed": "0.19.8", "torch": "2.13.0", "transformers": "5.0.0"}

# name -> (the request's options, the trials' key, the answer's key) as 5f36582 computed them
CONTEXT_KEYS = {
    "defaults": ({}, "2e4fc98e59aa10d7aeed54a7", "431bbce1f7940892b18833d8"),
    "many options": (
        dict(
            seq_len=512,
            global_batch=64,
            precision="bf16",
            attention="eager",
            optimizer="adafactor",
            kernels="liger",
            allow_approximate=True,
            rungs=(Rung.Z2, Rung.Z3),
            micro_batches=(1, 2, 4),
            gpu_memory_fraction=0.5,
            headroom=0.8,
            max_trials=5,
            out="elsewhere.json",
        ),
        "0e266606e3d3688d5156b8d8",
        "7956b426d288dfaeb9dc2f47",
    ),
}

# name -> (the hook's tuning options, the job key) as 5f36582 computed them
JOB_KEYS = {
    # 5f36582 wrote 12ed2df0442bbe37a785cbd7 for the defaults, whose trial budget was then a flat 12; since the budget
    # is derived from the search (search/trial_budget.py, max_trials None) a default hook job is another question
    "defaults": ({}, "4184ecae4888ab83b9d4e8c2"),
    "12 trials, 5f36582's default": ({"max_trials": 12}, "12ed2df0442bbe37a785cbd7"),
    "many options": (
        dict(seq_len=32, headroom=0.8, max_trials=3, rungs=(Rung.Z0,), micro_batches=(1, 2), out="x.json"),
        "536e2b480b78b26770477cdf",
    ),
}


@pytest.fixture(autouse=True)
def _fixed_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DS_PIN_MEMORY_BACKEND", raising=False)
    monkeypatch.setattr(hook_run, "library_versions", lambda: dict(VERSIONS))


@pytest.mark.parametrize("name", sorted(CONTEXT_KEYS))
def test_a_tuning_keys_are_those_an_earlier_autotune_wrote(name: str) -> None:
    options, trials_key, answer_key = CONTEXT_KEYS[name]
    request = TuneRequest.of(model="gpt2", gpus=8, gpu_type="a100-80gb", **options)
    ctx = replace(TuneContext.build(request, outputs=False), versions=dict(VERSIONS), allocator={})
    assert (ctx.key, ctx.answer_key) == (trials_key, answer_key)


@pytest.mark.parametrize("name", sorted(JOB_KEYS))
def test_the_hook_job_key_is_the_one_an_earlier_autotune_wrote(name: str) -> None:
    options, key = JOB_KEYS[name]
    tuning = TuneRequest.of(model="tiny-gpt2", device="cpu", memory_budget="2GiB", **options)
    assert hook_run.job_key(tuning, job_env(2)) == key


# A value other than the default for every field of the output section (request/asks.py): a new output field must be
# named here, so whether it enters a key is decided, not inherited.
OTHER_OUTPUT = {"out": "other.json", "report_dir": "reports", "hf": True, "use_cache": False, "cache_dir": "cache"}


def test_no_output_field_enters_a_key() -> None:
    """The output section says where results go and come from: the same question wherever it is written."""
    assert set(OTHER_OUTPUT) == set(section_flat_names("output"))
    base = TuneRequest.of(model="tiny-gpt2", device="cpu", memory_budget="2GiB")
    ctx = replace(TuneContext.build(base, outputs=False), versions=dict(VERSIONS), allocator={})
    for name, value in OTHER_OUTPUT.items():
        other = base.updated(**{name: value})
        built = replace(TuneContext.build(other, outputs=False), versions=dict(VERSIONS), allocator={})
        assert (built.key, built.answer_key) == (ctx.key, ctx.answer_key), name
        assert hook_run.job_key(other, job_env(2)) == hook_run.job_key(base, job_env(2)), name

"""Whose memory a trial's peak is (trial/worker/peak_sites.py): the replay on hand-made traces in both frame formats
and on one torch itself wrote, the recorder without CUDA, and the request's way through a real trial."""

from __future__ import annotations

import dataclasses

import torch
from tests.fakes.trials import tiny_spec

from autotune.core.ladder import Rung
from autotune.trial import LocalLauncher
from autotune.trial.worker.peak_sites import (
    BEFORE_TRIAL,
    NO_PYTHON_FRAME,
    PeakSiteRecorder,
    attribute,
    frames_of,
    site_of,
)

MiB = 2**20
# The CUDA recorder's frames (innermost first, full paths) and the CPU profiler's ("file(line): function").
DEEPSPEED = [
    {"filename": "/venv/lib/python3.11/site-packages/torch/nn/functional.py", "line": 10, "name": "pad"},
    {"filename": "/venv/lib/python3.11/site-packages/deepspeed/runtime/zero/stage3.py", "line": 1234, "name": "step"},
]
TRANSFORMERS = [
    {"filename": "none", "line": 0, "name": "<built-in function linear>"},
    {"filename": "none", "line": 0, "name": "torch/nn/modules/linear.py(130): forward"},
    {"filename": "none", "line": 0, "name": "nn.Module: Linear_0"},
    {"filename": "none", "line": 0, "name": "transformers/models/llama/modeling_llama.py(88): forward"},
]
ADAMW = [{"filename": "/x/site-packages/torch/optim/adamw.py", "line": 50, "name": "_multi_tensor_adamw"}]


def alloc(addr: int, size: int, frames: list[dict]) -> dict:
    return {"action": "alloc", "addr": addr, "size": size, "frames": frames}


def free(addr: int, size: int) -> list[dict]:
    return [{"action": "free_requested", "addr": addr, "size": size}, {"action": "free_completed", "addr": addr}]


def test_the_live_set_at_the_highest_total_is_summed_by_allocating_line() -> None:
    trace = [
        alloc(1, 100 * MiB, DEEPSPEED),
        alloc(2, 50 * MiB, TRANSFORMERS),
        alloc(3, 20 * MiB, TRANSFORMERS),
        *free(1, 100 * MiB),  # the total falls from 170 MiB: the peak is behind us
        alloc(4, 60 * MiB, []),
        alloc(5, 40 * MiB, ADAMW),
        {"action": "segment_alloc", "addr": 9, "size": 512 * MiB},  # reserved, not allocated
        *free(99, 7 * MiB),  # freed, but allocated before the recording: ignored
    ]
    result = attribute(trace, "test")
    assert result.peak_bytes == 170 * MiB
    sites = {site.site: (site.bytes, site.blocks) for site in result.sites}
    assert sites == {
        "deepspeed/runtime/zero/stage3.py:1234 step": (100 * MiB, 1),  # the torch frame inside it is skipped
        "transformers/models/llama/modeling_llama.py:88 forward": (70 * MiB, 2),
    }
    assert result.packages == {"deepspeed": 100 * MiB, "transformers": 70 * MiB}
    assert sum(site.bytes for site in result.sites) + result.other_bytes == result.peak_bytes


def test_a_later_higher_peak_wins_and_keeps_what_torch_optim_and_cpp_allocated() -> None:
    trace = [alloc(1, 100 * MiB, DEEPSPEED), *free(1, 100 * MiB), alloc(2, 60 * MiB, []), alloc(3, 80 * MiB, ADAMW)]
    result = attribute(trace, "test", before_bytes=5 * MiB)
    assert result.peak_bytes == 145 * MiB
    assert [(s.site, s.bytes) for s in result.sites] == [
        ("torch/optim/adamw.py:50 _multi_tensor_adamw", 80 * MiB),
        (NO_PYTHON_FRAME, 60 * MiB),
        (BEFORE_TRIAL, 5 * MiB),
    ]


def test_an_oom_keeps_the_live_set_and_names_the_failed_request() -> None:
    trace = [alloc(1, 30 * MiB, DEEPSPEED), {"action": "oom", "size": 2048 * MiB, "device_free": 10 * MiB}]
    result = attribute(trace, "test")
    assert result.peak_bytes == 30 * MiB and result.oom_request_bytes == 2048 * MiB


def test_only_the_largest_sites_are_listed_and_the_rest_is_summed() -> None:
    trace = [alloc(i, (i + 1) * MiB, [{"filename": f"/s/site-packages/pkg/m{i}.py", "line": i, "name": "f"}])
             for i in range(5)]  # fmt: skip
    result = attribute(trace, "test", top=2)
    assert [s.bytes for s in result.sites] == [5 * MiB, 4 * MiB] and result.other_bytes == 6 * MiB


def test_frames_of_both_formats_and_the_first_frame_outside_torch() -> None:
    assert [str(f) for f in frames_of(TRANSFORMERS)] == [
        "torch/nn/modules/linear.py:130 forward",
        "transformers/models/llama/modeling_llama.py:88 forward",
    ]
    only_torch = [{"filename": "/x/site-packages/torch/nn/functional.py", "line": 3, "name": "linear"}]
    assert site_of(frames_of(only_torch)) == "torch/nn/functional.py:3 linear"
    assert site_of([]) == NO_PYTHON_FRAME


def _big_buffer() -> torch.Tensor:
    return torch.zeros(64 * MiB, dtype=torch.uint8)


def test_a_trace_torch_itself_wrote_is_replayed_to_its_lines() -> None:
    """The documented format as torch writes it: its profiler-to-snapshot converter on a real training step."""
    from torch.cuda._memory_viz import _profile_to_snapshot

    model = torch.nn.Linear(512, 512)
    optimizer = torch.optim.AdamW(model.parameters(), foreach=False)
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True, record_shapes=True, with_stack=True) as run:
        held = _big_buffer().add_(1)  # an op uses it: torch's memory profile keeps only tensors ops saw
        model(torch.randn(8, 512)).sum().backward()
        optimizer.step()
    del held
    trace = _profile_to_snapshot(run)["device_traces"][-1]  # CPU tensors sit after the CUDA devices
    result = attribute(trace, "torch_profiler")
    sites = {site.site: site.bytes for site in result.sites}
    # The profiler knows a Python function's first line, not the line that allocated (the CUDA trace does).
    function = f"test_peak_sites.py:{_big_buffer.__code__.co_firstlineno} _big_buffer"
    assert [size for site, size in sites.items() if site.endswith(function)] == [64 * MiB]
    state = sum(size for site, size in sites.items() if site.startswith("torch/optim/"))
    assert state >= 2 * 512 * 513 * 4  # AdamW's exp_avg and exp_avg_sq of every parameter, fp32
    assert result.peak_bytes >= 64 * MiB + state


def test_the_recorder_says_why_it_has_nothing_without_cuda() -> None:
    recorder = PeakSiteRecorder("cpu", 0)
    recorder.start()
    assert "needs a CUDA device" in recorder.finish()["error"]


def test_a_trial_carries_the_answer_back_only_when_asked() -> None:
    """The request's way through a real worker: on the CPU backend the answer is the reason there is none."""
    launcher = LocalLauncher()
    asked = launcher.run(dataclasses.replace(tiny_spec(Rung.Z0), record_peak_sites=True))
    assert asked.status == "ok", asked.error
    assert "needs a CUDA device" in asked.ranks[0].peak_sites["error"]
    plain = launcher.run(tiny_spec(Rung.Z0))
    assert plain.status == "ok" and plain.ranks[0].peak_sites is None


def test_the_cuda_recorder_drives_torchs_documented_api(monkeypatch) -> None:
    """The CUDA path without a GPU: torch's three calls swapped for fakes that check what they are given, and the
    keyword arguments checked against the installed torch's own signature."""
    import inspect

    accepted = inspect.signature(torch.cuda.memory._record_memory_history).parameters
    assert {"context", "stacks", "max_entries", "clear_history"} <= set(accepted)
    calls: list[tuple] = []
    device_traces = [[alloc(1, 5 * MiB, DEEPSPEED)], [alloc(2, 7 * MiB, TRANSFORMERS), *free(2, 7 * MiB)]]
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: calls.append(("allocated", device)) or 3 * MiB)
    monkeypatch.setattr(
        torch.cuda.memory, "_record_memory_history", lambda *args, **kwargs: calls.append(("record", args, kwargs))
    )
    snapshot = {"segments": [], "device_traces": device_traces}
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda: calls.append(("snapshot",)) or snapshot)
    recorder = PeakSiteRecorder("cuda", 1)
    recorder.start()
    result = recorder.finish()
    assert calls[0] == ("allocated", 1)
    assert calls[1][1] == ("all",) and calls[1][2]["stacks"] == "python" and calls[1][2]["clear_history"]
    assert calls[-1] == ("record", (None,), {})  # recording stopped
    assert result["source"] == "cuda_allocator_trace" and result["complete"]
    # rank 1's trace, what was allocated before the trial on top
    assert result["peak_bytes"] == 10 * MiB and result["sites"][-1]["site"] == BEFORE_TRIAL
    calls.clear()
    abandoned = PeakSiteRecorder("cuda", 0)  # a trial that ended before its figures were read
    abandoned.start()
    abandoned.stop()
    assert ("snapshot",) not in calls and calls[-1] == ("record", (None,), {})  # stopped, nothing worked out

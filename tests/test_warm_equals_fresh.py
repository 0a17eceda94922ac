"""Warm workers equal to fresh processes by construction (issue 42, item 5), tested without a GPU: the pinned host
cache emptied between trials, the pool's floor taken before its first trial, a verdict seen only in a warm worker
run once fresh before it is used or cached, a peak without NVML that adds the predicted context, UUID prefixes read
as the probe reads them, VmHWM's reset checked, and the allocator's settings recorded and in the cache key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from tests.fakes.devices import FakeCard, FakeNvml
from tests.fakes.launchers import CountingLauncher

from autotune import tune
from autotune.core.ladder import Candidate, Rung
from autotune.core.units import GiB, MiB
from autotune.request.context import TuneContext
from autotune.search.cache import ResultsCache
from autotune.search.records import SearchEvent
from autotune.trial.launch.chooser import TrialLaunchers
from autotune.trial.launch.warm import WARM_PINNED_GROWTH_LIMIT_BYTES, _Workers
from autotune.trial.rank_report import RankReport
from autotune.trial.trial_types import RankMetrics, TrialResult, TrialSpec
from autotune.trial.worker import memory, train_steps
from autotune.tuner import RESULTS_FILE, TuneRequest
from autotune.tuning.trials import warm_only_doubt

# --- the host pinned cache and the pool's floor ----------------------------------------------------------------


def test_freeing_a_gpu_trial_empties_torchs_pinned_host_cache_too(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("device"))
    monkeypatch.setattr(torch.accelerator, "empty_host_cache", lambda: calls.append("host"), raising=False)
    train_steps.free_memory("cuda")
    assert calls == ["device", "host"]
    calls.clear()
    train_steps.free_memory("cpu")  # the CPU backend pins nothing
    assert calls == []


def test_the_host_cache_is_emptied_by_whichever_name_this_torch_gives_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    called: list[str] = []
    monkeypatch.delattr(torch.accelerator, "empty_host_cache", raising=False)
    monkeypatch.setattr(torch._C, "_host_emptyCache", lambda: called.append("old"), raising=False)
    assert memory.empty_host_cache() == "torch._C._host_emptyCache" and called == ["old"]
    monkeypatch.delattr(torch._C, "_host_emptyCache")
    assert memory.empty_host_cache() is None  # said, not raised: the pool's pinned watch still catches leftovers


def _report(host: int, pinned: int, floor: dict[str, int] | None = None) -> dict[int, RankReport]:
    report = RankReport(
        rank=0, status="ok", host_rss_after_bytes=host, device_after_bytes=900 * MiB, pinned_after_bytes=pinned,
        floor=floor or {},
    )  # fmt: skip
    return {0: report}


def test_a_first_trial_that_leaves_pinned_blocks_replaces_the_workers_before_the_next_offload_trial() -> None:
    """The pinned floor is taken before the first trial (after the process group, a matmul and a collective): an
    offload trial whose pins stay in the worker (a torch without the host cache's release) is caught at once, instead
    of sitting in the floor and in every later trial's host peak, where the search would drop the next offload rung.
    Host RSS keeps its floor from after the first trial: first-use costs a fresh process pays too are not growth."""
    floor = {"host_rss_after_bytes": 1000 * MiB, "device_after_bytes": 900 * MiB, "pinned_after_bytes": 0}
    workers = _Workers((1, "cuda"), subprocess.Popen(["true"]), "tag", Path("/nonexistent"), gpus_before=None)
    pins = 512 * MiB  # an offload trial's optimizer states, one power-of-two pinned block
    assert workers.growth(_report(1000 * MiB + pins, pins, floor)) == ("pinned host memory", pins)
    emptied = _Workers((1, "cuda"), subprocess.Popen(["true"]), "tag", Path("/nonexistent"), gpus_before=None)
    assert emptied.growth(_report(1090 * MiB, 0, floor)) is None  # the cache emptied: the same worker goes on
    assert emptied.floors is not None and emptied.floors["host memory"] == {0: 1090 * MiB}  # after its first trial
    assert emptied.growth(_report(1100 * MiB, WARM_PINNED_GROWTH_LIMIT_BYTES + MiB, floor)) == (
        "pinned host memory", WARM_PINNED_GROWTH_LIMIT_BYTES + MiB,
    )  # fmt: skip


def test_a_worker_that_reports_no_floor_is_judged_from_its_first_trial_as_before() -> None:
    workers = _Workers((1, "cpu"), subprocess.Popen(["true"]), "tag", Path("/nonexistent"), gpus_before=None)
    first = {0: RankReport(rank=0, status="ok", host_rss_after_bytes=1000 * MiB)}
    assert workers.growth(first) is None
    assert workers.growth({0: RankReport(rank=0, status="ok", host_rss_after_bytes=1100 * MiB)}) == (
        "host memory", 100 * MiB,
    )  # fmt: skip


# --- a verdict seen only in a warm worker ---------------------------------------------------------------------------


class _WarmHostOom(CountingLauncher):
    """A warm pool whose ZeRO-3 trials end in a host OOM (an earlier trial's pins), which a fresh process does not."""

    def answer(self, spec: TrialSpec) -> TrialResult:
        if spec.ds_config["zero_optimization"]["stage"] == 3:
            return TrialResult(status="oom_host", error="host OOM (killed by the kernel)")
        return super().answer(spec)


def _request(tmp_path: Path, **overrides: object) -> TuneRequest:
    base: dict = dict(
        model="tiny-gpt2", device="cpu", memory_budget="2GiB", seq_len=64, rungs=(Rung.Z3,), micro_batches=(1, 2),
        out=str(tmp_path / "ds_config.json"), cache_dir=str(tmp_path / "cache"),
    )  # fmt: skip
    return TuneRequest.of(**{**base, **overrides})


def test_a_warm_only_host_oom_is_run_fresh_before_it_is_cached_or_drops_the_rung(tmp_path: Path) -> None:
    warm, fresh = _WarmHostOom(), CountingLauncher()
    events: list[SearchEvent] = []
    result = tune(_request(tmp_path), launcher=TrialLaunchers(warm, fresh), observe=events.append)
    report = result.report
    assert report is not None and report.choice is not None and report.choice.candidate.rung == Rung.Z3
    doubted = [e for e in events if e.message and "in a warm worker: running it once in a fresh process" in e.message]
    assert doubted and "oom_host" in (doubted[0].message or "")
    assert len(fresh.specs) >= 2  # each warm OOM re-run fresh, and the pick's own confirmation
    cache = ResultsCache(tmp_path / "cache" / RESULTS_FILE)
    ctx = TuneContext.build(_request(tmp_path))
    stored = cache.trials(ctx.key)
    assert stored and all(r.status == "ok" for r in stored.values())  # the fresh verdict was cached, not the OOM


def test_a_host_peak_over_the_headroom_is_doubted_only_on_gpus_and_an_ok_one_never(tmp_path: Path) -> None:
    ctx = TuneContext.build(_request(tmp_path))
    over = TrialResult("ok", ranks=[RankMetrics(0, host_rss_peak_bytes=10**15)])
    assert warm_only_doubt(ctx, Candidate(Rung.Z3, 1), over) is None  # CPU: the budget is host memory already
    assert warm_only_doubt(ctx, Candidate(Rung.Z3, 1), TrialResult("oom_gpu")) is None  # fresh confirmation's job
    gpu = SimpleNamespace(
        request=TuneRequest.of(model="tiny-gpt2", device="cuda", headroom=0.9),
        target=SimpleNamespace(host_ram_bytes=64 * GiB, gpus_per_node=1),
    )
    why = warm_only_doubt(gpu, Candidate(Rung.Z3_OFFLOAD_OPT, 1), over)  # type: ignore[arg-type]
    assert why is not None and "host RAM peak" in why
    within = TrialResult("ok", ranks=[RankMetrics(0, host_rss_peak_bytes=40 * GiB)])
    assert warm_only_doubt(gpu, Candidate(Rung.Z3_OFFLOAD_OPT, 1), within) is None  # type: ignore[arg-type]


# --- the peak without NVML, UUID prefixes, VmHWM ---------------------------------------------------------------------


def test_a_gpu_peak_without_nvml_adds_the_predicted_context_and_nccl_buffers() -> None:
    rank = RankMetrics(0, max_allocated_bytes=5 * GiB, max_reserved_bytes=6 * GiB)
    assert TrialResult("ok", ranks=[rank], outside_allocator_estimate_bytes=700 * MiB).peak_memory_bytes == (
        6 * GiB + 700 * MiB
    )
    with_nvml = RankMetrics(0, max_reserved_bytes=6 * GiB, device_used_bytes=6 * GiB + 512 * MiB)
    assert TrialResult("ok", ranks=[with_nvml], outside_allocator_estimate_bytes=700 * MiB).peak_memory_bytes == (
        6 * GiB + 512 * MiB
    )  # measured wins


def test_every_gpu_trial_spec_carries_the_predicted_context_and_nccl(tmp_path: Path) -> None:
    from autotune.estimate.peak import runtime_overheads

    ctx = TuneContext.build(
        TuneRequest.of(model="tiny-gpt2", gpu_type="a100-80gb", gpus=2, seq_len=64, out=str(tmp_path / "c.json"))
    )
    spec = ctx.spec(Candidate(Rung.Z2, 1))
    expected = sum(o.central for o in runtime_overheads(ctx.target, ctx.settings).values())
    assert spec.predicted_outside_allocator_bytes == expected and expected > 300 * MiB
    cpu = TuneContext.build(_request(tmp_path))
    assert cpu.spec(Candidate(Rung.Z3, 1)).predicted_outside_allocator_bytes is None


class _UuidNvml(FakeNvml):
    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return ["GPU-3f2a9c10-aaaa", "GPU-8b71e0d4-bbbb"][handle]


def test_a_uuid_prefix_in_cuda_visible_devices_finds_the_gpu_the_probe_finds(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = _UuidNvml(FakeCard(), FakeCard())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8b71")
    assert memory._nvml_handle(nvml, 0) == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert (memory._nvml_handle(nvml, 0), memory._nvml_handle(nvml, 1)) == (1, 0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-")  # ambiguous: CUDA stops there, so do we
    assert memory._nvml_handle(nvml, 0) is None
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert memory._nvml_handle(nvml, 1) == 1


def test_a_clear_refs_write_that_leaves_vmhwm_high_is_reported_as_no_reset(tmp_path: Path) -> None:
    clear_refs, status = tmp_path / "clear_refs", tmp_path / "status"
    clear_refs.write_text("")
    status.write_text("VmHWM:\t 4000000 kB\nVmRSS:\t 1000000 kB\n")  # the write was accepted and ignored
    assert memory.reset_host_rss_peak(status, clear_refs) is False
    status.write_text("VmHWM:\t 1000100 kB\nVmRSS:\t 1000000 kB\n")
    assert memory.reset_host_rss_peak(status, clear_refs) is True
    assert memory.reset_host_rss_peak(status, tmp_path / "missing" / "clear_refs") is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/clear_refs is Linux's")
def test_this_kernel_really_resets_vmhwm() -> None:
    ballast = bytearray(200 * MiB)  # lifts VmHWM, then goes
    del ballast
    assert memory.reset_host_rss_peak() is True
    assert memory.host_rss_peak_bytes() < memory.host_rss_bytes() + 8 * MiB


# --- the allocator's settings ----------------------------------------------------------------------------------


def test_the_allocator_setting_is_recorded_and_part_of_the_gpu_cache_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = TuneRequest.of(model="tiny-gpt2", gpu_type="a100-80gb", seq_len=64, out=str(tmp_path / "c.json"))
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    plain = TuneContext.build(request)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    expandable = TuneContext.build(request)
    assert plain.key != expandable.key and plain.answer_key != expandable.answer_key
    assert expandable.question()["allocator"] == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    cpu = _request(tmp_path)
    assert "allocator" not in TuneContext.build(cpu).question()  # the CPU backend has no CUDA allocator
    tracker = memory.MemoryTracker("cpu", 0)
    tracker.reset()
    assert tracker.metrics(0).host_peak_reset is not None
    gpu_rank = RankMetrics(0, allocator_settings={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    result = TrialResult.from_dict(TrialResult("ok", ranks=[gpu_rank]).to_dict())
    assert result.allocator_settings == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


# --- host memory you can state (item 4) ----------------------------------------------------------------------------


def test_host_memory_may_override_the_probe_on_a_probed_machine_and_the_report_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lent GPU machine's RAM may start small and grow with use: the probe's `available` would hold every offload
    candidate to a fraction of it, so the user's figure replaces it, said in the notes."""
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(FakeCard()))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    request = TuneRequest.of(model="tiny-gpt2", seq_len=64, host_memory="128", out=str(tmp_path / "c.json"))
    ctx = TuneContext.build(request)
    assert ctx.target.measured and ctx.target.host_ram_bytes == 128 * GiB
    assert any("host RAM per node 128" in note and "--host-memory" in note for note in ctx.notes)
    probed = TuneContext.build(TuneRequest.of(model="tiny-gpt2", seq_len=64, out=str(tmp_path / "c.json")))
    assert probed.target.measured and not any("--host-memory" in note for note in probed.notes)


def test_host_memory_still_refused_for_the_cpu_backend_in_one_line(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    done = run_cli("plan", "--model", "tiny-gpt2", "--device", "cpu", "--host-memory", "64")
    assert done.returncode == 2 and "--host-memory" in done.stderr and "Traceback" not in done.stderr

import sys

import pytest
from tests.fakes.devices import FakeCard, FakeNvml

from autotune.errors import UserError
from autotune.hardware import machine_probe as probe_module
from autotune.hardware.machine_probe import probe, probe_host, visible_selection
from autotune.hardware.target import resolve_target


def test_probe_without_gpu_reports_host() -> None:
    result = probe()
    assert result.host.ram_total_bytes > 0 and result.host.cpu_cores_logical >= 1
    assert result.gpus == [] or all(g.total_bytes > 0 for g in result.gpus)


def test_nvme_path_free_space(tmp_path) -> None:
    host = probe_host(str(tmp_path))
    assert host.nvme_free_bytes and host.nvme_free_bytes > 0


def test_nvme_path_must_be_a_writable_directory(tmp_path) -> None:
    with pytest.raises(UserError, match="not a directory"):
        probe_host(str(tmp_path / "missing"))
    file = tmp_path / "file"
    file.write_text("x")
    with pytest.raises(UserError, match="not a directory"):
        probe_host(str(file))


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, None), ("", []), ("1,0", [1, 0]), ("0,7,1", [0]), ("GPU-bbb", [1]), ("-1", [])],
)
def test_cuda_visible_devices_selection(value, expected) -> None:
    assert visible_selection(value, ["GPU-aaa", "GPU-bbb", "GPU-ccc"]) == expected


def _fake_pynvml(devices: list[tuple[str, int, int, tuple[int, int]]]) -> FakeNvml:
    """NVML over cards given as (name, total bytes, free bytes, compute capability), nothing running on them."""
    cards = [
        FakeCard(processes={}, total_bytes=total, driver_reserved_bytes=total - free, name=name, compute_capability=cc)
        for name, total, free, cc in devices
    ]
    return FakeNvml(*cards)


def test_nvml_probe_honours_cuda_visible_devices(monkeypatch) -> None:
    gib = 2**30
    fake = _fake_pynvml(
        [("NVIDIA H100 80GB HBM3", 80 * gib, 79 * gib, (9, 0)), ("Tesla V100-SXM2-16GB", 16 * gib, 15 * gib, (7, 0))]
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    gpus, driver, _ = probe_module.probe_gpus({"CUDA_VISIBLE_DEVICES": "1"})
    assert driver == "550.54" and len(gpus) == 1
    (gpu,) = gpus
    assert (gpu.index, gpu.physical_index, gpu.bf16, gpu.compute_capability) == (0, 1, False, "7.0")
    assert gpu.nvlink_active_links == 4 and gpu.pcie_generation == 5


def test_probed_target_uses_weakest_free_memory_and_profile_peaks(monkeypatch) -> None:
    gib = 2**30
    fake = _fake_pynvml(
        [("NVIDIA H100 80GB HBM3", 80 * gib, 70 * gib, (9, 0)), ("NVIDIA H100 80GB HBM3", 80 * gib, 60 * gib, (9, 0))]
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    target = resolve_target(probe(), gpus=None)
    assert target.measured and target.gpus_per_node == 2 and target.free_memory_bytes == 60 * gib
    assert target.gpu.peak_bf16_tflops and target.gpu.peak_bf16_tflops > 900  # matched the H100 SXM profile
    with pytest.raises(UserError, match="only 2 GPU"):
        resolve_target(probe(), gpus=8)


def test_planned_target_from_profile_or_memory() -> None:
    target = resolve_target(None, gpus=8, gpu_type="A100-80GB")
    assert not target.measured and target.world_size == 8 and target.free_memory_bytes == target.gpu.memory_bytes
    assert resolve_target(None, gpus=2, gpu_memory="24GiB").free_memory_bytes == 24 * 2**30
    with pytest.raises(UserError, match="did you mean"):
        resolve_target(None, gpus=8, gpu_type="a100-800gb")
    with pytest.raises(UserError, match="positive"):
        resolve_target(None, gpus=0, gpu_type="a100-80gb")
    with pytest.raises(UserError, match="no GPU visible"):
        resolve_target(None, gpus=1)


def test_native_bf16_read_from_cpu_flags() -> None:
    from autotune.hardware.machine_probe import cpu_has_native_bf16

    assert cpu_has_native_bf16("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n")
    assert cpu_has_native_bf16("flags\t\t: fpu sse2 amx_bf16 amx_tile\n")
    assert cpu_has_native_bf16("Features\t: fp asimd sve bf16 i8mm\n")  # arm64 (Neoverse V1/V2, Graviton3)
    assert not cpu_has_native_bf16("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f\n")  # Zen 3: no bf16 flag
    assert cpu_has_native_bf16("")  # unknown: torch's default, bf16 allowed


def test_cpu_tune_defaults_to_fp32_without_native_bf16(monkeypatch) -> None:
    from autotune.hardware import machine_probe as probe
    from autotune.request import context
    from autotune.request.tune_request import TuneRequest

    for native, expected in ((False, "fp32"), (True, "bf16")):
        monkeypatch.setattr(probe, "cpu_has_native_bf16", lambda native=native: native)
        ctx = context.TuneContext.build(TuneRequest.of(model="tiny-gpt2", device="cpu", memory_budget="2GiB"))
        assert ctx.precision == expected
        assert any("no native bf16" in note for note in ctx.notes) == (not native)
        explicit = TuneRequest.of(model="tiny-gpt2", device="cpu", memory_budget="2GiB", precision="bf16")
        assert context.TuneContext.build(explicit).precision == "bf16"

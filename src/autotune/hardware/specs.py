"""Accelerator specs from profiles/hardware, and the target a plan or tuning is sized for."""

from __future__ import annotations

import difflib
import json
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

from autotune.core.units import format_bytes
from autotune.errors import UserError
from autotune.infra.paths import profiles_dir


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    """One accelerator model, from a vendor spec sheet (profiles) or from a probe."""

    key: str
    name: str
    memory_bytes: int
    bf16: bool
    peak_bf16_tflops: float | None = None
    peak_fp16_tflops: float | None = None
    memory_bandwidth_gbs: float | None = None
    compute_capability: str | None = None
    source: str = ""

    def peak_tflops(self, precision: str) -> float | None:
        return self.peak_bf16_tflops if precision == "bf16" else self.peak_fp16_tflops


@dataclass(frozen=True)
class Target:
    """What a configuration must fit: per-GPU free memory, GPUs per node, nodes, host resources.

    `measured` is True when the numbers come from probing this machine, False when planned from a profile.
    """

    gpu: GpuSpec
    gpus_per_node: int
    nodes: int = 1
    free_memory_bytes: int = 0
    host_ram_bytes: int | None = None
    nvme_free_bytes: int | None = None
    measured: bool = False
    # RLIMIT_MEMLOCK per process where it binds (no CAP_IPC_LOCK; probe.LockedMemory), else None: no limit known
    memlock_bytes: int | None = None

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    def describe(self) -> str:
        if self.gpu.key == "cpu":
            return f"{self.world_size} CPU rank(s), {format_bytes(self.free_memory_bytes)} budget per rank"
        origin = "probed" if self.measured else "profile"
        return (
            f"{self.nodes}x{self.gpus_per_node} {self.gpu.name} "
            f"({format_bytes(self.free_memory_bytes)} free per GPU, {origin})"
        )

    def to_dict(self) -> dict:
        data = asdict(self)
        data["world_size"] = self.world_size
        return data


def _spec_from_file(path: Path) -> tuple[GpuSpec, list[str]]:
    raw = json.loads(path.read_text())
    spec = GpuSpec(
        key=raw["key"],
        name=raw["name"],
        memory_bytes=int(raw["memory_bytes"]),
        bf16=bool(raw["bf16"]),
        peak_bf16_tflops=raw.get("peak_dense_bf16_tflops"),
        peak_fp16_tflops=raw.get("peak_dense_fp16_tflops"),
        memory_bandwidth_gbs=raw.get("memory_bandwidth_gbs"),
        compute_capability=raw.get("compute_capability"),
        source=raw.get("source", ""),
    )
    return spec, [a.lower() for a in raw.get("aliases", [])]


@cache
def _load_catalog(directory: Path) -> dict[str, GpuSpec]:
    """Every key and alias, lower-cased, mapped to its spec."""
    catalog: dict[str, GpuSpec] = {}
    for path in sorted(directory.glob("*.json")):
        spec, aliases = _spec_from_file(path)
        for name in [spec.key.lower(), *aliases]:
            catalog[name] = spec
    return catalog


def gpu_catalog() -> dict[str, GpuSpec]:
    return _load_catalog(profiles_dir() / "hardware")


def gpu_types() -> list[GpuSpec]:
    """The distinct accelerator profiles, sorted by key."""
    return sorted({spec.key: spec for spec in gpu_catalog().values()}.values(), key=lambda s: s.key)


def _normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def ambiguous_matches(key: str) -> list[str]:
    """Profiles a bare part name could mean: `a100` is the 40 GB or the 80 GB card, `h100` SXM or PCIe.

    A name is ambiguous when it is not itself a profile key and two or more profile keys start with it."""
    keys = {spec.key for spec in gpu_types()}
    if key in keys:
        return []
    return sorted(k for k in keys if k.startswith(f"{key}-"))


def resolve_gpu_type(name: str) -> GpuSpec:
    catalog = gpu_catalog()
    key = _normalise(name)
    if len(choices := ambiguous_matches(key)) > 1:
        raise UserError(f"--gpu-type {name!r} is ambiguous: say which, one of {', '.join(choices)}")
    if key in catalog:
        return catalog[key]
    close = difflib.get_close_matches(key, list(catalog), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    known = ", ".join(s.key for s in gpu_types())
    raise UserError(f"unknown GPU type {name!r}{hint} (known: {known})")


def generic_gpu(memory_bytes: int, bf16: bool = True) -> GpuSpec:
    """A GPU known only by its memory size (--gpu-memory)."""
    return GpuSpec(key="custom", name=f"GPU with {format_bytes(memory_bytes)}", memory_bytes=memory_bytes, bf16=bf16)


def _model_numbers(name: str) -> set[str]:
    """Tokens that identify the part (a100, h100, 4090, l40s), not vendor words or sizes."""
    tokens = name.lower().replace("-", " ").split()
    return {t for t in tokens if any(c.isdigit() for c in t) and not t.endswith("gb")}


def match_probed_gpu(name: str, memory_bytes: int) -> GpuSpec | None:
    """Find the profile of a probed device by its NVML name and memory, for peak TFLOP/s and bandwidth."""
    probed_numbers = _model_numbers(name)
    matches = [
        spec
        for spec in gpu_types()
        if _model_numbers(spec.name) & probed_numbers
        and abs(spec.memory_bytes - memory_bytes) < 0.12 * spec.memory_bytes
    ]
    same_form = [s for s in matches if ("pcie" in name.lower()) == ("pcie" in s.name.lower())]
    found = same_form or matches
    return found[0] if found else None

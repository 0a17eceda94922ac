"""What this machine has: free GPU memory per device, host RAM and cores, NVMe space.

GPUs are read through NVML, which creates no CUDA context. Only when NVML cannot answer but a GPU
device node exists do we ask torch, and then in a subprocess, so the tuner itself never holds GPU memory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TypeVar

import psutil

from autotune.errors import UserError


@dataclass(frozen=True, kw_only=True)
class GpuInfo:
    index: int  # index as the job will see it (after CUDA_VISIBLE_DEVICES)
    physical_index: int | None
    name: str
    uuid: str | None
    total_bytes: int
    free_bytes: int
    compute_capability: str | None
    bf16: bool
    nvlink_active_links: int | None = None
    pcie_generation: int | None = None
    pcie_width: int | None = None
    source: str = "nvml"


CAP_IPC_LOCK = 14  # linux/capability.h: exempts mlock from RLIMIT_MEMLOCK
CGROUP_UNLIMITED = 1 << 62  # cgroup v1 writes "unlimited" as 9223372036854771712 (PAGE_COUNTER_MAX pages)


@dataclass(frozen=True)
class LockedMemory:
    """How much this process may lock and keep: RLIMIT_MEMLOCK (`ulimit -l`), whether CAP_IPC_LOCK lifts it, and
    the memory cgroup's limit (pinned pages are charged to the cgroup like any other; v2 memory.max, v1
    memory.limit_in_bytes). None means unlimited or unknown."""

    rlimit_bytes: int | None = None
    cap_ipc_lock: bool = False
    cgroup_limit_bytes: int | None = None

    @property
    def binding_bytes(self) -> int | None:
        """What mlock may lock per process here: the rlimit unless CAP_IPC_LOCK exempts us (man 2 mlock)."""
        return None if self.cap_ipc_lock else self.rlimit_bytes


def _effective_caps(status: str) -> int:
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def _cgroup_limit(proc_cgroup: str, root: Path) -> int | None:
    """This process's memory cgroup limit: v2 (`0::/path` -> memory.max), else v1 (`N:memory:/path`)."""
    candidates = []
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            candidates.append(root / path.lstrip("/") / "memory.max")
        elif "memory" in controllers.split(","):
            candidates += [root / "memory" / path.lstrip("/") / "memory.limit_in_bytes"]
            candidates += [root / "memory" / "memory.limit_in_bytes"]  # a container sees its own cgroup as root
    for limit_file in candidates:
        try:
            text = limit_file.read_text().strip()
        except OSError:
            continue
        if text == "max" or not text.isdigit() or int(text) >= CGROUP_UNLIMITED:
            return None
        return int(text)
    return None


def probe_locked_memory(proc: Path = Path("/proc/self"), cgroup_root: Path = Path("/sys/fs/cgroup")) -> LockedMemory:
    """RLIMIT_MEMLOCK, CAP_IPC_LOCK and the memory cgroup limit of this process (Linux; elsewhere: unknown)."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    try:
        caps = _effective_caps((proc / "status").read_text())
        cgroup = _cgroup_limit((proc / "cgroup").read_text(), cgroup_root)
    except (OSError, ValueError):
        caps, cgroup = 0, None
    return LockedMemory(
        rlimit_bytes=None if soft == resource.RLIM_INFINITY else int(soft),
        cap_ipc_lock=bool(caps >> CAP_IPC_LOCK & 1),
        cgroup_limit_bytes=cgroup,
    )


@dataclass(frozen=True)
class HostInfo:
    ram_total_bytes: int
    ram_available_bytes: int
    cpu_cores_logical: int
    cpu_cores_physical: int | None
    nvme_path: str | None = None
    nvme_free_bytes: int | None = None
    locked: LockedMemory = field(default_factory=LockedMemory)

    @property
    def usable_ram_bytes(self) -> int:
        """Available RAM, capped by the memory cgroup's limit (a container's 8 GiB on a 1 TiB host)."""
        limit = self.locked.cgroup_limit_bytes
        return self.ram_available_bytes if limit is None else min(self.ram_available_bytes, limit)


@dataclass(frozen=True)
class ProbeResult:
    gpus: list[GpuInfo]
    host: HostInfo
    driver_version: str | None = None
    cuda_visible_devices: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["gpu_count"] = self.gpu_count
        return data


def _bf16_from_capability(capability: str | None) -> bool:
    if not capability:
        return False
    major = int(capability.split(".")[0])
    return major >= 8


def visible_selection(env_value: str | None, uuids: list[str]) -> list[int] | None:
    """Physical indices selected by CUDA_VISIBLE_DEVICES (indices or UUID prefixes); None means all.

    CUDA stops at the first invalid entry; we do the same.
    """
    if env_value is None:
        return None
    selected: list[int] = []
    for token in [t.strip() for t in env_value.split(",") if t.strip()]:
        if token.lstrip("-").isdigit():
            index = int(token)
            if index < 0 or index >= len(uuids):
                break
            selected.append(index)
            continue
        matches = [i for i, u in enumerate(uuids) if u and (u == token or u.startswith(token))]
        if len(matches) != 1:
            break
        selected.append(matches[0])
    return selected


def _probe_nvml(visible: str | None) -> tuple[list[GpuInfo], str | None]:
    import pynvml

    pynvml.nvmlInit()
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
        count = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        uuids = [_text(pynvml.nvmlDeviceGetUUID(h)) for h in handles]
        selection = visible_selection(visible, uuids)
        physical = list(range(count)) if selection is None else selection
        gpus = [_nvml_device(pynvml, handles[p], index, p, uuid=uuids[p]) for index, p in enumerate(physical)]
        return gpus, driver
    finally:
        pynvml.nvmlShutdown()


_T = TypeVar("_T")


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _optional(call: Callable[..., _T], *args: object) -> _T | None:
    try:
        return call(*args)
    except Exception:
        return None


def _nvml_device(pynvml: ModuleType, handle: object, index: int, physical: int, uuid: str) -> GpuInfo:
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    capability = _optional(pynvml.nvmlDeviceGetCudaComputeCapability, handle)
    cc = f"{capability[0]}.{capability[1]}" if capability else None
    links = 0
    for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
        state = _optional(pynvml.nvmlDeviceGetNvLinkState, handle, link)
        if state is None:
            break
        links += int(state == pynvml.NVML_FEATURE_ENABLED)
    return GpuInfo(
        index=index,
        physical_index=physical,
        name=_text(pynvml.nvmlDeviceGetName(handle)),
        uuid=uuid,
        total_bytes=int(memory.total),
        free_bytes=int(memory.free),
        compute_capability=cc,
        bf16=_bf16_from_capability(cc),
        nvlink_active_links=links,
        pcie_generation=_optional(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, handle),
        pcie_width=_optional(pynvml.nvmlDeviceGetCurrPcieLinkWidth, handle),
    )


_TORCH_PROBE = """
import json, torch
out = []
if torch.cuda.is_available():
    for i in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(i)
        p = torch.cuda.get_device_properties(i)
        out.append(dict(index=i, name=p.name, total=total, free=free, cc=f"{p.major}.{p.minor}",
                        bf16=bool(torch.cuda.is_bf16_supported())))
print(json.dumps(out))
"""


def _probe_torch_subprocess(timeout_s: float = 120.0) -> list[GpuInfo]:
    """Ask torch in a child process; its CUDA context dies with the child."""
    done = subprocess.run(
        [sys.executable, "-c", _TORCH_PROBE], capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if done.returncode != 0:
        return []
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    return [
        GpuInfo(
            index=r["index"],
            physical_index=None,
            name=r["name"],
            uuid=None,
            total_bytes=r["total"],
            free_bytes=r["free"],
            compute_capability=r["cc"],
            bf16=r["bf16"],
            source="torch-subprocess",
        )
        for r in rows
    ]


def _gpu_device_nodes_present() -> bool:
    return Path("/dev/nvidia0").exists() or Path("/dev/kfd").exists()


def probe_nvme(path: str) -> int:
    """Free bytes at an NVMe swap directory, which must exist and be writable."""
    target = Path(path)
    if not target.is_dir():
        raise UserError(f"--nvme-path {path!r} is not a directory")
    try:  # a real write, since os.access says yes to root even on read-only mounts
        with tempfile.TemporaryFile(dir=target):
            pass
    except OSError:
        raise UserError(f"--nvme-path {path!r} is not writable") from None
    return shutil.disk_usage(target).free


# CPU flags meaning the cores compute in bf16 natively (Linux /proc/cpuinfo names): x86 AVX512-BF16 and AMX-BF16,
# arm64 "bf16" (FEAT_BF16). Without them torch emulates bf16 matmuls: on this project's AMD EPYC (Zen 3) CI machine one
# DeepSpeed step of gpt2-small-demo at micro-batch 8 took 18 s in bf16 and 1.3 s in fp32 (docs/quick-start.md).
_NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this host's CPU computes bf16 natively; unknown (no /proc/cpuinfo) counts as yes, torch's default."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return True
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            return bool(_NATIVE_BF16_FLAGS & set(value.split()))
    return True


def probe_host(nvme_path: str | None = None) -> HostInfo:
    memory = psutil.virtual_memory()
    return HostInfo(
        ram_total_bytes=int(memory.total),
        ram_available_bytes=int(memory.available),
        cpu_cores_logical=psutil.cpu_count(logical=True) or os.cpu_count() or 1,
        cpu_cores_physical=psutil.cpu_count(logical=False),
        nvme_path=str(Path(nvme_path).resolve()) if nvme_path else None,
        nvme_free_bytes=probe_nvme(nvme_path) if nvme_path else None,
        locked=probe_locked_memory(),
    )


def probe_gpus(environ: dict[str, str] | None = None) -> tuple[list[GpuInfo], str | None, list[str]]:
    env = os.environ if environ is None else environ
    visible = env.get("CUDA_VISIBLE_DEVICES")
    notes: list[str] = []
    try:
        gpus, driver = _probe_nvml(visible)
        return gpus, driver, notes
    except Exception as error:  # NVML missing or no driver: not an error for planning
        notes.append(f"NVML unavailable: {type(error).__name__}: {error}".strip())
    if _gpu_device_nodes_present():
        gpus = _probe_torch_subprocess()
        if gpus:
            notes.append("GPU memory read by torch.cuda.mem_get_info in a subprocess")
        return gpus, None, notes
    return [], None, notes


def probe(nvme_path: str | None = None) -> ProbeResult:
    host = probe_host(nvme_path)
    gpus, driver, notes = probe_gpus()
    return ProbeResult(
        gpus=gpus,
        host=host,
        driver_version=driver,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        notes=notes,
    )

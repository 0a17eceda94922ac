"""Provenance for every figure: the machine, library versions, date, and how busy the machine was.

The CPU host is shared (other people's processes run beside the benchmark), so the load average is
sampled around each phase: a slow phase under load says more about the load than about the tuner.
"""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import psutil

LIBRARIES = ("autotune", "torch", "deepspeed", "transformers", "accelerate", "tabulate", "matplotlib")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_names() -> list[str]:
    """Through NVML, not torch: a CUDA context in the parent would hold memory the trials then lack."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return [
            pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(pynvml.nvmlDeviceGetCount())
        ]
    except Exception:  # no driver, no NVML: the variant then fails in its trials, with their error
        return []


def gpu_total_bytes(index: int = 0) -> int:
    """Card size for turning an emulated card (e.g. 24 GB) into a memory fraction; NVML, no CUDA context."""
    import pynvml

    pynvml.nvmlInit()
    return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).total)


def machine(device: str) -> dict:
    memory = psutil.virtual_memory()
    return {
        "hostname": platform.node(),
        "os": platform.platform(),
        "cpu_model": cpu_model(),
        "logical_cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "ram_bytes": memory.total,
        "ram_available_bytes_at_start": memory.available,
        "gpus": gpu_names() if device == "cuda" else [],
    }


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def git_revision(repo: Path) -> dict[str, str | bool | None]:
    """The commit the benchmark ran from, and whether the working tree had uncommitted changes."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    status = git("status", "--porcelain")
    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(status) if status is not None else None}


def now_utc() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def load_average() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def busy_processes(limit: int = 5) -> list[dict]:
    """The other processes using the CPU right now (names only), to explain a noisy phase."""
    processes = list(psutil.process_iter(["pid", "name", "cpu_percent"]))
    for process in processes:
        try:
            process.cpu_percent(None)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    psutil.cpu_percent(0.5)
    busy = []
    for process in processes:
        try:
            busy.append({"name": process.name(), "cpu_percent": process.cpu_percent(None)})
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    busy.sort(key=lambda item: item["cpu_percent"], reverse=True)
    return [item for item in busy[:limit] if item["cpu_percent"] > 5]

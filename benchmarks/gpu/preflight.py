"""The lease's preflight items (benchmarks/gpu/lease.sh), each recorded in one JSON the moment it is known.

    python3 benchmarks/gpu/preflight.py --out OUT/lease.json versions|headers|probe|pinned
    python3 benchmarks/gpu/preflight.py --out SCRATCH/op-cpu_adam.json op CPUAdamBuilder --device cuda
    python3 benchmarks/gpu/preflight.py --out OUT/lease.json merge ops SCRATCH/op-*.json
    python3 benchmarks/gpu/preflight.py --out OUT/lease.json stage memory 0 123.4 200
    python3 benchmarks/gpu/preflight.py cpath            # the CUDA include dirs pip's nvidia-* packages carry
    python3 benchmarks/gpu/preflight.py --out OUT/lease.json cuda-libs LINKS   # libcudart/curand/cublas, linked
    python3 benchmarks/gpu/preflight.py cpu-stamp        # CPU model + flags hash: carried ops match it or are rebuilt

Every item writes under its own key of --out (read, update, temp file, rename), so a command cut off by the
device's time limit still brings back what was finished. One JSON for all of them: the device tool brings
back at most 8 files from $OUT.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "src"))  # before the install stage has put it on PYTHONPATH

from autotune.infra.atomic import atomic_write_json  # noqa: E402

# What a trial imports or the wheel set carries: their versions say which code ran.
PACKAGES = (
    "torch", "deepspeed", "transformers", "huggingface-hub", "tokenizers", "safetensors", "accelerate", "peft",
    "pydantic", "pydantic-core", "typing-extensions", "annotated-types", "typing-inspection", "hjson",
    "py-cpuinfo", "msgpack", "einops", "ninja", "numpy", "psutil", "nvidia-ml-py", "typer", "rich",
    "nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime",
)  # fmt: skip
NVIDIA_SMI_FIELDS = "name,memory.total,memory.used,driver_version,compute_cap"
ENV_PREFIXES = ("CUDA", "NCCL", "TORCH", "PYTORCH", "DS_", "NVIDIA", "LD_LIBRARY_PATH", "CPATH", "PATH", "MAX_JOBS")
# Headers DeepSpeed's CUDA ops include: a toolkit without the cuBLAS/cuSPARSE/cuRAND headers builds cpu_adam
# but fails on fused_adam (torch's ATen/cuda headers pull them in).
CUDA_HEADERS = ("cuda_runtime.h", "cuda_fp16.h", "cuda_bf16.h", "cublas_v2.h", "cusparse.h", "curand.h")


def record(out: Path, key: str, value: object) -> None:
    data = json.loads(out.read_text()) if out.exists() else {}
    data[key] = value
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out, data)


def _run(command: list[str], timeout: float = 60) -> dict:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        return {"exit": done.returncode, "stdout": done.stdout[-4000:], "stderr": done.stderr[-2000:]}
    except (OSError, subprocess.TimeoutExpired) as error:
        return {"error": str(error)}


def versions() -> dict:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    info: dict = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),  # stated beside every timing (the project's rule)
        "packages": found,
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
        "nvcc": _run(["nvcc", "--version"]),
        "nvidia_smi": _run(["nvidia-smi", f"--query-gpu={NVIDIA_SMI_FIELDS}", "--format=csv"]),
        "memlock": _run(["bash", "-c", "ulimit -l"]),
        "dev_shm": _run(["df", "-B1", "/dev/shm"]),
        "meminfo": Path("/proc/meminfo").read_text().splitlines()[:5] if Path("/proc/meminfo").exists() else None,
    }
    try:
        import torch

        info["torch_cuda"] = torch.version.cuda
        info["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            free, total = torch.cuda.mem_get_info(0)
            info["device"] = {
                "name": torch.cuda.get_device_name(0),
                "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
                "cuda_free_bytes": free,
                "cuda_total_bytes": total,  # the base of set_per_process_memory_fraction (trial/worker/memory.py)
                "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            }
    except Exception as error:  # recorded: the rest of the lease says what it can
        info["torch_error"] = f"{type(error).__name__}: {error}"
    return info


def nvidia_include_dirs() -> list[str]:
    """Include dirs of pip's nvidia-* packages (nvidia/<lib>/include): the headers a partial toolkit lacks."""
    dirs: list[str] = []
    for entry in sys.path:
        base = Path(entry or ".") / "nvidia"
        if base.is_dir():
            dirs += sorted(str(d) for d in base.glob("*/include") if d.is_dir())
    return list(dict.fromkeys(dirs))


def headers() -> dict:
    try:
        from torch.utils.cpp_extension import CUDA_HOME
    except Exception as error:
        return {"error": f"{type(error).__name__}: {error}"}
    toolkit = Path(CUDA_HOME) / "include" if CUDA_HOME else None
    extra = nvidia_include_dirs()
    where = {}
    for header in CUDA_HEADERS:
        places = [str(d) for d in ([toolkit] if toolkit else []) + [Path(x) for x in extra] if (d / header).exists()]
        where[header] = places
    return {"cuda_home": CUDA_HOME, "found": where, "nvidia_pip_include_dirs": extra}


# Libraries DeepSpeed's CUDA ops link by their unversioned names: fused_adam `-lcudart`, cpu_adam `-lcurand` (DeepSpeed
# 0.19.8 op_builder/builder.py:931-939, CUDAOpBuilder.cxx_args/extra_ldflags), cuBLAS through torch's ATen headers.
# pip's nvidia-* wheels ship only versioned `.so.N` files, so a toolkit made of them fails at link time.
CUDA_LIBS = ("cudart", "curand", "cublas")


def library_dirs() -> list[Path]:
    """Where a toolkit or pip's nvidia-* packages keep CUDA libraries: CUDA_HOME's lib64 and targets, nvidia/*/lib."""
    dirs: list[Path] = []
    try:
        from torch.utils.cpp_extension import CUDA_HOME
    except Exception:
        CUDA_HOME = None
    if CUDA_HOME:
        dirs += [Path(CUDA_HOME) / "lib64", Path(CUDA_HOME) / "lib", *Path(CUDA_HOME).glob("targets/*/lib")]
    for entry in sys.path:
        base = Path(entry or ".") / "nvidia"
        if base.is_dir():
            dirs += sorted(d for d in base.glob("*/lib") if d.is_dir())
    return [d for d in dict.fromkeys(dirs) if d.is_dir()]


def cuda_libs(links: Path) -> dict:
    """Each of CUDA_LIBS: its unversioned .so where one exists, else a link made in `links` to its versioned file
    (lib<name>.so.N), so `-l<name>` resolves with `links` on LIBRARY_PATH; missing ones are named."""
    links.mkdir(parents=True, exist_ok=True)
    found: dict = {}
    dirs = library_dirs()
    for name in CUDA_LIBS:
        plain = [d / f"lib{name}.so" for d in dirs if (d / f"lib{name}.so").exists()]
        if plain:
            found[name] = {"so": str(plain[0])}
            continue
        versioned = sorted(f for d in dirs for f in d.glob(f"lib{name}.so.*") if f.is_file())
        if not versioned:
            found[name] = {"missing": True}
            continue
        link = links / f"lib{name}.so"
        link.unlink(missing_ok=True)
        link.symlink_to(versioned[0])
        found[name] = {"linked": str(versioned[0])}
    return {"dirs": [str(d) for d in dirs], "libs": found, "links": str(links)}


def cpu_stamp() -> str:
    """The build host's CPU model and flags, hashed: cpu_adam is compiled for them (-march=native), so carried ops
    are reused only on a machine whose stamp matches (lease.sh)."""
    import hashlib

    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else platform.processor()
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "")
    flags = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("flags")), "")
    return f"{model} | flags {hashlib.sha256(flags.encode()).hexdigest()[:16]}"


def build_op(builder: str, device: str) -> dict:
    """Load (JIT-building if needed) one DeepSpeed op in this process: lease.sh runs two at once."""
    from autotune.infra.environment import select_accelerator

    select_accelerator(device)
    from deepspeed.accelerator import get_accelerator

    started = time.perf_counter()
    try:
        get_accelerator().create_op_builder(builder).load()
        return {"seconds": round(time.perf_counter() - started, 1)}
    except Exception as error:
        lines = [line for line in str(error).splitlines() if line.strip()]
        return {"error": f"{type(error).__name__}: {' | '.join(lines[-5:])}"[-1500:], "seconds": None}


def pinned() -> dict:
    done = _run([sys.executable, str(HERE / "pinned_probe.py")], timeout=300)
    lines = done.get("stdout", "").strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        return done


def probe() -> dict:
    done = _run([sys.executable, "-m", "autotune", "probe", "--json"], timeout=120)
    try:
        return json.loads(done.get("stdout", ""))
    except ValueError:
        return done


def merge(files: list[Path]) -> dict:
    merged = {}
    for file in files:
        name = re.sub(r"^op-|\.json$", "", file.name)
        try:
            merged[name] = json.loads(file.read_text())
        except (OSError, ValueError) as error:
            merged[name] = {"error": f"no result: {error}"}
    return merged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="the JSON to record in")
    parser.add_argument(
        "item",
        choices=("versions", "headers", "probe", "pinned", "op", "merge", "stage", "cpath", "cuda-libs", "cpu-stamp"),
    )
    parser.add_argument("args", nargs="*")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    if args.item == "cpath":
        print(":".join(nvidia_include_dirs()))
        return 0
    if args.item == "cpu-stamp":
        print(cpu_stamp())
        return 0
    if args.item == "cuda-libs":  # record what was found and made; print the dirs for LIBRARY_PATH
        found = cuda_libs(Path(args.args[0]))
        if args.out is not None:
            record(args.out, "cuda_libs", found)
        print(":".join([found["links"], *found["dirs"]]))
        return 0
    if args.out is None:
        parser.error("--out is needed")
    if args.item == "op":
        atomic_write_json(args.out, {"builder": args.args[0], **build_op(args.args[0], args.device)})
    elif args.item == "merge":
        record(args.out, args.args[0], merge([Path(f) for f in args.args[1:]]))
    elif args.item == "stage":
        name, code, wall, limit = args.args
        data = json.loads(args.out.read_text()) if args.out.exists() else {}
        stages = {**data.get("stages", {}), name: {"exit": int(code), "wall_s": float(wall), "limit_s": float(limit),
                                                     "timed_out": int(code) in (124, 137)}}  # fmt: skip
        record(args.out, "stages", stages)
    else:
        started = time.monotonic()
        value = {"versions": versions, "headers": headers, "probe": probe, "pinned": pinned}[args.item]()
        record(args.out, args.item, {"wall_s": round(time.monotonic() - started, 1), **value})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Wall time of `autotune plan` as a user sees it: a new CLI process, cold and warm model-summary cache.

    python benchmarks/plan_latency.py [--repeats 3] [--out benchmarks/results/plan_latency.json]

Cold: an empty AUTOTUNE_CACHE_DIR, so the model summary is built from a meta-device model (imports torch and
transformers). Warm: the summary is cached, and `plan` imports neither torch, transformers nor DeepSpeed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

MODELS = ("llama-2-7b", "llama-2-13b", "llama-2-70b")
PLAN_ARGS = ("--gpus", "8", "--gpu-type", "a100-80gb", "--json")
TARGET_S = 5.0


def _cli_wall_s(args: list[str], cache_dir: Path) -> float:
    env = {**os.environ, "AUTOTUNE_CACHE_DIR": str(cache_dir)}
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "autotune", *args], capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"autotune {' '.join(args)} failed: {result.stderr.strip()}")
    return elapsed


def measure(model: str, repeats: int) -> dict:
    cold, warm = [], []
    args = ["plan", "--model", model, *PLAN_ARGS]
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="autotune-latency-") as directory:
            cold.append(_cli_wall_s(args, Path(directory)))
            warm.append(_cli_wall_s(args, Path(directory)))
    return {
        "model": model,
        "cold_s": {"median": round(statistics.median(cold), 2), "min": round(min(cold), 2), "runs": cold},
        "warm_s": {"median": round(statistics.median(warm), 2), "min": round(min(warm), 2), "runs": warm},
    }


def _import_s(module: str, repeats: int) -> float:
    """Median wall time of a fresh interpreter that only imports `module` (the floor under every CLI call)."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-c", f"import {module}"], check=True, env={**os.environ, "DS_ACCELERATOR": "cpu"}
        )
        times.append(time.perf_counter() - started)
    return round(statistics.median(times), 2)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "plan_latency.json")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    rows = []
    for model in MODELS:
        row = measure(model, args.repeats)
        rows.append(row)
        print(f"{model:12s} cold {row['cold_s']['median']:5.2f} s   warm {row['warm_s']['median']:5.2f} s", flush=True)
    data = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        # the dev machine is shared: a load above the core count stretches every figure below
        "load_average_1_5_15": {"before": load_before, "after": os.getloadavg()},
        "versions": {p: metadata.version(p) for p in ("torch", "deepspeed", "transformers", "typer", "autotune")}
        | {"python": platform.python_version()},
        "command": f"autotune plan --model M {' '.join(PLAN_ARGS)}",
        "target_s": TARGET_S,
        "import_floor_s": {
            m: _import_s(m, args.repeats) for m in ("autotune.cli", "torch", "transformers", "deepspeed")
        },
        "rows": rows,
        "within_target": {
            "warm": all(r["warm_s"]["median"] < TARGET_S for r in rows),
            "cold": all(r["cold_s"]["median"] < TARGET_S for r in rows),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""Synthetic trials vs the user's own script (own-command mode), same model, same options, one run each.

    python benchmarks/own_script_vs_synthetic.py --out benchmarks/results/own_script_cpu.json

Both tunes go through the real CLI with --no-cache. The own-script tune runs
tests/scripts/user_jobs/plain_deepspeed.py (a plain DeepSpeed loop on random tokens) on the model in
tests/scripts/user_jobs/tiny-gpt2 unless --model-dir says otherwise. Recorded per mode: the choice, its
measured speed and peak, every trial (status, peak, prediction, samples/s, metric source), trials launched
and wall time. Speed figures are not the same measurement: synthetic trials report the median wall-clock
step of our worker, own-script trials DeepSpeed's engine metric (see src/autotune/trial/own_command/script.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from portable_paths import portable  # benchmarks/ is the script's directory

REPO = Path(__file__).resolve().parents[1]
JOBS = REPO / "tests" / "scripts" / "user_jobs"


def _tune(options: list[str], out_dir: Path, command: list[str] | None) -> dict:
    argv = [sys.executable, "-m", "autotune", *options, "--no-cache", "--json", "-o", str(out_dir / "ds_config.json")]
    if command:
        argv += ["--", *command]
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "DS_ACCELERATOR": "cpu"})
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        return {"error": done.stderr[-2000:], "wall_s": elapsed}
    report = json.loads(done.stdout)
    trials = [
        {
            "candidate": t["candidate"],
            "status": t["result"]["status"],
            "error": t["result"]["error"],
            "peak_bytes": max((r.get("host_rss_peak_bytes") or 0 for r in t["result"]["ranks"]), default=None),
            "predicted_peak_bytes": t["predicted_peak_bytes"],
            "samples_per_s": t["result"]["samples_per_s"],
            "metric_source": t["result"].get("metric_source") or "autotune worker (median wall-clock step)",
            "wall_s": t["result"]["wall_s"],
        }
        for t in report["trials"]
    ]
    return {"choice": report["choice"], "trials": trials, "trials_launched": report["trials_launched"],
            "stop_reason": report["stop_reason"], "wall_s": elapsed}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model-dir", type=Path, default=JOBS / "tiny-gpt2")
    parser.add_argument("--memory-budget", default="1GiB")
    parser.add_argument("--seq-len", default="128")
    parser.add_argument("--micro-batches", default="4,16,64")
    parser.add_argument("--max-trials", default="6")
    args = parser.parse_args()
    options = [
        "--model",
        str(args.model_dir),
        "--gpus",
        "1",
        "--device",
        "cpu",
        "--memory-budget",
        args.memory_budget,
        "--seq-len",
        args.seq_len,
        "--micro-batches",
        args.micro_batches,
        "--max-trials",
        args.max_trials,
    ]
    command = [
        sys.executable,
        str(JOBS / "plain_deepspeed.py"),
        "--deepspeed_config",
        "{ds_config}",
        "--model-config",
        str(args.model_dir),
        "--seq-len",
        "{seq_len}",
        "--gradient-checkpointing",
        "{grad_checkpointing}",
    ]
    work = Path(tempfile.mkdtemp(prefix="own-script-bench-"))  # configs and reports; the JSON keeps what matters
    results = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_avg_start": os.getloadavg()},
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "options": options,
        "command": command,
        "synthetic": _tune(options, work / "synthetic", None),
        "own_script": _tune(options, work / "own", command),
    }
    results["machine"]["load_avg_end"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(portable(results), indent=2) + "\n")
    print(json.dumps({k: results[k].get("choice") for k in ("synthetic", "own_script")}, indent=2))


if __name__ == "__main__":
    main()

"""Does the README demo pick the same config run after run, or say it is a tie? Quiet and under a synthetic CPU load.

    python benchmarks/pick_stability.py [--runs N] [--out FILE.json] [--deadline-utc HH:MM]

Runs the README quick start's tune (`autotune --model gpt2-small-demo --device cpu --memory-budget 2GiB --seq-len
128 --precision fp32`, no results cache) N times per arm, the arms alternating (quiet, loaded, quiet, ...) so the
shared machine's drift hits both alike. The loaded arm adds one busy-looping process per core for the whole run.
Each run records the pick, its speed with spread, the runner-up, whether it was a tie, the trial count, wall time
and the load average (`uptime`) before and after. A run is *consistent* when its pick is the arm's most common
pick, or when it declared a tie that names that pick. Written after every run (temp file + rename), so a run cut
short by --deadline-utc still leaves its results.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from autotune.atomic import atomic_write_json

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "pick_stability_cpu.json"
DEMO = ["--model", "gpt2-small-demo", "--device", "cpu", "--memory-budget", "2GiB", "--seq-len", "128",
        "--precision", "fp32", "--no-cache"]  # fmt: skip


def _spin() -> None:
    while True:
        pass


def _text(output: bytes | str | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def _key(candidate: dict | None) -> str | None:
    if not candidate:
        return None
    from autotune.ladder import Candidate

    return Candidate.from_dict(candidate).key


def run_demo(loaded: bool, timeout_s: float) -> dict:
    """One fresh demo run (its own output directory), with the synthetic load around it when asked."""
    spinners = []
    if loaded:
        spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(os.cpu_count() or 1)]
        for spinner in spinners:
            spinner.start()
    before, started = _uptime(), time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="pick-stability-") as scratch:
            out = Path(scratch) / "ds_config.json"
            command = [sys.executable, "-m", "autotune", *DEMO, "--out", str(out)]
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
                code, tail = done.returncode, done.stdout[-2000:] + done.stderr[-2000:]
            except subprocess.TimeoutExpired as expired:  # keep its progress lines: where did the time go
                code, tail = None, f"timed out after {timeout_s:.0f} s: " + _text(expired.stderr)[-3000:]
            report_path = Path(scratch) / "autotune-report.json"
            report = json.loads(report_path.read_text()) if report_path.exists() else {}
    finally:
        for spinner in spinners:
            spinner.terminate()
            spinner.join()
    verdict = report.get("verdict") or {}
    return {
        "loaded": loaded,
        "exit_code": code,
        "pick": _key(report.get("choice")),
        "speed": verdict.get("speed"),
        "runner_up": _key(verdict.get("runner_up")),
        "runner_up_speed": verdict.get("runner_up_speed"),
        "tie": verdict.get("tie"),
        "margin": verdict.get("margin"),
        "spread": verdict.get("spread"),
        "remeasured": verdict.get("remeasured"),
        "trials_launched": report.get("trials_launched"),
        "wall_s": round(time.monotonic() - started, 1),
        "uptime_before": before,
        "uptime_after": _uptime(),
        "tail": None if code == 0 else tail,
    }


def consistency(runs: list[dict]) -> dict:
    """Per arm: the most common pick, and how many runs picked it or declared a tie naming it."""
    picks = collections.Counter(r["pick"] for r in runs if r["pick"])
    if not picks:
        return {"runs": len(runs), "modal_pick": None, "same": 0, "tie_naming_it": 0, "consistent": 0}
    modal = picks.most_common(1)[0][0]
    same = sum(r["pick"] == modal for r in runs)
    tie = sum(r["pick"] != modal and bool(r["tie"]) and r["runner_up"] == modal for r in runs)
    return {"runs": len(runs), "modal_pick": modal, "same": same, "tie_naming_it": tie, "consistent": same + tie,
            "picks": dict(picks)}  # fmt: skip


def summarize(runs: list[dict]) -> dict:
    return {arm: consistency([r for r in runs if r["loaded"] is loaded]) for arm, loaded in (("quiet", False),
                                                                                              ("loaded", True))}


def _past(deadline: str | None) -> bool:
    if not deadline:
        return False
    hour, minute = (int(part) for part in deadline.split(":"))
    now = datetime.now(timezone.utc)
    return (now.hour, now.minute) >= (hour, minute)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per arm")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per demo run")
    parser.add_argument("--deadline-utc", default=None, help="HH:MM: start no run after this")
    args = parser.parse_args()
    from compare.environment import git_revision, now_utc  # benchmarks/ is the script's directory
    from estimate_accuracy import environment

    data: dict = {
        "environment": {**environment("cpu"), "revision": git_revision(HERE.parent), "started": now_utc()},
        "command": "autotune " + " ".join(DEMO),
        "runs": [],
    }
    for index in range(2 * args.runs):
        if _past(args.deadline_utc):
            data["cut_short"] = f"deadline {args.deadline_utc} UTC reached after {index} runs"
            break
        data["runs"].append(run_demo(loaded=index % 2 == 1, timeout_s=args.timeout))
        data["summary"] = summarize(data["runs"])
        atomic_write_json(args.out, data)
        print(json.dumps({k: data["runs"][-1][k] for k in ("loaded", "pick", "tie", "runner_up", "wall_s")}),
              flush=True)  # fmt: skip
    data["summary"] = summarize(data["runs"])
    atomic_write_json(args.out, data)
    print(json.dumps(data["summary"], indent=1))


if __name__ == "__main__":
    main()

"""Does the README demo pick the same config run after run, or say it is a tie? Quiet or under a synthetic CPU load.

    python benchmarks/pick_stability.py --runs 5 --load cpu     # one busy-looping process per core, whole run
    python benchmarks/pick_stability.py --runs 5 --load none    # the quiet set (a machine nobody else uses)

Runs the README quick start's tune (its `autotune ...` command, read from README.md as benchmarks/quick_start.py
reads it, plus `--no-cache` and a fresh `--out` per run) N times. Each run records the pick, its speed with the 95%
interval, the runner-up, tie or decided, the trials (candidate, status, steps, wall seconds: where the time went),
wall time, `uptime` before and after and the 1-minute load average sampled during the run. A run is *consistent*
when its pick is the set's most common pick, or when it declared a tie that names that pick. One line per run is
printed as it ends, and the per-run verdicts at the end. The JSON is written after every run (temp file + rename),
so a set cut short by --deadline-utc still leaves its results.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from autotune.infra.atomic import atomic_write_json

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
LOAD_SAMPLE_S = 15.0  # how often the 1-minute load average is read during a run


def demo_argv(readme: Path) -> list[str]:
    """The README demo's autotune arguments (after `autotune`, before our --no-cache/--out)."""
    from quick_start import readme_command  # benchmarks/ is the script's directory

    demo = readme_command(readme).split(" && ")[-1]
    words = shlex.split(demo)
    if words[0] != "autotune":
        raise SystemExit(f"README quick start's last command is not autotune: {demo}")
    drop = {"--out"}  # every run writes its own
    kept, skip = [], False
    for word in words[1:]:
        if skip:
            skip = False
        elif word in drop:
            skip = True
        else:
            kept.append(word)
    return [*kept, "--no-cache"]


def _spin() -> None:
    while True:
        pass


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


class LoadSampler:
    """The 1-minute load average every LOAD_SAMPLE_S seconds while a run goes on, in a thread."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while True:
            self.samples.append(round(os.getloadavg()[0], 2))
            if self._stop.wait(LOAD_SAMPLE_S):
                return

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _key(candidate: dict | None) -> str | None:
    if not candidate:
        return None
    from autotune.core.ladder import Candidate

    return Candidate.from_dict(candidate).key


def _trials(report: dict) -> list[dict]:
    """Per trial: what ran, how it ended, how many steps its figure is from and how long it took."""
    rows = []
    for trial in report.get("trials") or []:
        result = trial.get("result") or {}
        rows.append({
            "candidate": _key(trial.get("candidate")),
            "status": result.get("status"),
            "steps": len(result.get("step_times_s") or []),
            "samples_per_s": result.get("samples_per_s"),
            "wall_s": result.get("wall_s"),
        })  # fmt: skip
    return rows


def run_demo(argv: list[str], loaded: bool, timeout_s: float) -> dict:
    """One fresh demo run (its own output directory), with the synthetic load around it when asked."""
    spinners = []
    before = _uptime()  # before our own load starts: what the machine was doing
    if loaded:
        spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(os.cpu_count() or 1)]
        for spinner in spinners:
            spinner.start()
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="pick-stability-") as scratch, LoadSampler() as load:
            command = [sys.executable, "-m", "autotune", *argv, "--out", str(Path(scratch) / "ds_config.json")]
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
                code, tail = done.returncode, done.stdout[-2000:] + done.stderr[-2000:]
            except subprocess.TimeoutExpired as expired:  # keep its progress lines: where did the time go
                stderr = expired.stderr.decode(errors="replace") if isinstance(expired.stderr, bytes) else ""
                code, tail = None, f"timed out after {timeout_s:.0f} s: " + (stderr or "")[-3000:]
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
        "trials": _trials(report),
        "wall_s": round(time.monotonic() - started, 1),
        "uptime_before": before,
        "uptime_after": _uptime(),
        "load_1min_during": load.samples,
        "tail": None if code == 0 else tail,
    }


def consistency(runs: list[dict]) -> dict:
    """The most common pick, and how many runs picked it or declared a tie naming it."""
    picks = collections.Counter(r["pick"] for r in runs if r["pick"])
    if not picks:
        return {"runs": len(runs), "modal_pick": None, "same": 0, "tie_naming_it": 0, "consistent": 0}
    modal = picks.most_common(1)[0][0]
    same = sum(r["pick"] == modal for r in runs)
    tie = sum(r["pick"] != modal and bool(r["tie"]) and r["runner_up"] == modal for r in runs)
    return {"runs": len(runs), "modal_pick": modal, "same": same, "tie_naming_it": tie, "consistent": same + tie,
            "picks": dict(picks)}  # fmt: skip


def agreement(run: dict, modal: str | None) -> str:
    """'same' (the modal pick), 'tie naming it' (another pick, declared a tie with the modal one), 'other', or
    'failed' (no pick)."""
    if not run["pick"]:
        return "failed"
    if run["pick"] == modal:
        return "same"
    return "tie naming it" if run["tie"] and run["runner_up"] == modal else "other"


def _interval(speed: dict | None) -> str:
    if not speed:
        return "-"
    low, high = speed["interval"]
    return f"{speed['samples_per_s']:.2f} ({low:.2f}-{high:.2f}, {speed['steps']} steps)"


def run_line(index: int, run: dict, modal: str | None = None) -> str:
    """One line per run: pick and its interval, tie or decided (and against what), agreement, wall time, load."""
    decided = "tie with" if run["tie"] else "beats"
    versus = f"{decided} {run['runner_up']} {_interval(run['runner_up_speed'])}" if run["runner_up"] else "alone"
    verdict = f"; {agreement(run, modal)}" if modal is not None else ""
    load = run["load_1min_during"]
    loads = f"load {min(load):.1f}-{max(load):.1f}" if load else "load ?"
    return (
        f"run {index + 1}: {run['pick'] or 'no pick (exit ' + str(run['exit_code']) + ')'} {_interval(run['speed'])}"
        f" {versus}{verdict}; {run['trials_launched']} trials, {run['wall_s']:.0f} s, {loads}"
    )


def markdown_table(data: dict) -> str:
    """The per-run table benchmarks/README.md carries, from the JSON (`--table FILE` prints it again)."""
    modal = (data.get("summary") or {}).get("modal_pick")
    rows = [
        "| run | pick | samples/s (95% interval, steps) | runner-up | decided | vs. modal pick | trials | wall | load"
        " before / during / after |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for index, run in enumerate(data["runs"]):
        load = run.get("load_1min_during") or []
        during = f"{min(load):.1f}-{max(load):.1f}" if load else "?"
        before, after = (run[key].rsplit("load average:", 1)[-1].split(",")[0].strip() for key in
                         ("uptime_before", "uptime_after"))  # fmt: skip
        decided = "tie" if run["tie"] else ("beyond spread" if run["runner_up"] else "-")
        rows.append(
            f"| {index + 1} | {run['pick'] or 'none'} | {_interval(run['speed'])} | {run['runner_up'] or '-'}"
            f" {_interval(run['runner_up_speed']) if run['runner_up'] else ''} | {decided}"
            f"{' (re-measured)' if run.get('remeasured') else ''} | {agreement(run, modal)} |"
            f" {run['trials_launched']} | {run['wall_s']:.0f} s | {before} / {during} / {after} |"
        )
    return "\n".join(rows)


def _past(deadline: str | None) -> bool:
    if not deadline:
        return False
    hour, minute = (int(part) for part in deadline.split(":"))
    now = datetime.now(timezone.utc)
    return (now.hour, now.minute) >= (hour, minute)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="demo runs in this set")
    parser.add_argument("--load", choices=("none", "cpu"), default="none",
                        help="cpu: one busy-looping process per core for each whole run")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None, help="default results/pick_stability_cpu_load-LOAD.json")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per demo run")
    parser.add_argument("--deadline-utc", default=None, help="HH:MM: start no run after this")
    parser.add_argument("--table", type=Path, default=None, help="print a results JSON's markdown table; run nothing")
    args = parser.parse_args()
    if args.table:
        print(markdown_table(json.loads(args.table.read_text())))
        return
    from compare.environment import git_revision, now_utc
    from estimate_accuracy import environment

    out = args.out or RESULTS / f"pick_stability_cpu_load-{args.load}.json"
    argv = demo_argv(HERE.parent / "README.md")
    loaded = args.load == "cpu"
    data: dict = {
        "environment": {**environment("cpu"), "revision": git_revision(HERE.parent), "started": now_utc()},
        "command": "autotune " + " ".join(argv),
        "load": "one busy-looping process per core during each run" if loaded else "none added",
        "runs": [],
    }
    for index in range(args.runs):
        if _past(args.deadline_utc):
            data["cut_short"] = f"deadline {args.deadline_utc} UTC reached after {index} runs"
            break
        run = run_demo(argv, loaded, args.timeout)
        data["runs"].append(run)
        data["summary"] = consistency(data["runs"])
        atomic_write_json(out, data)
        print(run_line(index, run), flush=True)
    data["summary"] = consistency(data["runs"])
    modal = data["summary"]["modal_pick"]
    for run in data["runs"]:
        run["agreement"] = agreement(run, modal)
    data["finished"] = now_utc()
    atomic_write_json(out, data)
    print(f"modal pick {modal}; per run:")
    for index, run in enumerate(data["runs"]):
        print(run_line(index, run, modal))
    summary = data["summary"]
    print(f"{summary['consistent']} of {summary['runs']} consistent ({summary['same']} same pick,"
          f" {summary['tie_naming_it']} declared ties naming it); written to {out}")  # fmt: skip
    print(markdown_table(data))


if __name__ == "__main__":
    main()

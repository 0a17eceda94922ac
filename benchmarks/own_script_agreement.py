"""Does autotune rank the README's own-script example the way the script's own clock does? ZeRO-0 vs ZeRO-3 +
optimizer offload, timed both ways, in alternating pairs.

    python benchmarks/own_script_agreement.py [--rounds 5] [--steps 40] [--out FILE.json]

The README's own-script example tunes tests/scripts/user_jobs/plain_deepspeed.py on tests/scripts/user_jobs/tiny-gpt2
(`--device cpu --memory-budget 2GiB --seq-len 64 --micro-batches 2,8`). For its largest micro-batch, 8, each round
measures the two candidates, order alternating between rounds (A, B then B, A) so drift hits both alike:

- autotune's figure: the trial `tune` runs (TuneContext.spec through the own-command launcher): the median wall
  clock of whole optimizer steps at the engine's step boundaries, with its interval and step count, and the
  engine's one profiled step beside it (the figure autotune ranked on before);
- the script's own clock: the same script, run by itself with the config autotune would write
  (TuneContext.emitted_config) for `--steps` optimizer steps, each printing its own wall time (`wall_s`); the
  median after the first 5 steps (warm-up, the same count autotune skips before its profiled step).

Per round the faster candidate both ways, and overall the verdict autotune.search.pick_decision gives on the pooled
trials.
Every round records the load average (`uptime`). Written after every round (temp file + rename).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autotune.core.ladder import Candidate, Rung
from autotune.core.measurement import pooled
from autotune.infra.atomic import atomic_write_json
from autotune.request.context import TuneContext
from autotune.request.tune_request import TuneRequest
from autotune.search.pick_decision import decide
from autotune.trial.launch.processes import one_rank_env, trial_env
from autotune.trial.own_command.script import ScriptLauncher
from portable_paths import portable  # benchmarks/ is the script's directory

REPO = Path(__file__).resolve().parents[1]
JOBS = REPO / "tests" / "scripts" / "user_jobs"
RESULTS = REPO / "benchmarks" / "results" / "own_script_agreement_cpu.json"
MODEL = JOBS / "tiny-gpt2"
SCRIPT = [sys.executable, str(JOBS / "plain_deepspeed.py")]
COMMAND = (*SCRIPT, "--deepspeed_config", "{ds_config}", "--model-config", str(MODEL), "--seq-len", "{seq_len}",
           "--gradient-checkpointing", "{grad_checkpointing}")  # fmt: skip
CANDIDATES = {"z0": Candidate(Rung.Z0, 8), "z3+offload_opt": Candidate(Rung.Z3_OFFLOAD_OPT, 8)}
SCRIPT_WARMUP_STEPS = 5
WALL = re.compile(r"^step (\d+) loss \S+ wall_s (\S+)$")


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def context() -> TuneContext:
    request = TuneRequest.of(model=str(MODEL), device="cpu", memory_budget="2GiB", seq_len=64, micro_batches=[2, 8],
                          out="unused.json", command=list(COMMAND))  # fmt: skip
    return TuneContext.build(request, outputs=False)


def autotune_figure(ctx: TuneContext, candidate: Candidate) -> dict:
    result = ScriptLauncher(list(COMMAND)).run(ctx.spec(candidate))
    speed = pooled([(result.step_times_s, result.samples_per_s)]) if result.ok else None
    return {
        "status": result.status,
        "error": result.error,
        "samples_per_s": result.samples_per_s,
        "speed": speed.to_dict() if speed else None,
        "step_times_s": result.step_times_s,
        "metric_source": result.metric_source,
        "profiled_samples_per_s": result.profiled_samples_per_s,
        "wall_s": round(result.wall_s, 1),
    }


def script_clock(ctx: TuneContext, candidate: Candidate, steps: int) -> dict:
    """The script alone, with the config autotune would write, timing its own steps."""
    config = ctx.emitted_config(candidate)
    with tempfile.TemporaryDirectory(prefix="own-script-agreement-") as scratch:
        path = Path(scratch) / "ds_config.json"
        path.write_text(json.dumps(config))
        argv = [*SCRIPT, "--deepspeed_config", str(path), "--model-config", str(MODEL), "--seq-len", "64",
                "--steps", str(steps)]  # fmt: skip
        env = trial_env({**os.environ, **one_rank_env()}, "own-script-agreement", "cpu")
        started = time.monotonic()
        done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=scratch, timeout=1800)
    walls = [float(m.group(2)) for line in done.stdout.splitlines() if (m := WALL.match(line.strip()))]
    measured = walls[SCRIPT_WARMUP_STEPS:]
    samples = int(config["train_batch_size"])
    return {
        "exit_code": done.returncode,
        "error": None if done.returncode == 0 else done.stderr[-1500:],
        "steps": len(walls),
        "step_wall_s": walls,
        "median_step_s": statistics.median(measured) if measured else None,
        "samples_per_s": samples / statistics.median(measured) if measured else None,
        "wall_s": round(time.monotonic() - started, 1),
    }


def _faster(figures: dict[str, dict]) -> str | None:
    rates = {name: f.get("samples_per_s") for name, f in figures.items()}
    if not all(rates.values()):
        return None
    return max(rates, key=lambda name: rates[name] or 0.0)


def summarize(rounds: list[dict]) -> dict:
    agree = sum(r["faster_autotune"] == r["faster_script"] and r["faster_script"] is not None for r in rounds)
    speeds = {}
    for name, candidate in CANDIDATES.items():
        trials = [(r["autotune"][name]["step_times_s"], r["autotune"][name]["samples_per_s"]) for r in rounds
                  if r["autotune"][name]["status"] == "ok"]  # fmt: skip
        if (speed := pooled(trials)) is not None:
            speeds[candidate] = speed
    verdict = decide(speeds)
    script_rates = {name: [r["script"][name]["samples_per_s"] for r in rounds if r["script"][name]["samples_per_s"]]
                    for name in CANDIDATES}  # fmt: skip
    return {
        "rounds": len(rounds),
        "rounds_agreeing": agree,
        "autotune_verdict": verdict.to_dict() if verdict else None,
        "script_median_samples_per_s": {n: statistics.median(v) if v else None for n, v in script_rates.items()},
        "profiled_faster": [
            max(CANDIDATES, key=lambda n: r["autotune"][n]["profiled_samples_per_s"] or 0.0) for r in rounds
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40, help="the script's own optimizer steps per run")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    from compare.environment import git_revision, now_utc  # benchmarks/ is the script's directory
    from estimate_accuracy import environment

    ctx = context()
    data: dict = {
        "environment": {**environment("cpu"), "revision": git_revision(REPO), "started": now_utc()},
        "command": " ".join(COMMAND),
        "candidates": {name: c.describe() for name, c in CANDIDATES.items()},
        "rounds": [],
    }
    for index in range(args.rounds):
        order = list(CANDIDATES) if index % 2 == 0 else list(reversed(CANDIDATES))
        before = _uptime()
        autotune = {name: autotune_figure(ctx, CANDIDATES[name]) for name in order}
        script = {name: script_clock(ctx, CANDIDATES[name], args.steps) for name in order}
        data["rounds"].append({
            "order": order,
            "autotune": autotune,
            "script": script,
            "faster_autotune": _faster(autotune),
            "faster_script": _faster(script),
            "uptime_before": before,
            "uptime_after": _uptime(),
        })  # fmt: skip
        data["summary"] = summarize(data["rounds"])
        atomic_write_json(args.out, portable(data))
        last = data["rounds"][-1]
        print(json.dumps({"round": index, "autotune": last["faster_autotune"], "script": last["faster_script"],
                          "uptime": last["uptime_after"]}), flush=True)  # fmt: skip
    print(json.dumps(data.get("summary"), indent=1))


if __name__ == "__main__":
    main()

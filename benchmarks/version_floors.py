"""Measure one cell of the version-floor table: a fresh virtualenv at the named versions, then the commands.

Why: pyproject's lower bounds must be versions somebody ran. A cell is torch 2.13.0 (the CPU wheel on disk; any
other torch spec pulls GBs of CUDA wheels) plus the named older stack, autotune installed over it with --no-deps,
then `model`, `plan`, `check` (a plain and an HF "auto" config), one real CPU tune of the tiny model and a pytest
selection. Each cell is appended to benchmarks/results/version_floors.json (temp file then rename) with its
versions, commands, exit codes, pass/fail counts, failures grouped by cause, date and load.

    python3 benchmarks/version_floors.py --name ds0176-tf4513 --pytest=-q deepspeed==0.17.6 transformers==4.51.3 ...
    python3 benchmarks/version_floors.py --name floors --floors --pytest='-q tests/test_versions.py'  # CI's cell
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "version_floors.json"
# autotune's own runtime dependencies that no cell floors (they come with the stack or have no known quarrel).
UNFLOORED = ["nvidia-ml-py", "psutil", "hjson", "filelock", "pytest", "matplotlib"]
FLOORED = ["torch", "deepspeed", "transformers", "accelerate", "peft", "pydantic", "typer", "rich"]
REPORTED = ["torch", "deepspeed", "transformers", "accelerate", "peft", "pydantic", "typer", "rich", "click", "numpy"]
FAILED_LINE = re.compile(r"^(FAILED|ERROR) (\S+)(?: - (.*))?$")
COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)")


def commands(tmp: Path) -> list[tuple[str, list[str]]]:
    """The user-facing commands a cell runs, in order: planning first, the real CPU tune last."""
    check = REPO / "tests" / "data" / "check"
    return [
        ("model", ["autotune", "model", "llama-3-8b"]),
        ("plan", ["autotune", "plan", "--model", "llama-3-8b", "--gpus", "8", "--gpu-type", "a100-80gb"]),
        ("check plain", ["autotune", "check", str(check / "clean.json"), "--gpus", "8"]),
        ("check hf auto", ["autotune", "check", str(check / "blog_post.json"), "--gpus", "8"]),
        ("tune cpu", ["autotune", "--model", "tiny-gpt2", "--device", "cpu", "--memory-budget", "1GiB",
                      "--seq-len", "32", "--micro-batches", "1,2", "--rungs", "z0,z2", "--out",
                      str(tmp / "tune" / "ds_config.json")]),
    ]


def run(argv: list[str], env: dict[str, str], timeout: float) -> dict:
    """One command: exit code, seconds, and the last lines (a traceback's last line names its cause)."""
    start = time.monotonic()
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
        code, out = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:
        code, out = "timeout", str(expired.stdout or "") + str(expired.stderr or "")
    lines = [line for line in out.splitlines() if line.strip()]
    return {"argv": argv, "rc": code, "seconds": round(time.monotonic() - start, 1),
            "traceback": "Traceback (most recent call last)" in out, "tail": lines[-4:]}


def command_ok(result: dict) -> bool:
    """A command works when it ends by itself with 0 or 1 (check's "errors found") and prints no traceback."""
    return result["rc"] in (0, 1) and not result["traceback"]


def pytest_summary(out: str) -> dict:
    """Counts from pytest's closing line and its -ra summary grouped by the first words of each cause."""
    closing = [line for line in out.splitlines() if COUNT.search(line) and (" in " in line)]
    counts = {kind: int(n) for n, kind in COUNT.findall(closing[-1])} if closing else {}
    causes: dict[str, list[str]] = {}
    for line in out.splitlines():
        match = FAILED_LINE.match(line.strip())
        if match:
            cause = (match.group(3) or "(no message)")[:160]
            causes.setdefault(cause, []).append(match.group(2))
    return {"counts": counts, "causes": dict(sorted(causes.items(), key=lambda item: -len(item[1])))}


def installed(python: Path) -> dict[str, str]:
    """The versions the cell really ran, read by importlib.metadata in the cell's own interpreter."""
    code = ("import importlib.metadata as m, json, sys\nout={}\nfor n in sys.argv[1:]:\n"
            "    try: out[n]=m.version(n)\n    except m.PackageNotFoundError: out[n]=None\nprint(json.dumps(out))")
    done = subprocess.run([str(python), "-c", code, *REPORTED], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def build(venv: Path, specs: list[str], env: dict[str, str], log: Path) -> float:
    """A fresh venv: torch 2.13.0 first (the wheel on disk), then the cell's specs, then autotune --no-deps."""
    start = time.monotonic()
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    with log.open("a") as sink:
        for step in (["torch==2.13.0", "setuptools<80", "wheel", "hatchling", "editables"], [*specs, *UNFLOORED],
                     ["--no-deps", "-e", str(REPO)]):
            subprocess.run([*pip, "--no-build-isolation", *step], check=True, env=env, stdout=sink, stderr=sink)
    return round(time.monotonic() - start, 1)


def record(cell: dict, results: Path) -> None:
    """Append the cell to the results file: temp file then rename, so a reader never sees half a file."""
    cells = json.loads(results.read_text())["cells"] if results.exists() else []
    cells = [old for old in cells if old["name"] != cell["name"]] + [cell]
    temp = results.with_suffix(".json.tmp")
    temp.write_text(json.dumps({"about": __doc__.strip().splitlines()[0], "cells": cells}, indent=2) + "\n")
    temp.replace(results)


def declared_floors() -> list[str]:
    """pyproject's lower bounds of the measured packages as exact pins (torch 2.13.0 is the floor and the wheel
    on disk): the CI floors cell installs exactly what pyproject promises to work."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = [*project["dependencies"], *project["optional-dependencies"]["lora"]]
    pins = []
    for requirement in declared:
        name, _, floor = requirement.partition(">=")
        if name.strip() in FLOORED and name.strip() != "torch":  # torch: build() installs 2.13.0 first
            pins.append(f"{name.strip()}=={floor.split(',')[0].strip()}")
    return pins


def measure(args: argparse.Namespace, specs: list[str]) -> dict:
    """Build (unless reused) and run the commands and pytest in the cell; the cell's record."""
    venv, tmp = args.venvs / args.name, args.venvs / f"{args.name}-work"
    if not args.reuse:
        shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True, exist_ok=True)
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{venv / 'bin'}:{env['PATH']}", DS_ACCELERATOR="cpu", TORCH_EXTENSIONS_DIR=str(tmp / "ext"))
    cache = tmp / f"autotune-cache-{time.time_ns()}"  # a fresh results cache: the tune must run its trials
    env["AUTOTUNE_CACHE_DIR"] = str(cache)
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes")
    cell = {"name": args.name, "specs": specs, "date": now, "load_before": os.getloadavg(),
            "machine": f"{os.cpu_count()} cores, CPU only, Python {sys.version.split()[0]}"}
    build_seconds = tmp / "build_seconds"
    if not args.reuse:
        build_seconds.write_text(str(build(venv, specs, env, tmp / "pip.log")))
    if args.build_only:
        return cell
    cell["build_seconds"] = float(build_seconds.read_text())
    cell["versions"] = installed(venv / "bin" / "python")
    print(f"{args.name}: {cell['versions']}", flush=True)
    cell["commands"] = {}
    for label, argv in commands(tmp):
        if args.no_tune and label == "tune cpu":
            continue
        result = run(argv, env, timeout=1800)
        result["ok"] = command_ok(result)
        cell["commands"][label] = result
        print(f"{args.name}: {label}: rc {result['rc']} in {result['seconds']} s", flush=True)
        if not result["ok"]:
            print("\n".join(result["tail"]), flush=True)
    if args.pytest:
        start = time.monotonic()
        argv = [str(venv / "bin" / "python"), "-m", "pytest", *args.pytest.split(), "-p", "no:cacheprovider"]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=REPO)
        (tmp / "pytest.log").write_text(done.stdout + done.stderr)
        cell["pytest"] = {"argv": args.pytest, "rc": done.returncode, "seconds": round(time.monotonic() - start, 1),
                          **pytest_summary(done.stdout)}
        print("\n".join(done.stdout.splitlines()[-25:]), flush=True)
    cell["load_after"] = os.getloadavg()
    cell["ext_dir_mib"] = round(sum(f.stat().st_size for f in (tmp / "ext").rglob("*") if f.is_file()) / 2**20, 1) \
        if (tmp / "ext").exists() else 0
    return cell


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True)
    parser.add_argument("--venvs", type=Path, default=Path("/work/venvs"))
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--pytest", default="", help="pytest arguments, e.g. '-q' (default suite); empty: none")
    parser.add_argument("--floors", action="store_true", help="pin pyproject's declared lower bounds")
    parser.add_argument("--no-tune", action="store_true", help="leave out the CPU tune (its op build: minutes)")
    parser.add_argument("--keep", action="store_true", help="keep the virtualenv afterwards")
    parser.add_argument("--build-only", action="store_true", help="build the virtualenv (kept), measure nothing")
    parser.add_argument("--reuse", action="store_true", help="measure in the virtualenv --build-only left")
    parser.add_argument("specs", nargs="*")
    args = parser.parse_args()
    specs = [*declared_floors(), *args.specs] if args.floors else args.specs
    cell = measure(args, specs)
    if args.build_only:
        return 0
    record(cell, args.results)
    if not args.keep:
        shutil.rmtree(args.venvs / args.name, ignore_errors=True)
    failed = [label for label, result in cell["commands"].items() if not result["ok"]]
    if args.pytest and cell["pytest"]["rc"] != 0:
        failed.append(f"pytest (exit {cell['pytest']['rc']})")
    if failed:
        print(f"{args.name}: failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Measure one cell of the version-floor table: a fresh virtualenv at the named versions, then the commands.

Why: pyproject's lower bounds must be versions somebody ran. A cell is a torch (a `torch==` spec, else 2.13.0; the
package index's Linux CUDA wheels import and run on a CPU-only machine, a few GB with their `nvidia-*` wheels, kept
in pip's cache) plus the named stack, autotune installed over it with --no-deps, then `model`, `plan`, `check` (a
plain and an HF "auto" config, and `check --json`, whose stdout must parse as JSON), one real CPU tune of the tiny
model and a pytest selection; with --install-check, last, `pip install .` (non-editable, pip resolving) over the
cell, which must leave torch, DeepSpeed and transformers as they were. Each cell is appended to
benchmarks/results/version_floors.json (temp file then rename) with its versions, commands, exit codes, pass/fail
counts, failures grouped by cause, date and load; paths in it are relative to the repository (`<work>` is the
cell's scratch folder).

    python3 benchmarks/version_floors.py --name ds0176-tf4513 --pytest=-q deepspeed==0.17.6 transformers==4.51.3 ...
    python3 benchmarks/version_floors.py --name floors --floors --pytest='-q tests/test_versions.py'  # CI's cell
    python3 benchmarks/version_floors.py --name t241 torch==2.4.1 deepspeed==0.15.4 transformers==4.46.3 ...
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "version_floors.json"
# autotune's own runtime dependencies that no cell floors (they come with the stack or have no known quarrel).
UNFLOORED = ["nvidia-ml-py", "psutil", "hjson", "filelock", "pytest", "matplotlib"]
FLOORED = ["torch", "deepspeed", "transformers", "accelerate", "peft", "pydantic", "typer", "rich"]
REPORTED = ["torch", "deepspeed", "transformers", "accelerate", "peft", "pydantic", "typer", "rich", "click", "numpy"]
# Installed by --install-check's `pip install .`; a changed version of one of these fails the cell.
UNTOUCHED = ["torch", "deepspeed", "transformers"]
# The torch a cell without a `torch==` spec gets: the CPU wheel on this machine's disk.
DEFAULT_TORCH = "torch==2.13.0"
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
        ("check json", ["autotune", "check", str(check / "clean.json"), "--gpus", "8", "--json"]),
        (
            "tune cpu",
            [
                "autotune",
                "--model",
                "tiny-gpt2",
                "--device",
                "cpu",
                "--memory-budget",
                "1GiB",
                "--seq-len",
                "32",
                "--micro-batches",
                "1,2",
                "--rungs",
                "z0,z2",
                "--out",
                str(tmp / "tune" / "ds_config.json"),
            ],
        ),
    ]


def run(argv: list[str], env: dict[str, str], timeout: float) -> dict:
    """One command: exit code, seconds, and the last lines (a traceback's last line names its cause)."""
    start = time.monotonic()
    # its own session: on a timeout the whole group goes (a timed-out tune left its op builds running, orphaned)
    with subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, start_new_session=True
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
            code, out = process.returncode, stdout + stderr
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            code, out, stdout = "timeout", stdout + stderr, ""
    lines = [line for line in out.splitlines() if line.strip()]
    result = {
        "argv": argv,
        "rc": code,
        "seconds": round(time.monotonic() - start, 1),
        "traceback": "Traceback (most recent call last)" in out,
        "tail": lines[-4:],
    }
    if "--json" in argv and code in (0, 1):
        result["stdout_is_json"] = stdout_is_json(stdout)
    return result


def stdout_is_json(text: str) -> bool:
    """`--json` output must be JSON and nothing else (an older DeepSpeed's INFO line before it breaks a reader)."""
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def command_ok(result: dict) -> bool:
    """A command works when it ends by itself with 0 or 1 (check's "errors found"), prints no traceback and, with
    --json, prints JSON only."""
    return result["rc"] in (0, 1) and not result["traceback"] and result.get("stdout_is_json", True)


def relative(argv: list[str], tmp: Path) -> list[str]:
    """argv as recorded: the repository is `.`, the cell's scratch folder `<work>`, the folder of the cells
    (--venvs, where --ext-cache usually is) `<venvs>` and the home folder `~`, so no path of the machine that
    measured lands in the committed results."""
    return [
        arg.replace(str(tmp), "<work>")
        .replace(str(tmp.parent), "<venvs>")
        .replace(str(REPO) + "/", "")
        .replace(str(Path.home()), "~")
        for arg in argv
    ]


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
    code = (
        "import importlib.metadata as m, json, sys\nout={}\nfor n in sys.argv[1:]:\n"
        "    try: out[n]=m.version(n)\n    except m.PackageNotFoundError: out[n]=None\nprint(json.dumps(out))"
    )
    done = subprocess.run([str(python), "-c", code, *REPORTED], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def split_torch(specs: list[str]) -> tuple[str, list[str]]:
    """The cell's torch spec (DEFAULT_TORCH when none is named) and the other specs."""
    torch = [spec for spec in specs if re.match(r"torch\s*(==|>=|<=|~=|$)", spec)]
    return (torch[-1] if torch else DEFAULT_TORCH), [spec for spec in specs if spec not in torch]


def unfloored(specs: list[str]) -> list[str]:
    """UNFLOORED packages the cell does not pin itself (a cell may pin e.g. psutil to measure its floor)."""
    named = {re.split(r"[=<>~!\[ ]", spec, maxsplit=1)[0].lower() for spec in specs}
    return [name for name in UNFLOORED if name not in named]


def declared_rest(specs: list[str]) -> list[str]:
    """pyproject's own requirements (with --lora's peft) on the packages the cell does not name, as declared:
    pip adds what is missing and keeps what is there, as in a user's training env."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    named = {re.split(r"[=<>~!\[ ]", spec, maxsplit=1)[0].lower() for spec in specs} | {"torch"}
    declared = [*project["dependencies"], *project["optional-dependencies"]["lora"]]
    return [spec for spec in declared if re.split(r"[=<>~!\[ ]", spec, maxsplit=1)[0].lower() not in named]


def build(venv: Path, specs: list[str], env: dict[str, str], log: Path) -> float:
    """A fresh venv: the torch first (DeepSpeed's sdist builds against it: --no-build-isolation), then the cell's
    other specs, then autotune --no-deps."""
    start = time.monotonic()
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    torch, others = split_torch(specs)
    stack = [*others, *declared_rest(others)]
    with log.open("a") as sink:
        for step in (
            [torch, "setuptools<80", "wheel", "hatchling", "editables"],
            [*stack, *unfloored(stack)],
            ["--no-deps", "-e", str(REPO)],
        ):
            subprocess.run([*pip, "--no-build-isolation", *step], check=True, env=env, stdout=sink, stderr=sink)
    return round(time.monotonic() - start, 1)


def pip_list(python: Path) -> dict[str, str]:
    """Every distribution installed in the cell, name (normalised) to version, as pip reports it."""
    done = subprocess.run(
        [str(python), "-m", "pip", "list", "--format", "json"], capture_output=True, text=True, check=True
    )
    return {item["name"].lower().replace("_", "-"): item["version"] for item in json.loads(done.stdout)}


def install_check(python: Path, env: dict[str, str], log: Path) -> dict:
    """`pip install .` as a user installs into a training env (non-editable, pip resolving the dependencies): the
    versions before and after, and which of UNTOUCHED changed (must be none: pyproject's floors are at or below
    the env's stack)."""
    before = pip_list(python)
    start = time.monotonic()
    with log.open("a") as sink:
        done = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", str(REPO)], env=env, stdout=sink, stderr=sink, cwd=REPO
        )
    after = pip_list(python)
    changed = {
        name: [before.get(name), after.get(name)]
        for name in sorted(set(before) | set(after))
        if before.get(name) != after.get(name) and name != "autotune"
    }
    return {
        "rc": done.returncode,
        "seconds": round(time.monotonic() - start, 1),
        "changed": changed,
        "untouched_changed": [name for name in UNTOUCHED if name in changed],
        "ok": done.returncode == 0 and not any(name in changed for name in UNTOUCHED),
    }


def record(cell: dict, results: Path) -> None:
    """Append the cell to the results file: temp file then rename, so a reader never sees half a file; paths
    inside the repository are recorded relative to it."""
    cells = json.loads(results.read_text())["cells"] if results.exists() else []
    cells = [old for old in cells if old["name"] != cell["name"]] + [cell]
    temp = results.with_suffix(".json.tmp")
    text = json.dumps({"about": __doc__.strip().splitlines()[0], "cells": cells}, indent=2) + "\n"
    temp.write_text(text.replace(str(REPO) + "/", ""))  # a traceback's tail may name a file of the repository
    temp.replace(results)


def table(results: Path) -> str:
    """docs/tested-versions.md's table: one row per measured cell, its stack, what passed and why not."""
    rows = [
        "| cell | date (UTC) | load | torch | DeepSpeed | transformers | accelerate | commands | tune | pytest |"
        " failure causes |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in json.loads(results.read_text())["cells"]:
        versions, commands = cell.get("versions", {}), cell.get("commands", {})
        failed = [label for label, result in commands.items() if not result["ok"]]
        tune = commands.get("tune cpu")
        tests = cell.get("pytest", {})
        counts = ", ".join(f"{n} {kind}" for kind, n in tests.get("counts", {}).items()) or "not run"
        causes = [
            *(f"{label}: {' '.join(commands[label].get('tail', [])[-1:])[:120]}" for label in failed),
            *(f"{len(tests_)} x {cause[:120]}" for cause, tests_ in tests.get("causes", {}).items()),
            *([cell["note"]] if cell.get("note") else []),
        ]
        before, after = cell.get("load_before", [None])[0], cell.get("load_after", [None])[0]
        load = f"{before:.0f}-{after:.0f}" if before is not None and after is not None else "not recorded"
        rows.append(
            " | ".join(
                [
                    f"| {cell['name']}",
                    cell["date"][:16],
                    load,
                    *(str(versions.get(name, "?")) for name in ("torch", "deepspeed", "transformers", "accelerate")),
                    f"{len(commands) - len(failed)}/{len(commands)} ok"
                    + (f" ({', '.join(failed)} failed)" if failed else ""),
                    ("ok" if tune["ok"] else "failed") + f", {tune['seconds']:.0f} s" if tune else "not run",
                    f"`{tests.get('argv', '')}`: {counts}" if tests else "not run",
                    "<br>".join(causes).replace("|", "\\|") or "-",
                ]
            )
            + " |"
        )
    return "\n".join(rows)


def declared_floors() -> list[str]:
    """pyproject's lower bounds of the measured packages as exact pins, torch included: the CI floors cell installs
    exactly what pyproject promises to work."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = [*project["dependencies"], *project["optional-dependencies"]["lora"]]
    pins = []
    for requirement in declared:
        name, _, floor = requirement.partition(">=")
        if name.strip() in FLOORED + UNFLOORED and floor:
            pins.append(f"{name.strip()}=={floor.split(',')[0].strip()}")
    return pins


def measure(args: argparse.Namespace, specs: list[str]) -> dict:
    """Build (unless reused) and run the commands and pytest in the cell; the cell's record."""
    venv, tmp = args.venvs / args.name, args.venvs / f"{args.name}-work"
    if not args.reuse:
        shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True, exist_ok=True)
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # DeepSpeed's JIT ops: fresh per cell, or kept per torch release (--ext-cache; ninja rebuilds on changed sources
    # or flags but not on a changed torch ABI, so one folder per torch spec)
    ext = args.ext_cache / re.sub(r"[^\w.]+", "-", split_torch(specs)[0]) if args.ext_cache else tmp / "ext"
    env.update(PATH=f"{venv / 'bin'}:{env['PATH']}", DS_ACCELERATOR="cpu", TORCH_EXTENSIONS_DIR=str(ext))
    cache = tmp / f"autotune-cache-{time.time_ns()}"  # a fresh results cache: the tune must run its trials
    env["AUTOTUNE_CACHE_DIR"] = str(cache)
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes")
    cell = {
        "name": args.name,
        "specs": specs,
        "date": now,
        "load_before": os.getloadavg(),
        "machine": f"{os.cpu_count()} cores, CPU only, Python {sys.version.split()[0]}",
        **({"note": args.note} if args.note else {}),
    }
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
        result["argv"], result["tail"] = relative(argv, tmp), relative(result["tail"], tmp)
        cell["commands"][label] = result
        print(f"{args.name}: {label}: rc {result['rc']} in {result['seconds']} s", flush=True)
        if not result["ok"]:
            print("\n".join(result["tail"]), flush=True)
    if args.pytest:
        start = time.monotonic()
        argv = [str(venv / "bin" / "python"), "-m", "pytest", *args.pytest.split(), "-p", "no:cacheprovider"]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=REPO)
        (tmp / "pytest.log").write_text(done.stdout + done.stderr)
        cell["pytest"] = {
            "argv": args.pytest,
            "rc": done.returncode,
            "seconds": round(time.monotonic() - start, 1),
            **pytest_summary(done.stdout),
        }
        print("\n".join(done.stdout.splitlines()[-25:]), flush=True)
    if args.install_check:
        cell["install_check"] = install_check(venv / "bin" / "python", env, tmp / "pip.log")
        print(f"{args.name}: pip install . changed {cell['install_check']['changed']}", flush=True)
    cell["load_after"] = os.getloadavg()
    cell["ext_dir_mib"] = (
        round(sum(f.stat().st_size for f in ext.rglob("*") if f.is_file()) / 2**20, 1) if ext.exists() else 0
    )
    cell["ext_reused"] = bool(args.ext_cache)
    return cell


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="")
    parser.add_argument(
        "--venvs",
        type=Path,
        default=Path(tempfile.gettempdir()) / "autotune-venvs",
        help="where the cell's virtualenv and scratch folder go (outside the repository)",
    )
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--pytest", default="", help="pytest arguments, e.g. '-q' (default suite); empty: none")
    parser.add_argument("--floors", action="store_true", help="pin pyproject's declared lower bounds")
    parser.add_argument("--no-tune", action="store_true", help="leave out the CPU tune (its op build: minutes)")
    parser.add_argument("--keep", action="store_true", help="keep the virtualenv afterwards")
    parser.add_argument("--build-only", action="store_true", help="build the virtualenv (kept), measure nothing")
    parser.add_argument("--reuse", action="store_true", help="measure in the virtualenv --build-only left")
    parser.add_argument(
        "--install-check",
        action="store_true",
        help="last, `pip install .` over the cell: torch, DeepSpeed, transformers must not change",
    )
    parser.add_argument("specs", nargs="*")
    parser.add_argument(
        "--ext-cache",
        type=Path,
        default=None,
        help="keep DeepSpeed's built ops here, one folder per torch spec (default: fresh per cell)",
    )
    parser.add_argument("--note", default="", help="a line recorded with the cell (how it was built, if unusual)")
    parser.add_argument("--table", action="store_true", help="print --results as docs/tested-versions.md's table")
    args = parser.parse_args()
    if args.table:
        print(table(args.results))
        return 0
    if not args.name:
        parser.error("--name is required to measure a cell")
    specs = [*declared_floors(), *args.specs] if args.floors else args.specs
    cell = measure(args, specs)
    if args.build_only:
        return 0
    record(cell, args.results)
    if not args.keep:
        shutil.rmtree(args.venvs / args.name, ignore_errors=True)
    failed = [label for label, result in cell["commands"].items() if not result["ok"]]
    if args.install_check and not cell["install_check"]["ok"]:
        failed.append(f"pip install . (changed {cell['install_check']['changed']})")
    if args.pytest and cell["pytest"]["rc"] != 0:
        failed.append(f"pytest (exit {cell['pytest']['rc']})")
    if failed:
        print(f"{args.name}: failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

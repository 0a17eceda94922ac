"""The one-command lease (benchmarks/gpu/lease.sh) and its wheel set (make-wheels.sh, check_wheels.py).

Fast: the README's command fits the device tool's limits; the wheel checker catches what broke imports before
(a huggingface-hub below transformers' floor, two versions of a package, a pin not met). Slow: the lease's CPU
dry run for real, once to the end within its budget, once killed halfway with a planted failing trial.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
KIT_DIR = REPO / "benchmarks" / "gpu"
LEASE = KIT_DIR / "lease.sh"
# What the device tool brings back from $OUT: at most 8 files, named in letters, digits, '.', '_', '-'
# (the device tool's stated limits).
OUT_FILE = re.compile(r"[A-Za-z0-9._-]+")


@pytest.fixture
def check_wheels(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(KIT_DIR))
    import check_wheels

    return check_wheels


def _wheel(directory: Path, name: str, version: str, *requires: str) -> Path:
    path = directory / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    metadata = "Metadata-Version: 2.1\nName: {}\nVersion: {}\n{}".format(
        name, version, "".join(f"Requires-Dist: {r}\n" for r in requires)
    )
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", metadata)
    return path


def test_the_checker_catches_a_hub_below_transformers_floor_and_pins_not_met(check_wheels, tmp_path: Path) -> None:
    wheels = [
        _wheel(tmp_path, "transformers", "5.23.0", "huggingface-hub<3.0,>=1.31.0", "numpy>=1.17"),
        _wheel(tmp_path, "huggingface-hub", "1.30.0", "httpx<1,>=0.23.0"),
        _wheel(tmp_path, "pydantic", "2.14.0", "typing-extensions>=4.16", "left-pad>=1"),
        _wheel(tmp_path, "typing-extensions", "4.12.0"),
        _wheel(tmp_path, "typing-extensions", "4.16.0"),
    ]
    problems = check_wheels.check_set(wheels, {"pydantic": "2.13.4", "hjson": "3.1.0"})
    text = "\n".join(problems)
    assert "transformers needs huggingface-hub<3.0,>=1.31.0, the set has 1.30.0" in text
    assert "two versions of typing-extensions" in text
    assert "pydantic is 2.14.0 in the set, pinned 2.13.4" in text and "hjson==3.1.0 is pinned but not" in text
    assert "left-pad>=1: neither carried nor in the GPU image" in text
    assert "numpy" not in text and "httpx" not in text  # the image has them


def test_the_pinned_list_pins_every_package_once_at_an_exact_version(check_wheels) -> None:
    pins = check_wheels.pins()
    assert {"deepspeed", "hjson", "pydantic", "pydantic-core", "typing-extensions", "huggingface-hub"} <= set(pins)
    assert all(re.fullmatch(r"[0-9][0-9.]*", version) for version in pins.values())
    assert pins["huggingface-hub"] >= "1.31" and tuple(map(int, pins["typing-extensions"].split("."))) >= (4, 16)


def _readme_run_call() -> dict:
    text = (KIT_DIR / "README.md").read_text()
    block = re.search(r"```json\n(\{.*?\})\n```", text, re.S)
    assert block, "the kit README shows the device call as a JSON block"
    return json.loads(block.group(1))


def test_the_readme_command_fits_the_device_tools_limits() -> None:
    call = _readme_run_call()
    assert len(call["command"]) <= 2000 and call["timeout_s"] <= 560
    assert "benchmarks/gpu/lease.sh" in call["command"] and call["carry"] and len(call["carry"]) <= 8
    budget = int(re.search(r"--budget-s (\d+)", call["command"]).group(1))
    assert budget <= 510 and budget + 40 <= call["timeout_s"]  # the lease ends by itself before the tool stops it
    assert subprocess.run(["bash", "-n", str(LEASE)], check=False).returncode == 0


def test_a_bad_argument_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(LEASE), "--budget-s", "soon"],
        capture_output=True,
        text=True,
        env={**os.environ, "OUT": str(tmp_path)},
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "--budget-s" in done.stderr


def _start_lease(tmp_path: Path, budget: int, *extra: str) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "LEASE_SCRATCH": str(tmp_path / "scratch"), "COLUMNS": "200"}
    process = subprocess.Popen(
        ["bash", str(LEASE), "--dry-run", "--budget-s", str(budget), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,  # its own process group: the test kills the whole command, as a device limit does
    )
    return process, out


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _assert_out_comes_back(out: Path) -> None:
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8 and all(OUT_FILE.fullmatch(p.name) and p.parent == out for p in files), files


@pytest.mark.slow
def test_the_dry_run_lease_ends_within_its_budget_with_every_stage_recorded(tmp_path: Path) -> None:
    budget = 420
    started = time.monotonic()
    process, out = _start_lease(tmp_path, budget)
    output, _ = process.communicate(timeout=budget + 120)
    wall = time.monotonic() - started
    assert process.returncode == 0, output[-3000:]
    assert wall <= budget + 30, f"{wall:.0f} s for a {budget} s budget"
    lease = _json(out / "lease.json")
    assert {"versions", "headers", "probe", "ops", "stages"} <= set(lease)
    assert all("error" not in op for op in lease["ops"].values()), lease["ops"]
    assert not any(stage["timed_out"] for stage in lease["stages"].values()), lease["stages"]
    rows = _json(out / "validation.json")["memory"]["rows"]
    assert rows and all(row["status"] == "ok" and row["phases"] for row in rows.values())
    _assert_out_comes_back(out)
    assert (out / "lease.log").read_text().strip().endswith(f"of {budget}s")


@pytest.mark.slow
def test_a_lease_killed_halfway_leaves_its_finished_items_and_the_failed_trials_logs(tmp_path: Path) -> None:
    process, out = _start_lease(tmp_path, 420, "--plant-fault", "tiny-llama/z0")
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and process.poll() is None:
            rows = _json(out / "validation.json").get("memory", {}).get("rows", {})
            if len(rows) >= 2:
                break
            time.sleep(2)
        assert process.poll() is None, "the lease ended before it could be killed halfway"
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # no trap runs: what is in $OUT is what a device limit leaves
        process.communicate()
    lease = _json(out / "lease.json")
    assert {"versions", "probe", "ops"} <= set(lease) and lease["stages"]["probe"]["exit"] == 0
    rows = _json(out / "validation.json")["memory"]["rows"]
    failed = rows["tiny-llama/z0/mb4/s128"]
    assert failed["status"] == "error" and failed["logs"]
    ran = [row for row in rows.values() if row["status"] == "ok"]
    assert ran and ran[0]["predicted_bytes"] > 0
    logs = (out / "trial-logs.txt").read_text()
    assert "===== tiny-llama/z0/mb4/s128: error" in logs and "injected failure at start" in logs
    _assert_out_comes_back(out)

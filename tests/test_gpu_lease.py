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
def test_the_dry_run_lease_at_cold_h200_walls_runs_every_warm_item_and_the_fresh_confirmation(tmp_path: Path) -> None:
    """Issue 42: with each item slept up to its estimated cold-H200 wall (points.py H200_WALL_S), the re-planned lease
    runs the smoke, all three warm items and the tune with its fresh confirmation within its budget. On a machine
    whose CPU trials take longer than those walls (a loaded one) the plan cannot show it: the test says so."""
    budget = 510
    started = time.monotonic()
    process, out = _start_lease(tmp_path, budget, "--emulate-h200")
    output, _ = process.communicate(timeout=budget + 180)
    wall = time.monotonic() - started
    assert process.returncode == 0, output[-3000:]
    assert wall <= budget + 30, f"{wall:.0f} s for a {budget} s budget"
    smoke_wall = _json(out / "validation.json").get("smoke", {}).get("wall_s", 0)
    if smoke_wall > 2 * 15:  # points.py H200_WALL_S["smoke"]: this CPU is slower than the walls the plan is sized by
        pytest.skip(f"the smoke trial took {smoke_wall} s here (load {os.getloadavg()[0]:.1f}), over twice its"
                    " cold-H200 15 s: the emulated walls cannot show the plan's fit on this machine")  # fmt: skip
    lease = _json(out / "lease.json")
    assert {"versions", "headers", "probe", "ops", "stages"} <= set(lease)
    assert all("error" not in op for op in lease["ops"].values()), lease["ops"]
    assert lease["stages"]["help"]["exit"] == 0 and lease["stages"]["smoke"]["exit"] == 0
    results = _json(out / "validation.json")
    assert results["smoke"]["status"] == "ok"
    warm = results["warm"]
    assert warm["complete"] and [row["status"] for row in warm["rows"]] == ["ok"] * 3, warm
    # the sampler at 10 ms always runs; its 1 s twin only where the kit judges it fits the time left (kit.py
    # stage_sampler's can_start), which a loaded CPU's walls may not leave: measured so on 2026-11-29 at load ~4
    assert "0.01s" in results["sampler"]["rows"] and set(results["sampler"]["rows"]) <= {"0.01s", "1s"}
    assert results["tune"]["fresh_confirmation"]["fresh_peak_bytes"], results["tune"]
    _assert_out_comes_back(out)
    assert (out / "trial-stream.txt").stat().st_size > 0
    assert (out / "lease.log").read_text().strip().endswith(f"of {budget}s")


@pytest.mark.slow
def test_a_lease_killed_mid_stage_leaves_its_finished_items_and_the_in_flight_stages_log(tmp_path: Path) -> None:
    process, out = _start_lease(tmp_path, 900, "--plant-fault", "tiny-llama/z0/mb4")  # not the smoke's mb1
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and process.poll() is None:
            if "stage warm (" in ((out / "lease.log").read_text() if (out / "lease.log").exists() else ""):
                break
            time.sleep(2)
        time.sleep(30)  # the kit has started and the warm pool's first trial is under way
        assert process.poll() is None, "the lease ended before it could be killed mid-stage"
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # no trap runs: what is in $OUT is what a device limit leaves
        process.communicate()
    lease = _json(out / "lease.json")
    assert {"versions", "ops"} <= set(lease) and lease["stages"]["smoke"]["exit"] == 0
    rows = _json(out / "validation.json")["memory"]["rows"]
    failed = rows["tiny-llama/z0/mb4/s128/torch-adamw"]
    assert failed["status"] == "error" and failed["logs"]
    assert any(row["status"] == "ok" and row["predicted_bytes"] > 0 for row in rows.values())
    logs = (out / "trial-logs.txt").read_text()
    assert "===== tiny-llama/z0/mb4/s128/torch-adamw: error" in logs and "injected failure at start" in logs
    stream = (out / "trial-stream.txt").read_text()
    assert "warm-pool" in stream  # the stage in flight when the lease was killed: its logs came back
    _assert_out_comes_back(out)


def test_the_log_follower_copies_what_each_log_gains_and_survives_a_removed_one(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(KIT_DIR))
    try:
        from follow_logs import Follower
    finally:
        sys.path.remove(str(KIT_DIR))
    watch, sink = tmp_path / "scratch", tmp_path / "out" / "trial-stream.txt"
    (watch / "trials" / "a").mkdir(parents=True)
    sink.parent.mkdir()
    first = watch / "trials" / "a" / "rank0.log"
    first.write_text("imports\n")
    follower = Follower(watch, sink, max_bytes=200)
    assert follower.poll()
    with first.open("a") as log:
        log.write("engine init\n")
    (watch / "trials" / "b.log").write_text("other\n")
    assert follower.poll()
    text = sink.read_text()
    assert text.count("imports") == 1 and "engine init" in text and "other" in text
    assert text.count("===== trials/a/rank0.log") == 1  # a log that goes on where it stopped needs no new header
    first.unlink()  # a trial that ran fine has its directory removed
    assert follower.poll()
    (watch / "big.log").write_text("x" * 500)
    assert not follower.poll() and sink.stat().st_size <= 200 + 200  # full: it stops copying


def test_missing_unversioned_cuda_libraries_get_links_and_absent_ones_are_named(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(KIT_DIR))
    import preflight

    lib = tmp_path / "nvidia" / "cuda_runtime" / "lib"
    lib.mkdir(parents=True)
    (lib / "libcudart.so.13").write_bytes(b"\x7fELF")
    (lib / "libcublas.so").write_bytes(b"\x7fELF")
    monkeypatch.setattr(preflight, "library_dirs", lambda: [lib])
    found = preflight.cuda_libs(tmp_path / "links")
    assert found["libs"]["cudart"] == {"linked": str(lib / "libcudart.so.13")}
    assert (tmp_path / "links" / "libcudart.so").resolve() == lib / "libcudart.so.13"
    assert found["libs"]["cublas"] == {"so": str(lib / "libcublas.so")}
    assert found["libs"]["curand"] == {"missing": True}
    assert preflight.cpu_stamp() == preflight.cpu_stamp() and "flags" in preflight.cpu_stamp()

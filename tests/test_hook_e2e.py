"""`autotune hook` end to end: real CLI processes, real DeepSpeed trials on the CPU backend, tiny model.

One job of 8 hook processes (`srun -n 8 autotune hook` on one node; no SLURM here, so its variables
are set by hand and trials run locally): its tuner is SIGKILLed mid-trial, another process takes
over, and all 7 survivors end with the same bytes; then a repeat job is all cache hits, and corrupt
cache entries are re-tuned. Multi-node trials are covered by tests/test_hook_launch.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from tests.fakes.hook import TINY, PartialReadWatcher, one_node_job

REPO = Path(__file__).resolve().parents[1]
TINY += ["--max-trials", "1", "--memory-budget", "2GiB", "--json"]


def start_cli(cache: Path, out: Path, env: dict[str, str]) -> subprocess.Popen:
    """`autotune hook` as a job step would run it (the CPU backend: no GPU is checked)."""
    return subprocess.Popen(
        [sys.executable, "-m", "autotune", "hook", *TINY, "--cache-dir", str(cache), "--out", str(out)],
        cwd=REPO,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(processes: list[subprocess.Popen], timeout: float = 240) -> list[dict]:
    results = []
    for process in processes:
        stdout, stderr = process.communicate(timeout=timeout)
        assert process.returncode == 0, stderr
        results.append(json.loads(stdout))
    return results


def leader_pid(cache: Path, candidates: list[subprocess.Popen], timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    pids = {p.pid for p in candidates}
    while time.monotonic() < deadline:
        for note in (cache / "hook").glob("*.leader.json"):
            pid = json.loads(note.read_text())["pid"]
            if pid in pids:
                return pid
        time.sleep(0.1)
    raise AssertionError("no hook process took the lock")


def kill_mid_trial(pid: int, timeout: float = 120) -> None:
    """SIGKILL the tuner once its trial process runs, then the trial processes it started (by pid)."""
    tuner = psutil.Process(pid)
    deadline = time.monotonic() + timeout
    while not tuner.children(recursive=True):
        assert time.monotonic() < deadline, "the tuner never started a trial"
        time.sleep(0.1)
    time.sleep(2)  # well inside the trial: imports and model build take longer than this
    orphans = tuner.children(recursive=True)
    tuner.send_signal(signal.SIGKILL)
    for child in orphans:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


def corrupt_recommendation(cache: Path) -> None:
    with sqlite3.connect(cache / "results.sqlite") as db:
        changed = db.execute("UPDATE signed_recommendations SET payload = replace(payload, 'z0', 'z3')").rowcount
    assert changed == 1


@pytest.mark.slow
def test_eight_hooks_one_tuner_killed_and_recovered_then_hits_then_corrupt_entries_retuned(tmp_path: Path) -> None:
    cache = tmp_path / "shared"
    shared_out = tmp_path / "shared" / "configs" / "ds_config.json"
    outs = [shared_out] * 4 + [tmp_path / f"node-local-{rank}" / "ds_config.json" for rank in range(4, 8)]

    # 1. a cache miss: 8 processes, one tunes; it is killed mid-trial and another takes over
    started = time.monotonic()
    with PartialReadWatcher(sorted(set(outs))) as watcher:
        processes = [start_cli(cache, out, one_node_job("100", rank)) for rank, out in enumerate(outs)]
        first = leader_pid(cache, processes)
        kill_mid_trial(first)
        survivors = [p for p in processes if p.pid != first]
        results = finish(survivors)
        killed = next(p for p in processes if p.pid == first)
        killed.communicate(timeout=30)
    miss_s = time.monotonic() - started
    assert killed.returncode == -signal.SIGKILL
    assert [r["role"] for r in results].count("leader") == 1
    assert {r["status"] for r in results} == {"complete"}
    assert {r["sha256"] for r in results} == {results[0]["sha256"]}
    surviving_outs = {Path(r["config_path"]) for r in results}
    assert len({path.read_bytes() for path in surviving_outs}) == 1
    assert watcher.reads > 0 and watcher.bad == []
    config = json.loads(shared_out.read_text())
    assert config["train_micro_batch_size_per_gpu"] == 1 and config["train_batch_size"] == 1

    # 2. a repeat job: every rank is a cache hit
    started = time.monotonic()
    hits = finish([start_cli(cache, out, one_node_job("101", rank)) for rank, out in enumerate(outs)])
    hit_s = time.monotonic() - started
    assert {r["role"] for r in hits} == {"hit"} and {r["sha256"] for r in hits} == {results[0]["sha256"]}
    print(f"\n8 hooks, cache miss with the tuner killed once: {miss_s:.1f} s; 8 hooks, cache hit: {hit_s:.1f} s")

    # 3. corrupt entries: the published record and the results cache's recommendation; both re-tuned
    record = next((cache / "hook").glob("*[0-9a-f].json"))
    record.write_text(record.read_text()[:-40])
    corrupt_recommendation(cache)
    [again] = finish([start_cli(cache, tmp_path / "again.json", one_node_job("102", 0))])
    assert again["role"] == "leader" and again["ignored_record"]
    # the corrupt answer is re-derived, not trusted; the measured trials are stored apart from it (keyed with the
    # memory limit, see autotune.request.context) and are still valid, so they are replayed rather than re-run
    assert again["details"]["from_cache"] is False and again["details"]["trials_launched"] == 0
    assert (tmp_path / "again.json").read_bytes() == shared_out.read_bytes()


@pytest.mark.slow
def test_sigterm_stops_the_tuner_and_its_trial_processes(tmp_path: Path) -> None:
    """scancel and time limits send SIGTERM: the tuner must not leave its trial running on the GPUs."""
    hook = start_cli(tmp_path / "shared", tmp_path / "ds.json", one_node_job("200", 0))
    tuner = psutil.Process(hook.pid)
    deadline = time.monotonic() + 120
    while not tuner.children(recursive=True):
        assert hook.poll() is None and time.monotonic() < deadline, "the tuner never started a trial"
        time.sleep(0.1)
    trial_processes = tuner.children(recursive=True)
    hook.send_signal(signal.SIGTERM)
    hook.communicate(timeout=60)
    assert hook.returncode == 128 + signal.SIGTERM
    _, alive = psutil.wait_procs(trial_processes, timeout=30)
    assert alive == [] and not (tmp_path / "ds.json").exists()

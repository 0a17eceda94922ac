"""What clusters do to jobs: SIGTERM with a grace period, SIGKILL leftovers, a hung lock holder.

The hook paths use the stand-in tune() of tests/fakes/hook.py (fast); tests/test_hook_e2e.py and
tests/cluster/ send the same signals to real DeepSpeed trials.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from tests.conftest import REPO
from tests.fakes.hook import FakeTune, hook_request

from autotune.core.ladder import Candidate, Rung
from autotune.hook import HookError, run_hook
from autotune.hook.coordinate import SharedSlot, coordinate, read_record
from autotune.infra.leftovers import OWNER_FILE, claim, owned_tempdir, sweep
from autotune.infra.terminate import TERMINATED_EXIT, Terminated, sigterm_raises

MB4 = Candidate(Rung.Z0, 4, False)


def sigterm_soon(delay_s: float = 0.5) -> threading.Timer:
    timer = threading.Timer(delay_s, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    return timer


def test_sigterm_raises_once_and_restores_the_previous_handler() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated), sigterm_raises():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    assert signal.getsignal(signal.SIGTERM) is before


def test_sigterm_mid_tuning_publishes_the_best_verified_config_for_this_job_only(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    sigterm_soon()
    with pytest.raises(Terminated, match="best config verified so far"), sigterm_raises():
        run_hook(hook_request(tmp_path / "ds.json", shared), environ={}, tune_fn=FakeTune(trials=(MB4,), delay_s=30))
    written = json.loads((tmp_path / "ds.json").read_text())
    assert written["train_micro_batch_size_per_gpu"] == 4
    records = list((shared / "hook").glob("*[0-9a-f].json"))
    assert len(records) == 1
    record, _ = read_record(SharedSlot(shared / "hook", records[0].stem))
    assert record is not None and record.details["terminated"] and record.verified
    assert list((shared / "hook" / "staging").iterdir()) == []  # staging cleaned
    # a resubmitted job (started after the termination) resumes tuning instead of taking the cut-short result
    fake = FakeTune()
    again = run_hook(hook_request(tmp_path / "again.json", shared), environ={}, tune_fn=fake)
    assert again.role == "leader" and len(fake.requests) == 1


def test_sigterm_before_anything_was_verified_publishes_nothing(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    sigterm_soon()
    with pytest.raises(Terminated), sigterm_raises():
        run_hook(hook_request(tmp_path / "ds.json", shared), environ={}, tune_fn=FakeTune(delay_s=30))
    assert not (tmp_path / "ds.json").exists()
    assert list((shared / "hook").glob("*[0-9a-f].json")) == []
    assert list((shared / "hook" / "staging").iterdir()) == []


HOOK_UNDER_SIGTERM = """
import sys
from tests.fakes.hook import FakeTune, hook_request
from autotune.cli import fail_with
from autotune.core.ladder import Candidate, Rung
from autotune.hook import run_hook
from autotune.infra.terminate import Terminated, sigterm_raises

try:
    with sigterm_raises():
        print("started", flush=True)
        fake = FakeTune(trials=(Candidate(Rung.Z0, 4, False),), delay_s=60)
        run_hook(hook_request(sys.argv[1], sys.argv[2]), environ={}, tune_fn=fake)
except Terminated as error:
    fail_with(str(error), error.exit_code)
"""


def test_a_sigtermed_hook_process_exits_143_with_one_line(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", HOOK_UNDER_SIGTERM, str(tmp_path / "ds.json"), str(tmp_path / "shared")],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "started"
    time.sleep(3)  # inside the stand-in's tuning (imports done: it printed)
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == TERMINATED_EXIT, stderr
    assert stderr.strip().startswith("autotune: error: terminated by SIGTERM") and "Traceback" not in stderr
    assert time.monotonic() - sent < 30  # inside SLURM's default KillWait
    assert json.loads((tmp_path / "ds.json").read_text())["train_micro_batch_size_per_gpu"] == 4


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_leftovers_of_a_dead_owner_are_swept_and_nothing_else(tmp_path: Path) -> None:
    dead = tmp_path / "autotune-trial-dead"
    dead.mkdir()
    (dead / OWNER_FILE).write_text(json.dumps({"host": socket.gethostname(), "pid": _dead_pid(), "started": 1.0}))
    reused = tmp_path / "autotune-trial-reused"  # our pid, but a different start time: the owner is gone
    reused.mkdir()
    (reused / OWNER_FILE).write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "started": 1.0}))
    other_host = tmp_path / "autotune-trial-remote"
    other_host.mkdir()
    (other_host / OWNER_FILE).write_text(json.dumps({"host": "elsewhere", "pid": _dead_pid(), "started": 1.0}))
    unclaimed = tmp_path / "autotune-trial-new"
    unclaimed.mkdir()
    alive = tmp_path / "autotune-trial-alive"
    alive.mkdir()
    claim(alive)
    unrelated = tmp_path / "mine"
    unrelated.mkdir()
    (unrelated / OWNER_FILE).write_text((dead / OWNER_FILE).read_text())
    fresh = owned_tempdir("autotune-trial-", tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [fresh.name, "autotune-trial-remote", "autotune-trial-new", "autotune-trial-alive", "mine"]
    )
    assert sweep(tmp_path, "autotune-trial-") == []


SIGKILLED_TUNER = """
import os, sys, time
from autotune.trial.launch.spawn import trial_directory
from autotune.infra.leftovers import owned_tempdir
from pathlib import Path

with trial_directory(None) as a, trial_directory(Path(sys.argv[1])) as b:
    pool = owned_tempdir("autotune-warm-")
    print(a, b, pool, flush=True)
    time.sleep(600)
"""


def test_a_sigkilled_tuners_temp_dirs_are_removed_by_the_next_run(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    process = subprocess.Popen(
        [sys.executable, "-c", SIGKILLED_TUNER, str(tmp_path / "trials")], env=env, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    left = [Path(p) for p in process.stdout.readline().split()]
    process.kill()
    process.wait()
    assert all(p.exists() for p in left)
    next_run = subprocess.run(
        [sys.executable, "-c", SIGKILLED_TUNER.replace("time.sleep(600)", "pass"), str(tmp_path / "trials")],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert not any(p.exists() for p in left), next_run.stdout


HOLD_LOCK = """
import sys, time
from pathlib import Path
from autotune.hook.coordinate import SharedSlot, coordinate

def produce():
    print("holding", flush=True)
    time.sleep(600)

coordinate(SharedSlot(Path(sys.argv[1]), "k1"), lambda r: True, produce, wait_timeout_s=5)
"""


def test_a_hung_holder_is_named_even_when_the_leader_note_is_stale(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        slot = SharedSlot(tmp_path, "k1")
        stale = {"host": socket.gethostname(), "pid": _dead_pid(), "started": time.time(), "key": "k1"}
        slot.leader_path.write_text(json.dumps(stale))  # e.g. left by an earlier, killed tuner
        with pytest.raises(HookError) as raised:
            coordinate(slot, lambda r: True, lambda: None, wait_timeout_s=0.5, poll_interval_s=0.05)  # type: ignore[arg-type]
        message = str(raised.value)
        assert f"pid {holder.pid}" in message and f"names {stale['host']} pid {stale['pid']}" in message
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
def test_sigterm_to_a_real_tune_stops_trials_cleans_temp_dirs_and_exits_143(tmp_path: Path) -> None:
    import psutil

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    command = [sys.executable, "-m", "autotune", "tune", "--device", "cpu", "--model", "tiny-gpt2", "--seq-len", "32"]
    command += [
        "--micro-batches",
        "1,2",
        "--rungs",
        "z0",
        "--memory-budget",
        "2GiB",
        "--out",
        str(tmp_path / "ds.json"),
    ]
    tune = subprocess.Popen(
        command, cwd=REPO, env={**os.environ, "TMPDIR": str(tmp)}, stderr=subprocess.PIPE, text=True
    )
    tuner = psutil.Process(tune.pid)
    deadline = time.monotonic() + 120
    while not tuner.children(recursive=True):
        assert tune.poll() is None and time.monotonic() < deadline, "the tuner never started a trial"
        time.sleep(0.1)
    time.sleep(2)
    trial_processes = tuner.children(recursive=True)
    sent = time.monotonic()
    tune.send_signal(signal.SIGTERM)
    _, stderr = tune.communicate(timeout=60)
    assert tune.returncode == TERMINATED_EXIT and "terminated by SIGTERM" in stderr and "Traceback" not in stderr
    assert time.monotonic() - sent < 30
    _, alive = psutil.wait_procs(trial_processes, timeout=30)
    assert alive == [] and list(tmp.iterdir()) == []

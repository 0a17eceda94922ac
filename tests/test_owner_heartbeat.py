"""Nothing outlives the tuner on any node: the heartbeat of the warm pool and of every fresh launch
(trial/launch/heartbeat.py) and the worker's watch of it (trial/worker/owner_watch.py). A worker on another node
cannot see the tuner's pid, and a SIGKILLed tuner leaves its `srun` step running, so the step's workers must notice
the heartbeat stop by themselves.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.fakes.trials import (
    cpu_ops_built,  # noqa: F401 (an autouse fixture: the trial here needs the ops)
    marked_env,
    survivors,
    tiny_spec,
    wait_until,
)

from autotune.trial.launch.heartbeat import HEARTBEAT_INTERVAL_S, HEARTBEAT_STALE_S, OwnerHeartbeat
from autotune.trial.worker.faults import FAULT_ENV, fault_value
from autotune.trial.worker.owner_watch import heartbeat_stale


class FakeTime:
    """A clock and a sleep for heartbeat_stale: each sleep advances the clock and lets the test act."""

    def __init__(self, on_sleep) -> None:  # type: ignore[no-untyped-def]
        self.now = 0.0
        self.on_sleep = on_sleep

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.on_sleep(self.now)


def test_a_renewed_heartbeat_keeps_the_worker_and_a_still_one_ends_it(tmp_path: Path) -> None:
    beat = tmp_path / "owner-heartbeat"
    beat.touch()
    renewals = iter(range(1, 31))  # the tuner renews it for 30 s of the fake clock, then dies

    def tuner(now: float) -> None:
        if now <= 30 and (n := next(renewals, None)) is not None:
            os.utime(beat, ns=(n * 10**9, n * 10**9))  # any change counts, whatever the writer's clock says

    fake = FakeTime(tuner)
    still = heartbeat_stale(beat, stale_s=10.0, interval_s=1.0, clock=fake.clock, sleep=fake.sleep)
    assert 10.0 < still <= 11.0
    assert 40.0 < fake.now <= 42.0  # not before the renewals stopped, and within one poll of the stale limit


def test_a_removed_heartbeat_counts_as_still(tmp_path: Path) -> None:
    beat = tmp_path / "owner-heartbeat"
    beat.touch()
    fake = FakeTime(lambda now: beat.unlink(missing_ok=True))
    assert heartbeat_stale(beat, stale_s=5.0, interval_s=1.0, clock=fake.clock, sleep=fake.sleep) > 5.0


def test_the_pool_heartbeat_renews_until_stopped(tmp_path: Path) -> None:
    beat = tmp_path / "owner-heartbeat"
    with OwnerHeartbeat(beat, interval_s=0.05):
        first = beat.stat().st_mtime_ns
        deadline = time.monotonic() + 5
        while beat.stat().st_mtime_ns == first and time.monotonic() < deadline:
            time.sleep(0.01)
        assert beat.stat().st_mtime_ns != first
    stopped = beat.stat().st_mtime_ns
    time.sleep(0.3)
    assert beat.stat().st_mtime_ns == stopped
    # the defaults: a renewal well inside the stale limit, which outlasts NFS's default attribute cache (60 s)
    assert HEARTBEAT_INTERVAL_S * 10 <= HEARTBEAT_STALE_S and HEARTBEAT_STALE_S > 60


# The tuners of the test below: their workers start as srun starts them on other nodes, without the tuner's pid
# (warm_nodes.without_owner), so only the heartbeat can tell them it is gone. A warm pool, and a fresh launch.
WARM_TUNER = """
import sys
from autotune.trial import TrialSpec, WarmWorkerPool
from autotune.trial.launch.heartbeat import HeartbeatTiming
from autotune.trial.launch.warm import OneNodeStart
from autotune.trial.launch.warm_nodes import without_owner

class NoOwnerPidStart(OneNodeStart):
    def start(self, spec, serve, env, pool_dir):
        return super().start(spec, without_owner(serve), env, pool_dir)

pool = WarmWorkerPool(env={env!r}, workdir={workdir!r}, start=NoOwnerPidStart(sys.executable, "127.0.0.1"),
                      heartbeat=HeartbeatTiming(interval_s=0.2, stale_s={stale_s!r}))
pool.run(TrialSpec(**{spec!r}))
"""
FRESH_TUNER = """
import dataclasses
from autotune.trial import LocalLauncher, TrialSpec, run_trial
from autotune.trial.launch.heartbeat import HeartbeatTiming
from autotune.trial.launch.warm_nodes import without_owner

class NoOwnerPid(LocalLauncher):
    def plan(self, spec):
        plan = super().plan(spec)
        return dataclasses.replace(plan, command=lambda *args: without_owner(plan.command(*args)))

launcher = NoOwnerPid(env={env!r}, workdir={workdir!r}, heartbeat=HeartbeatTiming(interval_s=0.2, stale_s={stale_s!r}))
run_trial(TrialSpec(**{spec!r}), launcher)
"""


@pytest.mark.parametrize(("tuner", "hang_at"), [(WARM_TUNER, "step"), (FRESH_TUNER, "entry")], ids=["warm", "fresh"])
def test_workers_without_the_tuners_pid_exit_once_a_sigkilled_tuner_stops_its_heartbeat(
    tmp_path: Path, tuner: str, hang_at: str
) -> None:
    """The worker hangs (as a rank stuck in a collective would); the tuner is SIGKILLed: no stop request, no kill
    path, srun (here the worker's launcher) left running. The heartbeat alone ends the worker."""
    stale_s = 4.0
    mark, env = marked_env(**{FAULT_ENV: fault_value("hang", hang_at)})
    code = tuner.format(env=env, workdir=str(tmp_path), stale_s=stale_s, spec=tiny_spec().to_dict())
    process = subprocess.Popen([sys.executable, "-c", code])
    try:
        assert wait_until(lambda: bool(survivors(mark)), timeout_s=120), "the worker never started"
        time.sleep(2 * stale_s)  # a live tuner's workers stay, however long they hang
        assert survivors(mark), "the worker left while its tuner still renewed the heartbeat"
    finally:
        process.kill()
        process.wait()
    killed = time.monotonic()
    assert wait_until(lambda: not survivors(mark), timeout_s=stale_s + 20), "the worker outlived its tuner"
    assert time.monotonic() - killed >= stale_s - 1  # it waited for the heartbeat to go stale, not for a pid
    logs = "".join(p.read_text(errors="replace") for p in tmp_path.rglob("rank0.log"))
    assert "heartbeat stood still" in logs

"""The hook's lock / wait / publish protocol: one producer, checked results, recovery from a killed holder."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import filelock
import pytest

from autotune.errors import UserError
from autotune.hook.coordinate import (
    HookError,
    HookRecord,
    LockUnavailable,
    SharedSlot,
    coordinate,
    publish,
    read_record,
)


def make_record(key: str, config: dict | None = None, status: str = "complete") -> HookRecord:
    return HookRecord(
        key=key,
        status=status,  # type: ignore[arg-type]
        config_text=json.dumps(config or {"train_batch_size": 8}, indent=2) + "\n",
        source="tuned",
        verified=True,
        job_id=None,
        hardware="test",
        leader=f"test pid {os.getpid()}",
        created=time.time(),
    )


class Producer:
    def __init__(self, slot: SharedSlot) -> None:
        self.slot = slot
        self.calls = 0

    def __call__(self) -> HookRecord:
        self.calls += 1
        return make_record(self.slot.key, {"train_batch_size": 8, "call": self.calls})


def test_first_call_produces_and_publishes_then_later_calls_are_hits(tmp_path: Path) -> None:
    slot = SharedSlot(tmp_path, "k1")
    produce = Producer(slot)
    first = coordinate(slot, lambda r: True, produce, wait_timeout_s=5)
    second = coordinate(slot, lambda r: True, produce, wait_timeout_s=5)
    assert (first.role, second.role, produce.calls) == ("leader", "hit", 1)
    assert second.record == first.record
    assert json.loads(second.record.config_text or "")["call"] == 1


def test_a_record_the_caller_does_not_accept_is_produced_again(tmp_path: Path) -> None:
    slot = SharedSlot(tmp_path, "k1")
    produce = Producer(slot)
    coordinate(slot, lambda r: True, produce, wait_timeout_s=5)
    again = coordinate(slot, lambda r: False, produce, wait_timeout_s=5)
    assert (again.role, produce.calls) == ("leader", 2)


@pytest.mark.parametrize(
    "damage",
    [
        lambda text: text[: len(text) // 2],  # torn write
        lambda text: "garbage{",
        lambda text: text.replace('\\"train_batch_size\\": 8', '\\"train_batch_size\\": 9'),  # bit flip in config
        lambda text: text.replace('"complete"', '"fallback"'),  # tampered metadata
    ],
)
def test_corrupt_published_record_is_detected_and_replaced(tmp_path: Path, damage) -> None:
    slot = SharedSlot(tmp_path, "k1")
    produce = Producer(slot)
    coordinate(slot, lambda r: True, produce, wait_timeout_s=5)
    original = slot.record_path.read_text()
    slot.record_path.write_text(damage(original))
    assert slot.record_path.read_text() != original
    record, problem = read_record(slot)
    assert record is None and problem
    again = coordinate(slot, lambda r: True, produce, wait_timeout_s=5)
    assert (again.role, produce.calls) == ("leader", 2)
    assert again.ignored == problem
    assert read_record(slot) == (again.record, None)


def test_a_record_for_another_key_is_not_trusted(tmp_path: Path) -> None:
    publish(SharedSlot(tmp_path, "other"), make_record("other"))
    os.replace(tmp_path / "other.json", tmp_path / "k1.json")
    assert read_record(SharedSlot(tmp_path, "k1")) == (None, "belongs to run key other")


def test_waiting_times_out_with_a_message_naming_the_holder(tmp_path: Path) -> None:
    slot = SharedSlot(tmp_path, "k1")
    slot.leader_path.write_text(json.dumps({"host": "gpu07", "pid": 1234, "started": time.time()}))
    with filelock.FileLock(slot.lock_path, thread_local=False):
        started = time.monotonic()
        with pytest.raises(HookError, match=r"timed out after 1 s waiting for the tuning process \(gpu07 pid 1234"):
            coordinate(slot, lambda r: True, Producer(slot), wait_timeout_s=1, poll_interval_s=0.05)
        assert time.monotonic() - started < 5


def test_a_waiting_process_takes_the_published_record_without_the_lock(tmp_path: Path) -> None:
    slot = SharedSlot(tmp_path, "k1")
    produce = Producer(slot)
    published = []

    def sleep(seconds: float) -> None:  # the holder publishes while we wait
        if not published:
            publish(slot, make_record("k1", {"train_batch_size": 8, "by": "holder"}))
            published.append(True)

    with filelock.FileLock(slot.lock_path, thread_local=False):
        outcome = coordinate(slot, lambda r: True, produce, wait_timeout_s=5, sleep=sleep)
    assert (outcome.role, produce.calls) == ("follower", 0)
    assert json.loads(outcome.record.config_text or "")["by"] == "holder"


HOLD_LOCK_FOREVER = """
import sys, time
from pathlib import Path
from autotune.hook.coordinate import SharedSlot, coordinate

def produce():
    print("tuning", flush=True)
    time.sleep(3600)

coordinate(SharedSlot(Path(sys.argv[1]), "k1"), lambda r: True, produce, wait_timeout_s=5)
"""


def test_a_lock_left_by_a_killed_process_is_recovered(tmp_path: Path) -> None:
    slot = SharedSlot(tmp_path, "k1")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK_FOREVER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "tuning"
        with pytest.raises(HookError, match="timed out"):  # it really holds the lock
            coordinate(slot, lambda r: True, Producer(slot), wait_timeout_s=0.5, poll_interval_s=0.05)
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    finally:
        holder.kill()
        holder.wait()
    assert slot.lock_path.exists()  # the lock file stays; the kernel released the flock with the process
    produce = Producer(slot)
    outcome = coordinate(slot, lambda r: True, produce, wait_timeout_s=5)
    assert (outcome.role, produce.calls) == ("leader", 1)


def _finishes_within(seconds: float, call) -> BaseException | None:
    """Run `call` in a thread; fail the test if it is still running after `seconds` (a blocked open)."""
    import threading

    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as error:  # handed back to the test
            raised.append(error)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still blocked after {seconds} s"
    return raised[0] if raised else None


def test_fifos_planted_as_coordination_files_do_not_outlast_the_wait_timeout(tmp_path: Path) -> None:
    """A FIFO as K.leader.json and K.json: a waiter's reads neither block nor trust them; --wait-timeout holds."""
    slot = SharedSlot(tmp_path, "k1")
    os.mkfifo(slot.leader_path)
    os.mkfifo(slot.record_path)
    with filelock.FileLock(slot.lock_path, thread_local=False):
        started = time.monotonic()
        error = _finishes_within(
            10, lambda: coordinate(slot, lambda r: True, Producer(slot), wait_timeout_s=1, poll_interval_s=0.05)
        )
        assert isinstance(error, HookError) and "timed out after 1 s" in str(error)
        assert time.monotonic() - started < 5
    assert read_record(slot) == (None, "not trusted: a FIFO, not a regular file")


def test_a_node_planted_where_the_leader_publishes_is_refused_before_tuning(tmp_path: Path) -> None:
    slot = SharedSlot(tmp_path, "k1")
    os.mkfifo(slot.record_path)
    os.mkfifo(slot.leader_path)
    produce = Producer(slot)
    error = _finishes_within(10, lambda: coordinate(slot, lambda r: True, produce, wait_timeout_s=1))
    assert isinstance(error, UserError) and "a FIFO, not a regular file" in str(error)
    assert produce.calls == 0 and stat.S_ISFIFO(os.lstat(slot.record_path).st_mode)


def test_a_fifo_planted_as_the_lock_file_is_refused_at_once(tmp_path: Path) -> None:
    slot = SharedSlot(tmp_path, "k1")
    os.mkfifo(slot.lock_path)
    error = _finishes_within(10, lambda: coordinate(slot, lambda r: True, Producer(slot), wait_timeout_s=30))
    # someone else's doing: the hook tunes locally on it (hook/run.py, tests/test_hook_lock_degrade.py)
    assert isinstance(error, LockUnavailable) and "k1.lock is a FIFO" in str(error)

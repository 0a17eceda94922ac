"""Issue 46: another user cannot stop a hook job by holding or planting its lock in a shared directory.

The hook tunes locally instead, publishes nothing, and says why in one line: the job gets its config. The stand-in
tune() of tests/fakes/hook.py keeps these fast; the coordination (directories, flock, owners) is real.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest
from tests.fakes.hook import FakeTune

from autotune.hook import HookError, HookRequest, run_hook
from autotune.hook.coordinate import HookRecord, SharedSlot, coordinate
from autotune.tuner import TuneRequest

OTHER = 65534  # nobody
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's lock file needs root (os.chown)")


def _request(tmp_path: Path, shared: Path, wait_timeout_s: float = 3600.0) -> HookRequest:
    tuning = TuneRequest.of(
        model="tiny-gpt2", device="cpu", memory_budget="1GiB", seq_len=32, out=str(tmp_path / "ds.json")
    )
    return HookRequest(tuning, str(shared), wait_timeout_s=wait_timeout_s, poll_interval_s=0.05)


def _hook_dir_another_user_prepared(shared: Path) -> Path:
    """`hook/` pre-created world-writable in a world-writable shared directory, as the issue's other user did."""
    shared.mkdir(mode=0o777)
    shared.chmod(0o1777)
    hook = shared / "hook"
    hook.mkdir()
    hook.chmod(0o777)
    return hook


def test_a_world_writable_hook_directory_is_not_coordinated_in_and_the_job_gets_a_config(tmp_path: Path) -> None:
    hook = _hook_dir_another_user_prepared(tmp_path / "shared")
    said: list[str] = []
    fake = FakeTune()
    result = run_hook(_request(tmp_path, tmp_path / "shared"), environ={}, tune_fn=fake, say=said.append)
    assert json.loads((tmp_path / "ds.json").read_text())["train_micro_batch_size_per_gpu"] >= 1
    assert result.role == "leader" and len(fake.requests) == 1 and not fake.requests[0].output.use_cache
    assert len(said) == 1 and "writable by every user" in said[0] and "tuning locally" in said[0]
    assert sorted(p.name for p in hook.iterdir()) == []  # no lock taken, nothing published


@as_root
def test_a_lock_held_by_another_user_degrades_after_the_wait_instead_of_failing(tmp_path: Path) -> None:
    """The issue's 0666 lock file, owned and flock-held by another user, in a directory we trust: the wait ends
    in a local tuning (exit 4 with no config before)."""
    shared = tmp_path / "shared"
    request = _request(tmp_path, shared, wait_timeout_s=0.5)
    (shared / "hook").mkdir(parents=True)
    said: list[str] = []
    holders = []
    original = coordinate

    def plant_then_coordinate(slot: SharedSlot, **kwargs):
        slot.lock_path.touch(mode=0o666)
        os.chown(slot.lock_path, OTHER, OTHER)
        handle = open(slot.lock_path)  # noqa: SIM115 - held for the test's length, as the other user's process
        fcntl.flock(handle, fcntl.LOCK_EX)  # flock is per open file: our hook's own open cannot take it
        holders.append(handle)
        return original(slot, **kwargs)

    import autotune.hook.run as run_module

    run_module.coordinate = plant_then_coordinate  # type: ignore[assignment]
    try:
        result = run_hook(request, environ={}, tune_fn=FakeTune(), say=said.append)
    finally:
        run_module.coordinate = original  # type: ignore[assignment]
        for handle in holders:
            handle.close()
    assert result.config_path.exists() and result.role == "leader"
    assert any("belongs to uid 65534" in line and "tuning locally" in line for line in said), said


def _never() -> HookRecord:
    raise AssertionError("the lock is held: this process never produces")


def test_our_own_tuner_holding_the_lock_is_still_waited_for(tmp_path: Path) -> None:
    """A lock held by this user (another process of the same job) is no one else's: the timeout stays a failure."""
    shared = tmp_path / "shared"
    slot = SharedSlot(shared / "hook", "k")
    slot.directory.mkdir(parents=True)
    slot.lock_path.touch()
    with open(slot.lock_path) as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        with pytest.raises(HookError, match="timed out") as raised:
            coordinate(slot, accept=lambda r: True, produce=_never, wait_timeout_s=0.2, poll_interval_s=0.05)
    assert type(raised.value) is HookError

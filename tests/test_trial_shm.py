"""DeepSpeed's CPU all-reduce segments in /dev/shm: a trial removes the ones its rendezvous made, and only
those (trial/launch/shm.py). The real launcher trial is in tests/test_script_mode.py, beside the user's scripts."""

from __future__ import annotations

import os
import time
from pathlib import Path

from autotune.trial.launch.shm import SEGMENT_PREFIX, command_ports, remove_segments, segment_port

UID = os.getuid()


def _segment(directory: Path, port: int, rank: int = 0, uid: int = UID, address: str = "127.0.0.1") -> Path:
    path = directory / f"{SEGMENT_PREFIX}_{uid}_{address}_{port}_{rank}"
    path.write_bytes(b"\0" * 16)
    return path


def test_segment_names_are_read_as_deepspeed_writes_them() -> None:
    assert segment_port(f"{SEGMENT_PREFIX}_{UID}_127.0.0.1_29500_0", UID) == 29500
    assert segment_port(f"{SEGMENT_PREFIX}_{UID}_node_a_33517_3", UID) == 33517  # an address with '_'
    assert segment_port(f"{SEGMENT_PREFIX}_{UID + 1}_127.0.0.1_29500_0", UID) is None  # another user's
    assert segment_port(f"{SEGMENT_PREFIX}_{UID}_127.0.0.1__0", UID) is None  # MASTER_PORT unset
    assert segment_port("psm_abc", UID) is None


def test_ports_are_those_the_command_can_rendezvous_on() -> None:
    assert command_ports(["python", "train.py"], 41000) == {41000, 29500}  # the launcher's default, if it is one
    assert command_ports(["deepspeed", "--master_port", "41001", "train.py"], 41000) == {41000, 41001}
    assert command_ports(["torchrun", "--master-port=41002", "t.py"], None) == {41002}
    assert command_ports(["deepspeed", "--master_port", "{master_port}"], 41000) == {41000, 29500}


def test_only_the_trials_own_segments_go(tmp_path: Path) -> None:
    earlier = _segment(tmp_path, 41000, rank=1)  # same port, made before the trial started: another job's
    time.sleep(0.6)
    started = earlier.stat().st_ctime + 1.5  # the 1 s tolerance for whole-second filesystems, and more
    mine = [_segment(tmp_path, 41000, rank) for rank in (0, 2)]
    other_port = _segment(tmp_path, 41001)
    other_user = _segment(tmp_path, 41000, rank=5, uid=UID + 1)
    removed = remove_segments([41000], since=started, directory=tmp_path)
    assert sorted(removed) == sorted(mine)
    assert earlier.exists() and other_port.exists() and other_user.exists()


def test_a_missing_directory_is_not_an_error(tmp_path: Path) -> None:
    assert remove_segments([29500], since=0.0, directory=tmp_path / "absent") == []

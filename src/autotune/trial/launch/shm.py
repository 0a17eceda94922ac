"""DeepSpeed's CPU shared-memory all-reduce segments, removed after the trial that made them.

On the CPU accelerator, when every rank is on one machine (the DeepSpeed launcher sets LOCAL_SIZE to the
local rank count), each rank creates `/dev/shm/deepspeed_allreduce_buffer_{uid}_{MASTER_ADDR}_{MASTER_PORT}_{rank}`
(deepspeed 0.19.8 ops/csrc/cpu/comm/shm.cpp:94 and 340-368, `shm_initialize`; the name's parts from the
environment, shm_interface.cpp:31-46). The only `shm_unlink` is in `shared_close` (shm.cpp:79-85), which nothing
calls (0.19.8), so every such run leaves 66 MiB per rank (`sizeof(struct allreduce_workspace)`, 69,206,024 bytes on this
machine) in a RAM-backed filesystem until reboot: 52 segments, 3.4 GiB, had piled up on our CI machine. A trial
that ran the user's command through `deepspeed` on the CPU backend leaves them too; the trial removes what its
own rendezvous port made, created after it started, and nothing else.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

SHM_DIRECTORY = Path("/dev/shm")
SEGMENT_PREFIX = "deepspeed_allreduce_buffer"
LAUNCHER_DEFAULT_PORT = 29500  # deepspeed/constants.py:12 TORCH_DISTRIBUTED_DEFAULT_PORT, the launcher's default
_PORT_FLAGS = ("--master_port", "--master-port")


def segment_port(name: str, uid: int) -> int | None:
    """The rendezvous port in one of this user's segment names, or None for anything else."""
    prefix = f"{SEGMENT_PREFIX}_{uid}_"
    if not name.startswith(prefix):
        return None
    parts = name[len(prefix) :].rsplit("_", 2)  # address (may hold '_'), port, rank
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    return int(parts[1])


def command_ports(argv: Sequence[str], given: int | None) -> set[int]:
    """The ports a trial's command may rendezvous on: the one we handed it, any `--master_port` it names, and
    the DeepSpeed launcher's default when it names none."""
    named: set[int] = set()
    for index, word in enumerate(argv):
        for flag in _PORT_FLAGS:
            value = word[len(flag) + 1 :] if word.startswith(flag + "=") else None
            if word == flag and index + 1 < len(argv):
                value = argv[index + 1]
            if value is not None and value.isdigit():
                named.add(int(value))
    ports = named or {LAUNCHER_DEFAULT_PORT}
    return ports | ({given} if given is not None else set())


def remove_segments(ports: Iterable[int], since: float, directory: Path = SHM_DIRECTORY) -> list[Path]:
    """Unlink this user's segments for `ports` whose inode changed at or after `since` (epoch seconds): those
    the trial's ranks made. An older one, or another port's, belongs to another job and is left alone."""
    wanted, uid = set(ports), os.getuid()
    removed: list[Path] = []
    try:
        entries = list(directory.iterdir())
    except OSError:
        return removed
    for entry in entries:
        if segment_port(entry.name, uid) not in wanted:
            continue
        try:
            if entry.stat().st_ctime + 1.0 < since:  # 1 s: filesystems that keep whole seconds
                continue
            entry.unlink()
        except OSError:
            continue
        removed.append(entry)
    return removed


__all__ = ["command_ports", "remove_segments", "segment_port"]

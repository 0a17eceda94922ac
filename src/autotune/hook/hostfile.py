"""The DeepSpeed launcher's hostfile, built from the job's node list.

The deepspeed launcher reads `host slots=N` lines, one per node, in rank order: the first host is
node rank 0. The file is written atomically because every node of a job may write the same shared
path at once, and the launcher must never read a half-written list.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from autotune.atomic import atomic_write_text
from autotune.errors import UserError


def hostfile_text(hosts: Sequence[str], slots: int) -> str:
    if not hosts:
        raise UserError("cannot write a hostfile for an empty node list")
    if slots <= 0:
        raise UserError(f"a hostfile needs a positive slot count per node, got {slots}")
    if len(set(hosts)) != len(hosts):
        raise UserError(f"the node list repeats a host: {', '.join(hosts)}")
    return "".join(f"{host} slots={slots}\n" for host in hosts)


def write_hostfile(path: str | Path, hosts: Sequence[str], slots: int) -> Path:
    return atomic_write_text(path, hostfile_text(hosts, slots))


def read_hostfile(path: str | Path) -> list[tuple[str, int]]:
    """Hosts and slots from a DeepSpeed hostfile (comments and blank lines skipped)."""
    entries: list[tuple[str, int]] = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as error:
        raise UserError(f"cannot read hostfile {path}: {error.strerror or error}") from None
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        host, _, slots = text.partition(" ")
        slots = slots.strip()
        if not slots.startswith("slots=") or not slots[len("slots=") :].isdigit():
            raise UserError(f"hostfile {path} line {number}: expected 'HOST slots=N', got {line.strip()!r}")
        entries.append((host, int(slots[len("slots=") :])))
    if not entries:
        raise UserError(f"hostfile {path} lists no host")
    return entries

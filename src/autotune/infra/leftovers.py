"""Temporary directories that outlive a SIGKILLed owner are removed by the next run.

A process killed with SIGKILL (SLURM after KillWait, the OOM killer, `kill -9`) runs no cleanup,
so each directory autotune creates for trials, warm workers or hook staging carries an owner file:
host, pid and that process's start time (so a reused pid is not mistaken for the owner). Before
creating a new one, a run removes the directories in the same parent whose owner on this host is
gone. Directories owned by processes on other hosts (a shared trial directory) are left to them,
and a directory without an owner file (being created right now) is never touched.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from pathlib import Path

import psutil

from autotune.infra.sharing import make_dirs

OWNER_FILE = ".autotune-owner.json"


def _start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def claim(directory: Path) -> None:
    """Mark `directory` as this process's (on this host, since its start)."""
    info = {"host": socket.gethostname(), "pid": os.getpid(), "started": _start_time(os.getpid())}
    (directory / OWNER_FILE).write_text(json.dumps(info))


def owner_gone(directory: Path) -> bool:
    """True only when the owner file names a process on this host that no longer runs."""
    try:
        info = json.loads((directory / OWNER_FILE).read_text())
        host, pid, started = info["host"], int(info["pid"]), info["started"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if host != socket.gethostname():
        return False
    now = _start_time(pid)
    return now is None or (started is not None and abs(now - float(started)) > 1.0)


def sweep(parent: Path, prefix: str) -> list[Path]:
    """Remove `parent/prefix*` directories whose owner is gone; returns what was removed."""
    removed: list[Path] = []
    try:
        entries = list(Path(parent).iterdir())
    except OSError:
        return removed
    for entry in entries:
        if entry.name.startswith(prefix) and entry.is_dir() and not entry.is_symlink() and owner_gone(entry):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def owned_tempdir(prefix: str, parent: Path | None = None) -> Path:
    """mkdtemp(prefix, parent) after sweeping the dead owners' leftovers with the same prefix."""
    where = make_dirs(Path(parent)) if parent is not None else Path(tempfile.gettempdir())
    sweep(where, prefix)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=where))
    claim(path)
    return path

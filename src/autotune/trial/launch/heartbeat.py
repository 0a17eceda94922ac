"""The tuner's heartbeat to its workers: a file in the pool's or trial's directory whose modification time it renews.

A worker on this host watches the tuner's pid (trial/worker/owner_watch.py); a worker on another node cannot (that
pid is nobody's there), and a tuner killed with SIGKILL cannot stop the `srun` step (or the DeepSpeed launcher over
pdsh) that runs it: a warm pool's step would hold every node's accelerators until the allocation ends, a fresh
trial's until its steps end or, hung, the allocation does, and the user's own `srun` after the hook would wait behind
it. So the warm pool (in its directory) and every fresh launch (in the trial's directory) renew this file while they
live, and every worker exits once the file has stopped changing for `stale_s` (the worker compares successive
modification times with each other, never with its own clock, so clock skew between nodes does not matter).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

HEARTBEAT_FILE = "owner-heartbeat"
HEARTBEAT_INTERVAL_S = 5.0
# How long a worker waits for an unchanged heartbeat before it exits. A worker on another node reads the file's
# attributes through its network file system's cache: NFS caches a file's attributes for up to 60 s by default
# (nfs(5), acregmax), so a renewal can look absent for that long. Twice that: a live tuner is never mistaken for a
# dead one, and a dead tuner's step frees the allocation within two minutes.
HEARTBEAT_STALE_S = 120.0


@dataclass(frozen=True)
class HeartbeatTiming:
    """How often the tuner renews its heartbeat and how long a worker waits on an unchanged one (tests shorten
    both)."""

    interval_s: float = HEARTBEAT_INTERVAL_S
    stale_s: float = HEARTBEAT_STALE_S

    def worker_args(self, path: Path) -> list[str]:
        """The worker's arguments that make it watch `path` (trial/worker/main.py --owner-heartbeat)."""
        return ["--owner-heartbeat", str(path), "--owner-stale-s", str(self.stale_s)]


class OwnerHeartbeat:
    """Renews `path` every `interval_s` on a daemon thread until `stop()`; a context manager."""

    def __init__(self, path: Path, interval_s: float = HEARTBEAT_INTERVAL_S) -> None:
        self.path = path
        self.interval_s = interval_s
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> OwnerHeartbeat:
        """Create the file (workers read its first modification time at start) and begin renewing it."""
        self.path.touch()
        self._thread = threading.Thread(target=self._beat, name="autotune-heartbeat", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stopped.wait(self.interval_s):
            try:
                os.utime(self.path)
            except FileNotFoundError:  # the pool directory went first: nothing left to keep alive
                return

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> OwnerHeartbeat:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

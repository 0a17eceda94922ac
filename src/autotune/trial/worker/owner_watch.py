"""A worker exits on its own once the tuner that launched it is gone, even mid-step or hung: nothing outlives it.

The tuner's kill path cannot run if the tuner itself is SIGKILLed, and torchrun puts workers in their own sessions,
so each worker watches for itself: on the tuner's host, the tuner's pid (`watch_owner`); on any node, the pool's
heartbeat file (`watch_heartbeat`, renewed by trial/launch/heartbeat.py), which is what a worker on another node has.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

OWNER_POLL_S = 0.5


def owner_alive(owner_pid: int) -> bool:
    """Running, or at least not a zombie that nobody has reaped yet."""
    try:
        state = Path(f"/proc/{owner_pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except FileNotFoundError:
        return False
    except (OSError, IndexError):  # no /proc: ask the kernel directly
        try:
            os.kill(owner_pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True


def watch_owner(owner_pid: int, interval_s: float = OWNER_POLL_S) -> None:
    """Exit (status 1) as soon as the process `owner_pid` on this host is gone."""

    def watch() -> None:
        while owner_alive(owner_pid):
            time.sleep(interval_s)
        os._exit(1)

    threading.Thread(target=watch, name="owner-watch", daemon=True).start()


def _modified_ns(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def heartbeat_stale(
    path: Path,
    stale_s: float,
    interval_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Block until `path`'s modification time has not changed for `stale_s` by this process's clock; return how long
    it stood still. Only successive modification times are compared, so the writer's clock never matters."""
    last, changed_at = _modified_ns(path), clock()
    while True:
        sleep(interval_s)
        now = _modified_ns(path)
        if now != last:
            last, changed_at = now, clock()
        elif clock() - changed_at > stale_s:
            return clock() - changed_at


def watch_heartbeat(path: Path, stale_s: float) -> None:
    """Exit (status 1) once the tuner's heartbeat file has stood still for `stale_s`: under srun that ends the step
    (`--kill-on-bad-exit`), under torchrun the other ranks with it."""

    def watch() -> None:
        # a tenth of the limit: 12 s at the default, so 512 ranks ask a shared file system ~43 times a second
        still = heartbeat_stale(path, stale_s, interval_s=max(0.05, stale_s / 10))
        print(f"autotune worker: the tuner's heartbeat stood still {still:.0f} s; it is gone, exiting", file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)

    threading.Thread(target=watch, name="heartbeat-watch", daemon=True).start()

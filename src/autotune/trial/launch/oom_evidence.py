"""Whether the kernel's OOM killer sent a SIGKILL, or someone else did.

A rank that dies by SIGKILL without a word may have met the OOM killer, or `kill -9`, a scheduler's
preemption, a watchdog. Only evidence makes it an out-of-memory: the memory cgroup's `oom_kill` count
rising during the trial (cgroup v2 `memory.events`, v1 `memory.oom_control`, both kernel >= 4.13), or the
kernel's own record "Killed process <pid>" for one of the trial's pids (mm/oom_kill.c `__oom_kill_process`,
read from /dev/kmsg where this user may). Without either, the death is inconclusive (trial/outcome.py).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from autotune.trial.outcome import is_sigkill
from autotune.trial.rank_report import pid_path

CGROUP_ROOT = Path("/sys/fs/cgroup")
KMSG = Path("/dev/kmsg")
_KMSG_READ_LIMIT = 4 * 2**20  # the kernel's ring buffer is at most CONFIG_LOG_BUF_SHIFT=25 (32 MiB); we read the tail
_KILLED = re.compile(r"Killed process (\d+)")


def _own_cgroup_paths(proc_cgroup: Path) -> list[tuple[str, str]]:
    """This process's cgroup path for the unified hierarchy ("0::/x") and for v1's memory controller."""
    paths = []
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and (parts[1] == "" or "memory" in parts[1].split(",")):
            paths.append((parts[1] or "unified", parts[2].lstrip("/")))
    return paths


def oom_kill_files(root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> list[Path]:
    """The files whose `oom_kill` line counts kills in this process's memory cgroup (the first that exist).

    Inside a container the hierarchy is often mounted at the container's own cgroup, so the path from
    /proc/self/cgroup is tried below the mount and the mount itself is the fallback.
    """
    found = []
    for kind, path in _own_cgroup_paths(proc_cgroup):
        if kind == "unified":
            candidates = [root / path / "memory.events", root / "memory.events"]
        else:
            candidates = [root / "memory" / path / "memory.oom_control", root / "memory" / "memory.oom_control"]
        existing = next((c for c in candidates if c.is_file()), None)
        if existing is not None:
            found.append(existing)
    return found


def _oom_kills(path: Path) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def kernel_oom_record(pids: set[int], kmsg: Path = KMSG) -> str | None:
    """The kernel log's "Killed process <pid>" line for one of `pids`, where this user may read /dev/kmsg."""
    if not pids:
        return None
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    found, read = None, 0
    try:
        while read < _KMSG_READ_LIMIT:
            try:
                record = os.read(fd, 8192)  # one record per read on /dev/kmsg; a plain file gives chunks
            except BlockingIOError:
                break
            except OSError:  # EPIPE: the record we were at was overwritten; go on with the next
                continue
            if not record:
                break
            read += len(record)
            text = record.decode(errors="replace")
            for line in text.splitlines():
                match = _KILLED.search(line)
                if match and int(match.group(1)) in pids:
                    found = line.split(";", 1)[-1].strip()
    finally:
        os.close(fd)
    return found


@dataclass(frozen=True)
class OomKillWatch:
    """The memory cgroup's OOM-kill counts when a trial started; `evidence()` after it ended."""

    counts: dict[Path, int]
    kmsg: Path = KMSG

    @classmethod
    def start(
        cls, root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup"), kmsg: Path = KMSG
    ) -> OomKillWatch:
        return cls({path: _oom_kills(path) for path in oom_kill_files(root, proc_cgroup)}, kmsg)

    def evidence(self, pids: set[int] | None = None) -> str | None:
        """Why we believe the OOM killer struck during the trial, or None when nothing says so."""
        for path, before in self.counts.items():
            now = _oom_kills(path)
            if now > before:
                return f"the memory cgroup's oom_kill count rose by {now - before} during the trial ({path})"
        record = kernel_oom_record(pids or set(), self.kmsg)
        return f"kernel log: {record}" if record else None

    def explain(self, exit_codes: dict[int, int], out_dir: Path, ranks: range) -> str | None:
        """evidence() when a rank died by SIGKILL (the only way the OOM killer ends a process), else None."""
        if not any(is_sigkill(code) for code in exit_codes.values()):
            return None
        return self.evidence(rank_pids(out_dir, ranks))


def rank_pids(out_dir: Path, ranks: range) -> set[int]:
    """The pids the trial's ranks wrote at start (trial/rank_report.py pid_path)."""
    pids = set()
    for rank in ranks:
        try:
            pids.add(int(pid_path(out_dir, rank).read_text()))
        except (OSError, ValueError):
            continue
    return pids

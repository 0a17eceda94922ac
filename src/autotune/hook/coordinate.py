"""One tuner per run key, everyone else waits: the lock / wait / publish protocol in a shared directory.

Files for a run key K, all in the shared (cache) directory `<dir>/hook/`:
- `K.lock`: an flock (filelock.FileLock). The kernel drops it when its holder dies, even by SIGKILL, so a
  killed tuner never blocks a later job; a filesystem without flock is an error, not a silent
  fallback to a lock file that a dead process would leave behind.
- `K.json`: the published result, written atomically (temp file + rename), with a sha256 over its
  content and an HMAC made with this user's (or the shared group's) key (infra/integrity.py). A reader sees the old
  file, the new file or none, never half of one; a file that fails its checksum (disk fault, manual edit) or
  its signature (written by someone without the key) is treated as absent, and the next tuner replaces it.
  A record is believed only from a file this user or the directory's shared group owns (infra/sharing.py),
  parsed through a strict schema; anything else is ignored with the reason and tuned again.
- `K.leader.json`: who holds the lock and since when; informational, for the timeout message, which
  also names the processes on this node that hold the lock file open (a stale note names a dead pid).

A process first looks for an acceptable result (a cache hit costs one file read). Otherwise it
tries the lock without blocking: the winner checks again, tunes, publishes; the others poll for the
result until their deadline. If the tuner dies, its lock is released and a waiting process takes
over; so there is one tuner at a time per key, however many processes run the hook.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import stat
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from errno import EACCES, ENOSYS, EPERM
from pathlib import Path
from typing import Literal

import filelock
import psutil
from pydantic import TypeAdapter, ValidationError

from autotune.errors import HookError, UserError  # HookError is importable from here, as before
from autotune.infra.atomic import atomic_write_json, atomic_write_text, refuse_non_regular
from autotune.infra.integrity import KeyRefused, sign, signing_key, verify
from autotune.infra.output_paths import file_kind
from autotune.infra.sharing import distrust_reason, file_mode_for, make_dirs
from autotune.search.cache import directory_distrust_reason

RECORD_FORMAT = 1
Role = Literal["hit", "leader", "follower"]
RecordStatus = Literal["complete", "fallback", "failed"]


@dataclass(frozen=True)
class HookRecord:
    """What the tuner publishes for its run key; every process writes `config_text` byte for byte."""

    key: str
    status: RecordStatus  # complete: tuning finished; fallback: cut short, best effort; failed: no config
    config_text: str | None
    source: str  # "tuned" | "results cache" | "best verified so far" | "plan only" | "none"
    verified: bool  # the config ran for real in a trial
    job_id: str | None
    hardware: str  # fingerprint of the tuner's node, so another job on other hardware re-tunes
    leader: str  # "host pid N"
    created: float  # wall clock (time.time()) when published
    warning: str | None = None
    error_kind: str | None = None  # for "failed": "user" | "nothing_fits" | "failed"
    error: str | None = None
    details: dict = field(default_factory=dict)  # trials, speed, stop reason, report path

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> HookRecord:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    @property
    def config_sha256(self) -> str | None:
        return hashlib.sha256(self.config_text.encode()).hexdigest() if self.config_text is not None else None


def record_digest(record: dict) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class SharedSlot:
    """The files one run key owns in the shared directory."""

    directory: Path
    key: str

    @property
    def lock_path(self) -> Path:
        return self.directory / f"{self.key}.lock"

    @property
    def record_path(self) -> Path:
        return self.directory / f"{self.key}.json"

    @property
    def leader_path(self) -> Path:
        return self.directory / f"{self.key}.leader.json"


def record_file(slot: SharedSlot, body: dict) -> dict:
    """The published file's content: the record, its sha256 (disk faults) and its HMAC (authorship: infra/integrity.py,
    keyed by this user's key, or the shared group's in a group directory). Without a usable key it is unsigned,
    and readers tune again rather than trust it."""
    data = {"format": RECORD_FORMAT, "record": body, "sha256": record_digest(body)}
    with contextlib.suppress(KeyRefused):
        data["hmac"] = sign(signing_key(slot.directory), "hook-record", slot.key, json.dumps(body, sort_keys=True))
    return data


def publish(slot: SharedSlot, record: HookRecord) -> None:
    atomic_write_json(slot.record_path, record_file(slot, record.to_dict()))


def _signature_problem(slot: SharedSlot, data: dict) -> str | None:
    try:
        key = signing_key(slot.directory)
    except KeyRefused as error:
        return f"cannot be verified: {error}"
    if not verify(key, data.get("hmac"), "hook-record", slot.key, json.dumps(data["record"], sort_keys=True)):
        return "its signature does not verify (published by someone without this user's or group's key)"
    return None


_RECORD_SCHEMA = TypeAdapter(HookRecord)


def _refuse_planted(path: Path) -> None:
    """PermissionError when `path` exists as anything but a regular file: a FIFO planted as a coordination file
    would block its reader forever (past --wait-timeout), and a device node is no file of ours."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        raise PermissionError(f"{file_kind(mode)}, not a regular file")


def _read_trusted(path: Path) -> str:
    """The file's text, read through a descriptor that is checked against the trust model (no symlinks).

    Type first, then a non-blocking open (a FIFO swapped in between cannot block it), then the trust check
    on the descriptor itself."""
    _refuse_planted(path)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, encoding="utf-8", errors="strict") as handle:
        why = distrust_reason(os.fstat(handle.fileno()), path.parent)
        if why:
            raise PermissionError(why)
        return handle.read()


def read_record(slot: SharedSlot) -> tuple[HookRecord | None, str | None]:
    """(record, None), (None, None) when absent, or (None, why) when present but not to be trusted."""
    try:
        text = _read_trusted(slot.record_path)
    except FileNotFoundError:
        return None, None
    except PermissionError as error:
        return None, f"not trusted: {error}"
    except (OSError, UnicodeDecodeError) as error:
        return None, f"unreadable: {getattr(error, 'strerror', None) or error}"
    try:
        data = json.loads(text)
        body = data["record"]
        if data.get("format") != RECORD_FORMAT:
            return None, f"format {data.get('format')!r}, expected {RECORD_FORMAT}"
        if record_digest(body) != data["sha256"]:
            return None, "checksum mismatch"
        try:
            record = _RECORD_SCHEMA.validate_json(json.dumps(body), strict=True)
        except ValidationError as error:
            detail = error.errors()[0]
            return None, f"malformed: {'.'.join(map(str, detail['loc']))}: {detail['msg']}"
        if record.key != slot.key:
            return None, f"belongs to run key {record.key}"
        if why := _signature_problem(slot, data):
            return None, why
        if record.status != "failed" and not isinstance(json.loads(record.config_text or "null"), dict):
            return None, "config is not a JSON object"
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        return None, f"corrupt ({type(error).__name__})"
    return record, None


@dataclass(frozen=True)
class Coordinated:
    record: HookRecord
    role: Role
    waited_s: float  # before this process had a record or the lock (a tuner's own tuning time is not waiting)
    ignored: str | None = None  # why a record found in the slot was not trusted, if one was


def local_lock_holders(lock_path: Path) -> list[int]:
    """Pids on this node, other than ours, with the lock file open: the holder (waiters only open it briefly)."""
    target = os.path.realpath(lock_path)
    holders = []
    for process in psutil.process_iter():
        if process.pid == os.getpid():
            continue
        try:
            if any(f.path == target for f in process.open_files()):
                holders.append(process.pid)
        except (psutil.Error, OSError):
            continue
    return holders


def _describe(pid: int) -> str:
    try:
        return f"pid {pid} ({' '.join(psutil.Process(pid).cmdline())[:80]})"
    except psutil.Error:
        return f"pid {pid}"


def _leader_note(slot: SharedSlot, holders: Callable[[Path], list[int]] = local_lock_holders) -> str:
    """Who holds the lock: the note the tuner left, unless this node shows that the note is stale."""
    info = read_leader_note(slot)
    try:
        since = time.strftime("%H:%M:%S", time.localtime(info["started"]))
        note = f"the tuning process ({info['host']} pid {info['pid']}, tuning since {since})"
        host, pid = info["host"], int(info["pid"])
    except (ValueError, KeyError, TypeError):
        note, host, pid = "the tuning process", None, None
    here = holders(slot.lock_path)
    if not here or (host == socket.gethostname() and pid in here):
        return note
    stale = f"; {slot.leader_path.name} names {host} pid {pid}, which does not hold it" if pid is not None else ""
    return f"the lock holder on {socket.gethostname()}, {', '.join(map(_describe, here))}{stale}"


def read_leader_note(slot: SharedSlot) -> dict:
    """The tuner's note (who, since when, how far: `progress`), or {} when absent or unreadable."""
    try:
        note = json.loads(_read_trusted(slot.leader_path))  # a FIFO planted here would block a plain read
    except (OSError, ValueError):
        return {}
    return note if isinstance(note, dict) else {}


def note_progress(slot: SharedSlot, progress: dict) -> None:
    """The tuner's progress in its note, for the processes waiting on it to print (informational only)."""
    note = read_leader_note(slot)
    if note.get("pid") == os.getpid() and note.get("host") == socket.gethostname():
        with contextlib.suppress(OSError):  # informational: a node planted since we read is not worth a failure
            atomic_write_text(slot.leader_path, json.dumps({**note, "progress": progress}) + "\n")


# How often a waiting process says it is still waiting: a SLURM log shows it is alive and what it waits for.
WAIT_REPORT_INTERVAL_S = 60.0


class LockUnavailable(HookError):
    """The job's lock in the shared directory cannot be had because of someone else: a lock file another user
    created and holds (or made unreadable to us), or a node planted in its place. Not the job's fault, so the hook
    tunes locally and publishes nothing (hook/run.py) instead of failing the job (issue 46: another user who
    pre-created `hook/` and the lock file and held flock on it made every job exit 2 in 7 s, or exit 4 after the
    hour-long --wait-timeout)."""


def foreign_lock(slot: SharedSlot) -> str | None:
    """Why the lock file is someone else's (its owner is another user), or None."""
    try:
        owner = os.lstat(slot.lock_path).st_uid
    except OSError:
        return None
    if owner == os.geteuid():
        return None
    return f"{slot.lock_path} belongs to uid {owner}, not to this user (uid {os.geteuid()})"


def _lock(slot: SharedSlot) -> filelock.FileLock:
    try:
        _refuse_planted(slot.lock_path)
    except PermissionError as error:
        raise LockUnavailable(f"{slot.lock_path} is {error} (planted by someone else?)") from None
    # fallback_to_soft=False: a marker-file lock outlives a killed holder; refuse it rather than risk that
    return filelock.FileLock(
        slot.lock_path, mode=file_mode_for(slot.directory), fallback_to_soft=False, thread_local=False
    )


def _try_lock(lock: filelock.FileLock, slot: SharedSlot) -> bool:
    try:
        lock.acquire(blocking=False)
    except filelock.Timeout:
        return False
    except OSError as error:
        if error.errno == ENOSYS:
            raise UserError(
                f"{slot.directory} does not support file locks (flock); use a shared directory that does"
                " (NFS with lockd, or Lustre mounted with -o flock) for --cache-dir"
            ) from None
        if error.errno in (EACCES, EPERM) or foreign_lock(slot):
            raise LockUnavailable(f"cannot lock {slot.lock_path}: {error.strerror or error}") from None
        raise UserError(f"cannot lock {slot.lock_path}: {error.strerror or error}") from None
    return True


def _look(slot: SharedSlot, vet: Callable[[HookRecord], str | None]) -> tuple[HookRecord | None, str | None]:
    record, problem = read_record(slot)
    if record is not None and record.config_text is not None and (why := vet(record)):
        return None, why
    return record, problem


def coordinate(
    slot: SharedSlot,
    accept: Callable[[HookRecord], bool],
    produce: Callable[[], HookRecord],
    wait_timeout_s: float,
    poll_interval_s: float = 0.2,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    vet: Callable[[HookRecord], str | None] = lambda record: None,
    waiting: Callable[[float], None] = lambda waited_s: None,
) -> Coordinated:
    """Return an acceptable published record, producing and publishing it if this process wins the lock.

    `vet` is asked about every record read from the slot (not one this process produced): a reason
    (e.g. DeepSpeed's parser refusing its config) makes the record count as untrusted. `waiting` is told the
    seconds waited when this process starts waiting for another tuner, and every WAIT_REPORT_INTERVAL_S after."""
    try:
        make_dirs(slot.directory)
    except OSError as error:
        raise UserError(f"cannot use {slot.directory} for the hook's files: {error.strerror or error}") from None
    if why := directory_distrust_reason(slot.directory):  # another user could hold or plant the lock there
        raise LockUnavailable(f"the hook's directory is not safe to coordinate in: {why}")
    started = clock()
    deadline = started + wait_timeout_s
    lock = _lock(slot)
    ignored = None
    first_look = True
    next_report = started
    while True:
        record, problem = _look(slot, vet)
        ignored = problem or ignored
        if record is not None and accept(record):
            return Coordinated(record, "hit" if first_look else "follower", clock() - started, ignored)
        first_look = False
        if _try_lock(lock, slot):
            break
        if clock() >= deadline:
            if foreign := foreign_lock(slot):
                raise LockUnavailable(f"timed out after {wait_timeout_s:.0f} s waiting for the lock: {foreign}")
            raise HookError(
                f"timed out after {wait_timeout_s:.0f} s waiting for {_leader_note(slot)} to publish a config"
                f" (lock {slot.lock_path}); raise --wait-timeout or look at that process"
            )
        if clock() >= next_report:
            waiting(clock() - started)
            next_report += WAIT_REPORT_INTERVAL_S
        sleep(poll_interval_s)
    waited = clock() - started
    try:
        record, problem = _look(slot, vet)  # someone may have published between our read and the lock
        ignored = problem or ignored
        if record is not None and accept(record):
            return Coordinated(record, "follower", waited, ignored)
        refuse_non_regular(slot.record_path)  # a node planted where we publish: said now, not after tuning
        note = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(), "key": slot.key}
        with contextlib.suppress(OSError):  # the note only names us in a waiter's timeout message
            atomic_write_text(slot.leader_path, json.dumps(note) + "\n")
        record = produce()
        publish(slot, record)
        return Coordinated(record, "leader", waited, ignored)
    finally:
        lock.release()

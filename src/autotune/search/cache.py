"""Results cache: SQLite, JSON payloads, no pickle.

A run key ties a cached answer to everything that decides it; trials are stored as they finish (a run resumes) and
the recommendation last (a repeat run answers without trials). What is read back is not taken on faith: a cache
others could have written is not opened, every row carries an HMAC and is parsed through a typed schema, and a
corrupt database is moved aside and rebuilt.

Reasoning and sources: search/README.md#cache
"""

from __future__ import annotations

import json
import logging
import math
import os
import sqlite3
import stat
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import filelock
from pydantic import TypeAdapter, ValidationError

from autotune.core.ladder import Candidate
from autotune.errors import MalformedReportError
from autotune.infra.integrity import KeyRefused, sign, signing_key, verify
from autotune.infra.sharing import file_mode_for, group_shared, make_dirs, path_distrust_reason, share_file
from autotune.report.data import JsonRecord, TuneReport
from autotune.trial.trial_types import TrialResult

log = logging.getLogger(__name__)
T = TypeVar("T")

# Rows carry an HMAC (infra/integrity.py). Tables of earlier versions (`trials`, `recommendations`: no MAC) are left
# alone and never read: their rows cannot be told from rows someone else wrote.
SCHEMA = """
CREATE TABLE IF NOT EXISTS signed_trials (
    run_key TEXT NOT NULL, candidate TEXT NOT NULL, payload TEXT NOT NULL, mac TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (run_key, candidate));
CREATE TABLE IF NOT EXISTS signed_recommendations (
    run_key TEXT PRIMARY KEY, payload TEXT NOT NULL, mac TEXT NOT NULL, created REAL NOT NULL);
"""
# The files SQLite keeps beside the database: a rollback journal or WAL is replayed into it when found "hot".
SIDE_FILES = ("-journal", "-wal", "-shm")


_TRIAL_SCHEMA = TypeAdapter(TrialResult)
# SQLITE_CORRUPT and SQLITE_NOTADB (sqlite.org/rescode.html), as numbers: Python's sqlite3 names them only from 3.11
# on (with an error's sqlite_errorcode); on 3.10 there is no code to compare and is_corruption reads the message.
_CORRUPTION_CODES = {11, 26}


class MalformedRecord(ValueError):
    """A cached row that does not parse as what we wrote, or holds values no trial could have produced."""


# A stored modern memory mode must have exactly Mode's fields with their types; a classic candidate stores none.
_MODE_FIELD_TYPES = {
    "offload_ratio": (float, int),
    "zenflow": (bool,),
    "hpz_partition_size": (int,),
    "quantized_weights": (bool,),
    "quantized_gradients": (bool,),
    "super_offload": (bool,),
}


def _check_mode(mode: object) -> None:
    if not isinstance(mode, dict) or set(mode) != set(_MODE_FIELD_TYPES):
        raise MalformedRecord(f"candidate mode is not {{{', '.join(_MODE_FIELD_TYPES)}}}")
    for name, types in _MODE_FIELD_TYPES.items():
        value = mode[name]
        if type(value) not in types or (name == "offload_ratio" and not 0.0 <= value <= 1.0):
            raise MalformedRecord(f"candidate mode {name} has the wrong type or range")
    if mode["hpz_partition_size"] < 1:
        raise MalformedRecord("candidate mode hpz_partition_size is below 1")


def parse_candidate(text: str) -> Candidate:
    data = json.loads(text)
    keys = {"rung", "micro_batch", "grad_checkpointing"}
    if not isinstance(data, dict) or set(data) - {"mode"} != keys:
        raise MalformedRecord("candidate is not {rung, micro_batch, grad_checkpointing[, mode]}")
    if "mode" in data:
        _check_mode(data["mode"])
    micro_batch, checkpointing = data["micro_batch"], data["grad_checkpointing"]
    if type(micro_batch) is not int or micro_batch < 1 or type(checkpointing) is not bool:
        raise MalformedRecord("candidate micro_batch or grad_checkpointing has the wrong type")
    if not isinstance(data["rung"], str):
        raise MalformedRecord("candidate rung is not a string")
    return Candidate.from_dict(data)


def parse_trial(text: str) -> TrialResult:
    """TrialResult from its stored JSON, strictly typed; an `ok` trial must carry a finite positive speed."""
    try:
        result = _TRIAL_SCHEMA.validate_json(text, strict=True)
    except ValidationError as error:
        raise MalformedRecord(f"trial result: {error.error_count()} schema error(s), first: {_first(error)}") from None
    numbers = [result.samples_per_s, result.tokens_per_s, result.tflops_per_gpu, result.mfu, result.wall_s]
    numbers += result.step_times_s + list(result.phases.values())
    if any(n is not None and (not math.isfinite(n) or n < 0) for n in numbers):
        raise MalformedRecord("trial result holds a negative or non-finite number")
    if result.ok and not (result.samples_per_s and result.step_times_s):
        raise MalformedRecord("an ok trial result without a measured speed")
    return result


@dataclass(frozen=True, kw_only=True)
class StoredAnswer(JsonRecord):
    """A tuning's final answer as the cache stores it: the pick, its config, its report, the memory limit it was
    found under and whether memory bound the search there (tuner.cached_answer decides if it still holds)."""

    candidate: Candidate
    ds_config: dict[str, Any]
    report: TuneReport
    limit_bytes: int
    memory_bound: bool


def parse_recommendation(text: str) -> StoredAnswer:
    """A stored answer read back strictly through its types (report_data): a key missing or unknown, or a value
    of the wrong type anywhere in it, report included, raises MalformedReportError."""
    return StoredAnswer.from_json(json.loads(text), "recommendation")


def _first(error: ValidationError) -> str:
    detail = error.errors()[0]
    return f"{'.'.join(str(part) for part in detail['loc'])}: {detail['msg']}"


def is_corruption(error: sqlite3.DatabaseError) -> bool:
    """SQLite's own verdict that the file is not (or no longer) a database, as opposed to locked/read-only."""
    code = getattr(error, "sqlite_errorcode", None)
    return code in _CORRUPTION_CODES or "malformed" in str(error) or "not a database" in str(error)


def directory_distrust_reason(directory: Path) -> str | None:
    """Why files in `directory` could have been written by someone else, or None: it must be ours and closed to
    others, or the documented shared-group directory (setgid, not writable by others: infra/sharing.py)."""
    try:
        info = os.stat(directory)
    except OSError as error:
        return f"its directory {directory} cannot be examined ({error.strerror or error})"
    mode = stat.S_IMODE(info.st_mode)
    if info.st_mode & stat.S_IWOTH:
        return (
            f"its directory {directory} is writable by every user (mode {mode:04o}), so anyone could plant a"
            " journal or replace the database; give --cache-dir a directory of your own (chmod o-w), or share"
            " through a group directory (chgrp GROUP DIR && chmod 2770 DIR)"
        )
    if group_shared(directory):
        return None
    if info.st_mode & stat.S_IWGRP:
        return (
            f"its directory {directory} is writable by group {info.st_gid} (mode {mode:04o}) without the setgid"
            " bit of a shared cache; chmod g-w it, or share it as documented (chmod 2770)"
        )
    if info.st_uid != os.geteuid():
        return f"its directory {directory} belongs to uid {info.st_uid}, not to this user (uid {os.geteuid()})"
    return None


def read_only_reason(path: Path) -> str | None:
    """Why SQLite could not write the database (and its journal) here, or None."""
    directory = path.parent
    try:
        if os.statvfs(directory).f_flag & os.ST_RDONLY:
            return f"{directory} is on a read-only file system"
    except OSError as error:
        return f"{directory} cannot be examined ({error.strerror or error})"
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"{directory} is not writable by this user (SQLite needs to create its journal there)"
    if path.exists() and not os.access(path, os.R_OK | os.W_OK):
        return f"{path.name} is not readable and writable by this user"
    return None


def refusal(path: Path) -> str | None:
    """Why the cache at `path` must not be used (what, whose, what to do), or None."""
    if reason := directory_distrust_reason(path.parent):
        return reason
    if reason := path_distrust_reason(path):
        return f"{path.name} ({_whose(path)}) is {reason}"
    for suffix in SIDE_FILES:
        side = Path(f"{path}{suffix}")
        if reason := path_distrust_reason(side):
            return (
                f"{side.name} ({_whose(side)}; SQLite's {suffix.strip('-')} file, which it would replay into the"
                f" database) is {reason}; you did not write it like this: remove it if you did not expect it"
            )
    return read_only_reason(path)


def _whose(path: Path) -> str:
    """Owner and mode of a file, for the one line that refuses it."""
    try:
        info = os.lstat(path)
    except OSError:
        return "cannot be examined"
    try:
        import pwd

        owner = f"{pwd.getpwuid(info.st_uid).pw_name}, uid {info.st_uid}"
    except (ImportError, KeyError):
        owner = f"uid {info.st_uid}"
    return f"owner {owner}, mode {stat.S_IMODE(info.st_mode):04o}"


@dataclass
class ResultsCache:
    """One SQLite file; each call opens its own connection so several processes can share it.

    `untrusted` (set at open, or when SQLite fails later) says why the cache is not used; it then reads nothing
    and writes nothing, so the tuning measures instead of acting on numbers it cannot vouch for.
    """

    path: Path
    untrusted: str | None = None
    key: bytes = field(default=b"", repr=False)

    def __post_init__(self) -> None:
        try:
            make_dirs(self.path.parent)
        except OSError as error:
            self._stop_using(f"cannot create {self.path.parent} ({error.strerror or error})")
            return
        reason = refusal(self.path)
        if reason is None:
            try:
                self.key = signing_key(self.path.parent)
            except KeyRefused as error:
                reason = str(error)
        if reason:
            self._stop_using(reason)
            return
        created = not self.path.exists()
        self._guard(self._open_checked, None)
        if created and not self.untrusted:
            share_file(self.path)

    def _stop_using(self, reason: str) -> None:
        """From now on neither read nor write; one line says why (what, whose, what to do)."""
        if self.untrusted:
            return
        self.untrusted = reason
        log.warning("autotune: not using results cache %s: %s; tuning without it (every candidate measured again)",
                    self.path, reason)  # fmt: skip

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=60)

    def _open_checked(self) -> None:
        with closing(self._connect()) as db, db:
            db.executescript(SCHEMA)
            verdict = db.execute("PRAGMA quick_check").fetchone()
        if not verdict or verdict[0] != "ok":
            raise sqlite3.DatabaseError(f"database disk image is malformed (quick_check: {verdict})")

    def _guard(self, operation: Callable[[], T], default: T) -> T:
        """Run a database operation. A corrupt file is moved aside and rebuilt; any other failure (disk I/O,
        read-only, locked, a journal planted after we looked) stops the cache for this run. `default` then."""
        if self.untrusted:
            return default
        try:
            return operation()
        except sqlite3.DatabaseError as error:
            if not is_corruption(error):
                self._stop_using(f"SQLite: {error}")
                return default
            corrupt = error
        except OSError as error:
            self._stop_using(f"{error.strerror or error}")
            return default
        try:
            self._move_aside(corrupt)
            with closing(self._connect()) as db, db:
                db.executescript(SCHEMA)
        except (sqlite3.DatabaseError, OSError) as error:
            self._stop_using(f"could not rebuild it ({error})")
            return default
        share_file(self.path)
        return default

    def _move_aside(self, error: sqlite3.DatabaseError) -> None:
        """Under a lock, so that of several processes finding the same damage one moves it and the rest
        see the rebuilt file (checked again before moving)."""
        lock = filelock.FileLock(f"{self.path}.repair.lock", mode=file_mode_for(self.path.parent), thread_local=False)
        with lock:
            try:
                self._open_checked()
                return  # another process already rebuilt it
            except sqlite3.DatabaseError as again:
                if not is_corruption(again):
                    raise
            aside = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
            for suffix in ("", *SIDE_FILES):
                source = Path(f"{self.path}{suffix}")
                if source.exists():
                    os.replace(source, f"{aside}{suffix}")
        log.warning(
            "autotune: results cache %s is corrupt (%s); moved it to %s and started an empty one",
            self.path, error, aside,
        )  # fmt: skip

    def trial_row(self, key: str, candidate: str, payload: str) -> tuple[str, str, str, str, float]:
        """The signed row of `signed_trials` for these texts (as stored; tests plant rows with it)."""
        return key, candidate, payload, sign(self.key, "trial", key, candidate, payload), time.time()

    def recommendation_row(self, key: str, payload: str) -> tuple[str, str, str, float]:
        return key, payload, sign(self.key, "recommendation", key, payload), time.time()

    def trials(self, key: str) -> dict[Candidate, TrialResult]:
        def read() -> list[tuple[str, str, str]]:
            with closing(self._connect()) as db:
                query = "SELECT candidate, payload, mac FROM signed_trials WHERE run_key = ?"
                return db.execute(query, (key,)).fetchall()

        found: dict[Candidate, TrialResult] = {}
        rows: list[tuple[str, str, str]] = self._guard(read, [])
        for candidate, payload, mac in rows:
            if not (isinstance(candidate, str) and isinstance(payload, str)) or not verify(
                self.key, mac, "trial", key, candidate, payload
            ):
                log.warning(
                    "autotune: dropped a cached trial whose signature does not verify (written or edited by someone"
                    " else, or by another key); it will be measured again"
                )
                continue
            try:
                found[parse_candidate(candidate)] = parse_trial(payload)
            except (ValueError, KeyError, TypeError, AttributeError) as error:
                log.warning("autotune: skipped a malformed cached trial (%s); it will be measured again", error)
        return found

    def put_trial(self, key: str, candidate: Candidate, result: TrialResult) -> None:
        row = self.trial_row(key, json.dumps(candidate.to_dict(), sort_keys=True), json.dumps(result.to_dict()))

        def write() -> None:
            with closing(self._connect()) as db, db:
                db.execute("INSERT OR REPLACE INTO signed_trials VALUES (?, ?, ?, ?, ?)", row)

        self._guard(write, None)

    def forget_trial(self, key: str, candidate: Candidate) -> None:
        """Delete one stored trial (one the tuner found implausible), so the next run does not meet it again."""
        text = json.dumps(candidate.to_dict(), sort_keys=True)

        def delete() -> None:
            with closing(self._connect()) as db, db:
                db.execute("DELETE FROM signed_trials WHERE run_key = ? AND candidate = ?", (key, text))

        self._guard(delete, None)

    def recommendation(self, key: str) -> StoredAnswer | None:
        """The stored final answer, or None when absent, unsigned or malformed (such a row is deleted)."""

        def read() -> tuple[str, str] | None:
            with closing(self._connect()) as db:
                query = "SELECT payload, mac FROM signed_recommendations WHERE run_key = ?"
                return db.execute(query, (key,)).fetchone()

        row = self._guard(read, None)
        if row is None:
            return None
        payload, mac = row
        try:
            if not isinstance(payload, str) or not verify(self.key, mac, "recommendation", key, payload):
                raise MalformedRecord("its signature does not verify (written or edited by someone else)")
            return parse_recommendation(payload)
        except (MalformedReportError, ValueError, KeyError, TypeError, AttributeError) as error:
            log.warning("autotune: dropped a cached recommendation (%s); tuning again", error)
            self._guard(lambda: self._delete_recommendation(key), None)
            return None

    def put_recommendation(self, key: str, answer: StoredAnswer) -> None:
        row = self.recommendation_row(key, json.dumps(answer.to_json()))

        def write() -> None:
            with closing(self._connect()) as db, db:
                db.execute("INSERT OR REPLACE INTO signed_recommendations VALUES (?, ?, ?, ?)", row)

        self._guard(write, None)

    def _delete_recommendation(self, key: str) -> None:
        with closing(self._connect()) as db, db:
            db.execute("DELETE FROM signed_recommendations WHERE run_key = ?", (key,))

    def forget(self, key: str) -> None:
        def delete() -> None:
            with closing(self._connect()) as db, db:
                db.execute("DELETE FROM signed_recommendations WHERE run_key = ?", (key,))
                db.execute("DELETE FROM signed_trials WHERE run_key = ?", (key,))

        self._guard(delete, None)

"""Results cache: SQLite, JSON payloads, no pickle.

A run key ties a cached answer to everything that decides it: model fingerprint, hardware
fingerprint, library versions, sequence length, world size, global batch, precision and headroom.
Trials are stored as they finish, so an interrupted run resumes from them; the final
recommendation is stored last, so a repeat run answers without trials.

What is read back is not taken on faith (sharing.py has the trust model):
- a database file not owned by this user or the directory's shared group is neither read nor written;
- every row is parsed through a typed schema (pydantic, strict): a malformed or implausible row is
  skipped with a warning and its candidate measured again, never a crash, never trusted;
- a truncated or garbage database is moved aside (`results.sqlite.corrupt-<time>`) with a warning and
  rebuilt empty, so one bad file costs re-measurement, not every later run.
A recommendation's config is re-validated by DeepSpeed at the world size before it is written (tuner.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import sqlite3
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

import filelock
from pydantic import TypeAdapter, ValidationError

from autotune.ladder import Candidate
from autotune.sharing import file_mode_for, make_dirs, path_distrust_reason, share_file
from autotune.trial.types import TrialResult

log = logging.getLogger(__name__)
T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS trials (
    run_key TEXT NOT NULL, candidate TEXT NOT NULL, payload TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (run_key, candidate));
CREATE TABLE IF NOT EXISTS recommendations (
    run_key TEXT PRIMARY KEY, payload TEXT NOT NULL, checksum TEXT NOT NULL, created REAL NOT NULL);
"""


def library_versions() -> dict[str, str]:
    versions = {}
    for name in ("autotune", "torch", "deepspeed", "transformers"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "unknown"
    return versions


def run_key(parts: dict[str, Any]) -> str:
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def payload_checksum(payload: str) -> str:
    return hashlib.sha256(payload.encode()).hexdigest()


_TRIAL_SCHEMA = TypeAdapter(TrialResult)
_CORRUPTION_CODES = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}


class MalformedRecord(ValueError):
    """A cached row that does not parse as what we wrote, or holds values no trial could have produced."""


# A stored mode (issue 19) must have exactly Mode's fields with their types; a classic candidate stores none.
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


def parse_recommendation(text: str) -> dict:
    """{"candidate", "ds_config", "report"} with the candidate strictly typed and the others JSON objects."""
    data = json.loads(text)
    if not isinstance(data, dict) or not {"candidate", "ds_config", "report"} <= set(data):
        raise MalformedRecord("recommendation lacks candidate, ds_config or report")
    parse_candidate(json.dumps(data["candidate"]))
    if not isinstance(data["ds_config"], dict) or not isinstance(data["report"], dict):
        raise MalformedRecord("recommendation ds_config or report is not an object")
    return data


def _first(error: ValidationError) -> str:
    detail = error.errors()[0]
    return f"{'.'.join(str(part) for part in detail['loc'])}: {detail['msg']}"


def is_corruption(error: sqlite3.DatabaseError) -> bool:
    """SQLite's own verdict that the file is not (or no longer) a database, as opposed to locked/read-only."""
    code = getattr(error, "sqlite_errorcode", None)
    return code in _CORRUPTION_CODES or "malformed" in str(error) or "not a database" in str(error)


@dataclass
class ResultsCache:
    """One SQLite file; each call opens its own connection so several processes can share it.

    `untrusted` (set at open) says why the file is not believed; the cache then reads nothing and
    writes nothing, so the tuning re-measures instead of acting on someone else's numbers.
    """

    path: Path
    untrusted: str | None = None

    def __post_init__(self) -> None:
        make_dirs(self.path.parent)
        self.untrusted = path_distrust_reason(self.path)
        if self.untrusted:
            log.warning(
                "autotune: not using results cache %s: %s; every candidate is measured again", self.path, self.untrusted
            )
            return
        created = not self.path.exists()
        self._guard(self._open_checked, None)
        if created:
            share_file(self.path)

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=60)

    def _open_checked(self) -> None:
        with closing(self._connect()) as db, db:
            db.executescript(SCHEMA)
            verdict = db.execute("PRAGMA quick_check").fetchone()
        if not verdict or verdict[0] != "ok":
            raise sqlite3.DatabaseError(f"database disk image is malformed (quick_check: {verdict})")

    def _guard(self, operation: Callable[[], T], default: T) -> T:
        """Run a database operation; a corrupt file is moved aside, rebuilt, and `default` returned."""
        if self.untrusted:
            return default
        try:
            return operation()
        except sqlite3.DatabaseError as error:
            if not is_corruption(error):
                raise
            self._move_aside(error)
        with closing(self._connect()) as db, db:
            db.executescript(SCHEMA)
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
            for suffix in ("", "-journal", "-wal", "-shm"):
                source = Path(f"{self.path}{suffix}")
                if source.exists():
                    os.replace(source, f"{aside}{suffix}")
        log.warning(
            "autotune: results cache %s is corrupt (%s); moved it to %s and started an empty one",
            self.path, error, aside,
        )  # fmt: skip

    def trials(self, key: str) -> dict[Candidate, TrialResult]:
        def read() -> list[tuple[str, str]]:
            with closing(self._connect()) as db:
                return db.execute("SELECT candidate, payload FROM trials WHERE run_key = ?", (key,)).fetchall()

        found: dict[Candidate, TrialResult] = {}
        for candidate, payload in self._guard(read, []):
            try:
                found[parse_candidate(candidate)] = parse_trial(payload)
            except (ValueError, KeyError, TypeError, AttributeError) as error:
                log.warning("autotune: skipped a malformed cached trial (%s); it will be measured again", error)
        return found

    def put_trial(self, key: str, candidate: Candidate, result: TrialResult) -> None:
        row = (key, json.dumps(candidate.to_dict(), sort_keys=True), json.dumps(result.to_dict()), time.time())

        def write() -> None:
            with closing(self._connect()) as db, db:
                db.execute("INSERT OR REPLACE INTO trials VALUES (?, ?, ?, ?)", row)

        self._guard(write, None)

    def recommendation(self, key: str) -> dict | None:
        """The stored final answer, or None when absent or malformed (a malformed one is deleted)."""

        def read() -> tuple[str, str] | None:
            with closing(self._connect()) as db:
                return db.execute("SELECT payload, checksum FROM recommendations WHERE run_key = ?", (key,)).fetchone()

        row = self._guard(read, None)
        if row is None:
            return None
        payload, checksum = row
        try:
            if not isinstance(payload, str) or payload_checksum(payload) != checksum:
                raise MalformedRecord("checksum mismatch")
            return parse_recommendation(payload)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            log.warning("autotune: dropped a malformed cached recommendation (%s); tuning again", error)
            self._guard(lambda: self._delete_recommendation(key), None)
            return None

    def put_recommendation(self, key: str, data: dict) -> None:
        payload = json.dumps(data)

        def write() -> None:
            with closing(self._connect()) as db, db:
                db.execute(
                    "INSERT OR REPLACE INTO recommendations VALUES (?, ?, ?, ?)",
                    (key, payload, payload_checksum(payload), time.time()),
                )

        self._guard(write, None)

    def _delete_recommendation(self, key: str) -> None:
        with closing(self._connect()) as db, db:
            db.execute("DELETE FROM recommendations WHERE run_key = ?", (key,))

    def forget(self, key: str) -> None:
        def delete() -> None:
            with closing(self._connect()) as db, db:
                db.execute("DELETE FROM recommendations WHERE run_key = ?", (key,))
                db.execute("DELETE FROM trials WHERE run_key = ?", (key,))

        self._guard(delete, None)

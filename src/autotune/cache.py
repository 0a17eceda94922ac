"""Results cache: SQLite, JSON payloads, no pickle.

A run key ties a cached answer to everything that decides it: model fingerprint, hardware
fingerprint, library versions, sequence length, world size, global batch, precision and headroom.
Trials are stored as they finish, so an interrupted run resumes from them; the final
recommendation is stored last, so a repeat run answers without trials.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from contextlib import closing
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from autotune.ladder import Candidate
from autotune.trial.types import TrialResult

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


def _checksum(payload: str) -> str:
    return hashlib.sha256(payload.encode()).hexdigest()


@dataclass
class ResultsCache:
    """One SQLite file; each call opens its own connection so several processes can share it."""

    path: Path

    def __post_init__(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with closing(self._connect()) as db, db:
            db.executescript(SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=60)

    def trials(self, key: str) -> dict[Candidate, TrialResult]:
        with closing(self._connect()) as db:
            rows = db.execute("SELECT candidate, payload FROM trials WHERE run_key = ?", (key,)).fetchall()
        found: dict[Candidate, TrialResult] = {}
        for candidate, payload in rows:
            try:
                found[Candidate.from_dict(json.loads(candidate))] = TrialResult.from_dict(json.loads(payload))
            except (ValueError, KeyError, TypeError):
                continue  # an unreadable row is re-measured, never trusted
        return found

    def put_trial(self, key: str, candidate: Candidate, result: TrialResult) -> None:
        row = (key, json.dumps(candidate.to_dict(), sort_keys=True), json.dumps(result.to_dict()), time.time())
        with closing(self._connect()) as db, db:
            db.execute("INSERT OR REPLACE INTO trials VALUES (?, ?, ?, ?)", row)

    def recommendation(self, key: str) -> dict | None:
        """The stored final answer, or None when absent or corrupt (a corrupt one is deleted)."""
        with closing(self._connect()) as db:
            row = db.execute("SELECT payload, checksum FROM recommendations WHERE run_key = ?", (key,)).fetchone()
        if row is None:
            return None
        payload, checksum = row
        try:
            if _checksum(payload) != checksum:
                raise ValueError("checksum mismatch")
            data = json.loads(payload)
            if not isinstance(data, dict):
                raise ValueError("not an object")
            return data
        except ValueError:
            self.forget(key)
            return None

    def put_recommendation(self, key: str, data: dict) -> None:
        payload = json.dumps(data)
        with closing(self._connect()) as db, db:
            db.execute(
                "INSERT OR REPLACE INTO recommendations VALUES (?, ?, ?, ?)",
                (key, payload, _checksum(payload), time.time()),
            )

    def forget(self, key: str) -> None:
        with closing(self._connect()) as db, db:
            db.execute("DELETE FROM recommendations WHERE run_key = ?", (key,))
            db.execute("DELETE FROM trials WHERE run_key = ?", (key,))

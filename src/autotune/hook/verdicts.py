"""DeepSpeed's verdicts on configs read from the shared directory, remembered by this user.

Every config the hook reads back is checked by DeepSpeed's own parser at the job's world size before it is
written (run.py, `config_vetter`): a record is only as trustworthy as the directory it lies in. Importing
DeepSpeed for that costs 3-6 s per rank (`import deepspeed` alone took 3.2 s on the 2-core machine), which
made every cache hit slow. A config this user's processes already validated (or tuned: tune() validates
what it writes) at this world size with this DeepSpeed version needs no second look, so the verdict is
remembered in a file of this user's own cache directory, never in the shared one, and believed only when
this user owns it and nobody else can write it.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

from autotune.core.versions import library_versions
from autotune.infra.atomic import atomic_write_json
from autotune.infra.paths import cache_dir

VERDICTS_FILE = "validated-configs.json"
MAX_REMEMBERED = 256  # the newest; a job shape is a handful of keys


def default_verdicts_path() -> Path:
    return cache_dir() / VERDICTS_FILE


def verdict_key(config_text: str, world_size: int) -> str:
    """The config's bytes, the world size and the DeepSpeed version that judged them (its parser changes)."""
    version = library_versions()["deepspeed"]
    return hashlib.sha256(f"{version}\0{world_size}\0{config_text}".encode()).hexdigest()


class KnownValid:
    """The set of verdict keys DeepSpeed accepted, kept in `path`; a file that fails the check reads as empty."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def _read(self) -> list[str]:
        if self.path is None:
            return []
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return []
        with os.fdopen(fd, encoding="utf-8", errors="replace") as handle:
            info = os.fstat(handle.fileno())
            if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                return []
            try:
                keys = json.load(handle)
            except ValueError:
                return []
        return [k for k in keys if isinstance(k, str)] if isinstance(keys, list) else []

    def __contains__(self, key: str) -> bool:
        return key in self._read()

    def add(self, key: str) -> None:
        """Remember one more; a cache directory that cannot be written only costs the next hit its speed."""
        if self.path is None:
            return
        keys = [k for k in self._read() if k != key] + [key]
        try:
            written = atomic_write_json(self.path, keys[-MAX_REMEMBERED:])
            os.chmod(written, 0o644)  # never group-writable, or the next read would not believe it
        except OSError:
            return

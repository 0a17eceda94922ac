"""Atomic file writes: a reader never sees a half-written config or report."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from autotune.sharing import file_mode_for, make_dirs


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write to a temp file in the target directory, fsync, then rename over the target.

    Mode 0644, or 0664 inside a shared-group (setgid) directory so the group can replace it (sharing.py).
    """
    target = Path(path)
    make_dirs(target.parent)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, file_mode_for(target.parent))
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return target


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """`atomic_write_bytes` of the UTF-8 text."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], data: Any) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")

"""Atomic file writes: a reader never sees a half-written config or report.

The writer never replaces anything but a regular file: `os.replace` over a device node, a FIFO or a socket
would swap the node for our file (as root, `--out /dev/full` turned /dev/full into a 423-byte config).
A write that fails (disk full, quota) removes its temp file and raises `WriteFailed`, an OSError that is also
a UserError, so callers that handle OSError still do and the CLI says one line instead of a traceback.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from autotune.errors import UserError
from autotune.infra.sharing import file_mode_for, make_dirs


class WriteFailed(UserError, OSError):
    """A file could not be written; nothing was left half-written. str() is the one line the user sees."""

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}"


def refuse_non_regular(target: Path) -> None:
    """Raise WriteFailed when `target` exists as anything but a regular file (a symlink included: callers
    resolve the links they mean to write through, infra/output_paths.py)."""
    try:
        mode = os.lstat(target).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        from autotune.infra.output_paths import file_kind

        raise WriteFailed(0, f"it is {file_kind(mode)}, not a regular file, and is never replaced", str(target))


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write to a temp file in the target directory, fsync, then rename over the target.

    Mode 0644, or 0664 inside a shared-group (setgid) directory so the group can replace it (infra/sharing.py).
    """
    target = Path(path)
    refuse_non_regular(target)
    try:
        make_dirs(target.parent)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as error:
        raise WriteFailed(error.errno, error.strerror or str(error), str(target)) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, file_mode_for(target.parent))
        refuse_non_regular(target)  # planted while we wrote
        os.replace(tmp_name, target)
    except OSError as error:
        Path(tmp_name).unlink(missing_ok=True)
        if isinstance(error, WriteFailed):
            raise
        raise WriteFailed(error.errno, error.strerror or str(error), str(target)) from None
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return target


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """`atomic_write_bytes` of the UTF-8 text."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], data: Any) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")

"""Who may write a shared cache directory, and which files in it we believe.

Trust model (docs/shared-caches.md says the same for users):

- A file is trusted when this user (effective uid) owns it, or when it belongs to the *shared group*
  of its directory: the directory has the setgid bit, is not writable by others, and the file's group
  is the directory's group. Only members of that group can create files there, and the kernel gives
  every new file the directory's group, so "the directory's group" is the configured group: an admin
  shares a cache with `chgrp GROUP DIR && chmod 2770 DIR` (or 2775), nothing else.
- A file writable by everyone is never trusted; a group-writable file only when its group is the
  shared group (else members of some other group could have rewritten it).
- Anything else (another user's file in a world-writable directory, uid 65534's planted record) is
  not believed: a published hook result is ignored and re-tuned, a results database is neither read
  nor written, each with a warning that says why and what to do.
- A trusted file is still parsed through a typed schema and its config re-validated by DeepSpeed at
  the job's world size before it is written; trust decides whose measurements we believe, not
  whether the bytes are well formed.

Group sharing works without world-writable directories: inside a setgid directory every file and
directory autotune creates is group-writable (0o664 / 0o2775), so the next member of the group can
take the lock, replace a published result and write the SQLite database and its journal.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

FILE_MODE = 0o644
GROUP_FILE_MODE = 0o664
GROUP_DIR_MODE = 0o2775


def group_shared(directory: Path) -> bool:
    """A setgid directory that others cannot write: its group is the one we share results with."""
    try:
        mode = os.stat(directory).st_mode
    except OSError:
        return False
    return bool(mode & stat.S_ISGID) and not mode & stat.S_IWOTH


def file_mode_for(directory: Path) -> int:
    """Mode for a file autotune creates in `directory`: group-writable inside a shared-group directory."""
    return GROUP_FILE_MODE if group_shared(directory) else FILE_MODE


def make_dirs(path: Path) -> Path:
    """mkdir -p; directories created inside a shared-group directory stay group-writable (umask aside)."""
    missing = []
    current = Path(path)
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    path.mkdir(parents=True, exist_ok=True)
    for created in reversed(missing):
        if group_shared(created.parent):
            with contextlib.suppress(OSError):  # someone else created it first; their mode stands
                os.chmod(created, GROUP_DIR_MODE)
    return path


def share_file(path: Path) -> None:
    """Give a file we just created the mode its directory calls for (SQLite creates with the umask)."""
    with contextlib.suppress(OSError):
        if os.stat(path).st_uid == os.geteuid():
            os.chmod(path, file_mode_for(path.parent))


def distrust_reason(file_stat: os.stat_result, directory: Path) -> str | None:
    """None when the file (already stat'ed, ideally through its open descriptor) is trusted, else why not."""
    try:
        dir_stat = os.stat(directory)
    except OSError as error:
        return f"its directory cannot be examined ({error.strerror or error})"
    if not stat.S_ISREG(file_stat.st_mode):
        return "not a regular file"
    if file_stat.st_mode & stat.S_IWOTH:
        return "writable by every user"
    shared_group = (
        bool(dir_stat.st_mode & stat.S_ISGID)
        and not dir_stat.st_mode & stat.S_IWOTH
        and file_stat.st_gid == dir_stat.st_gid
    )
    if file_stat.st_mode & stat.S_IWGRP and not shared_group and file_stat.st_uid == os.geteuid():
        return f"writable by group {file_stat.st_gid}, which is not the shared group of {directory}"
    if file_stat.st_uid == os.geteuid() or shared_group:
        return None
    return (
        f"owned by uid {file_stat.st_uid}, not by this user (uid {os.geteuid()}) nor by the shared group of"
        f" {directory} (share a cache through a setgid group directory: chgrp GROUP DIR && chmod 2770 DIR)"
    )


def path_distrust_reason(path: Path) -> str | None:
    """distrust_reason for a path, not following a symbolic link (a planted link is not trusted)."""
    try:
        file_stat = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as error:
        return f"cannot be examined ({error.strerror or error})"
    return distrust_reason(file_stat, path.parent)

"""Where autotune may write, decided before any work: a bad --out costs one line, not a tuning.

Found by a hostile-input session (as root, as ML containers run): `--out /dev/full` replaced the device node
with a regular file after a 35 s tuning, `--out` a symlink to /proc/self/fd/1 tuned and wrote nowhere useful,
`--cache-dir /proc/x` gave a traceback. So every output path (--out, --report-dir, --cache-dir, check --fix)
must be, or be creatable as, a regular file or a directory on a writable, ordinary filesystem:

- an existing target (through a symlink: its target) of another type (FIFO, socket, device) is refused;
- nothing is written under /proc, /sys or /dev (bar /dev/shm, an ordinary tmpfs), nor on a kernel pseudo
  filesystem mounted elsewhere, nor on a read-only mount (root passes `os.access` there, so statvfs decides);
- a symlink named as the output must point inside its own directory: a link that leads elsewhere (a planted
  `ds.json -> ~/.bashrc` in a shared directory, `-> /proc/self/fd/1`) is refused, and the user names the real
  path instead.

The atomic writer (infra/atomic.py) re-checks the type at write time, so a node planted after this check is still
never replaced.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from autotune.errors import UserError

# Kernel filesystems whose files are interfaces, not storage (Linux `/proc/filesystems` names).
PSEUDO_FILESYSTEMS = frozenset(
    {
        "proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs",
        "pstore", "bpf", "configfs", "fusectl", "mqueue", "binfmt_misc", "efivarfs", "rpc_pipefs", "nsfs",
        "autofs", "hugetlbfs",
    }
)  # fmt: skip
SYSTEM_TREES = ("/proc", "/sys", "/dev")
ORDINARY_UNDER_SYSTEM = ("/dev/shm",)  # POSIX shared memory: a plain tmpfs, where files are files


def file_kind(mode: int) -> str:
    """'a FIFO', 'a character device', ...: what a non-regular file is, for the refusal line."""
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symlink"),
    )
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _under(path: str, tree: str) -> bool:
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def _mount_type(real: str) -> str | None:
    """The filesystem type of the mount holding `real` (longest mount point that contains it)."""
    import psutil

    try:
        mounts = psutil.disk_partitions(all=True)
    except (OSError, RuntimeError):
        return None
    holding = [m for m in mounts if _under(real, m.mountpoint)]
    return max(holding, key=lambda m: len(m.mountpoint)).fstype if holding else None


def _refuse_symlink_out(path: Path, flag: str) -> None:
    """A symlink named as an output must resolve inside the directory that holds it."""
    if not path.is_symlink():
        return
    home = os.path.realpath(path.parent)
    real = os.path.realpath(path)
    if not _under(real, home):
        link = os.readlink(path)
        leads = link if os.path.realpath(os.path.join(home, link)) == real == link else f"{link} (so {real})"
        raise UserError(f"{flag} {path} is a symlink to {leads}, outside {home}; name the file to write directly")


def _refuse_system_location(real: str, flag: str, given: Path) -> None:
    if any(_under(real, tree) for tree in ORDINARY_UNDER_SYSTEM):
        return
    tree = next((t for t in SYSTEM_TREES if _under(real, t)), None)
    fstype = _mount_type(real)
    if tree or fstype in PSEUDO_FILESYSTEMS:
        where = f"under {tree}" if tree else f"on a {fstype} filesystem"
        shown = given if str(given) == real else f"{given} ({real})"
        raise UserError(f"{flag} {shown} is {where}, which holds kernel interfaces, not files; write somewhere else")


def _usable_ancestor(real: Path, flag: str) -> None:
    """The nearest existing ancestor is a directory we can create entries in, on a writable mount."""
    for parent in (real, *real.parents):
        try:
            info = os.stat(parent)
        except FileNotFoundError:
            continue
        except OSError as error:
            raise UserError(f"{flag}: cannot examine {parent}: {error.strerror or error}") from None
        if not stat.S_ISDIR(info.st_mode):
            raise UserError(f"{flag}: {parent} is {file_kind(info.st_mode)}, not a directory")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise UserError(f"{flag}: cannot write under {parent} (permission denied)")
        if os.statvfs(parent).f_flag & os.ST_RDONLY:
            raise UserError(f"{flag}: {parent} is on a read-only filesystem")
        return


def _vet(text: str | os.PathLike[str], flag: str, want_dir: bool) -> Path:
    if "\0" in os.fspath(text):
        raise UserError(f"{flag} contains a NUL byte")
    given = Path(text)
    _refuse_symlink_out(given, flag)
    real = os.path.realpath(given)
    _refuse_system_location(real, flag, given)
    try:
        info = os.stat(real)
    except FileNotFoundError:
        info = None
    except OSError as error:
        raise UserError(f"{flag} {given}: {error.strerror or error}") from None
    if info is not None:
        if want_dir and not stat.S_ISDIR(info.st_mode):
            raise UserError(f"{flag} {given} is {file_kind(info.st_mode)}; it names a directory")
        if not want_dir and stat.S_ISDIR(info.st_mode):
            raise UserError(f"{flag} {given} is a directory; give a file path such as {given / 'ds_config.json'}")
        if not want_dir and not stat.S_ISREG(info.st_mode):
            raise UserError(f"{flag} {given} is {file_kind(info.st_mode)}, not a regular file; it is never replaced")
    _usable_ancestor(Path(real) if want_dir else Path(real).parent, flag)
    return given


def vet_output_file(path: str | os.PathLike[str], flag: str) -> Path:
    """`path` may be written as a regular file (see the module docstring), else UserError with one line."""
    return _vet(path, flag, want_dir=False)


def vet_output_dir(path: str | os.PathLike[str], flag: str) -> Path:
    """`path` is, or may be created as, a directory to write files in; else UserError with one line."""
    return _vet(path, flag, want_dir=True)
